"""The Straggler rule on real DDP training (gloo on CPU, torchrun): one rank doing 30 ms of extra work per step
is named, though every rank's step time is the same (the others wait inside backward); equal ranks are
silent. The same across two nodes: two `stallwatch run` processes with distinct --node names and one run."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from tests.analyze.cgroup_limit import cpu_limited_group

from ..collect._support import Background
from ..collect._support import stallwatch as run_cli
from ._teardown import assert_ranks_finished

JOB = Path(__file__).with_name("straggler_job.py")
STEPS = 80


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _straggler(run: Path) -> dict:
    return _rule(run, "Straggler")


def _rule(run: Path, name: str) -> dict:
    return json.loads((run / "rules" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, slow in (("slow", 1), ("equal", -1)):
        tmp = tmp_path_factory.mktemp(name)
        run = tmp / "run"
        p = run_cli(tmp, "run", "--report", "off", "--out", str(run), "--rules-interval", "0", "--",
                    *_torchrun("--standalone", "--nproc_per_node", "2", str(JOB), str(tmp), str(slow), "0.03",
                               str(STEPS)), timeout=240)
        assert_ranks_finished(p.returncode, p.stderr, tmp)
        out[name] = run
    return out


def test_the_slow_rank_is_named(one_node):
    r = _straggler(one_node["slow"])
    (s,) = r["Details"]["stragglers"]
    assert (s["rank"], r["RuleTriggered"]) == (1, 1)
    assert 0.02 <= s["excess_s_per_step"] <= 0.045  # the planted 30 ms, give or take the machine's noise
    # DDP: the wait is the exposed all-reduce at the end of backward, timed on every step (torch/ddp_sync.py)
    assert r["Details"]["ranks"][f"{s['node']}/1"]["basis"] == "collectives"
    finding = RunAnalysis(str(one_node["slow"])).findings.findings
    assert any(f.rule == "Straggler" and f.where.ranks == [f"{s['node']}/1"] for f in finding)
    # rank 0 waits ~30 ms a step inside the all-reduce, for rank 1: not communication (CommunicationBound is silent)
    comm = _rule(one_node["slow"], "CommunicationBound")
    assert comm["Status"] == "ok" and comm["RuleTriggered"] == 0
    fast = comm["Details"]["ranks"][f"{s['node']}/0"]
    assert fast["exposed_s"] > 3 * fast["comm_s"]


def test_equal_ranks_are_silent(one_node):
    r = _straggler(one_node["equal"])
    assert r["Status"] == "ok" and r["RuleTriggered"] == 0 and r["Details"]["stragglers"] == []
    comm = _rule(one_node["equal"], "CommunicationBound")  # a compute-bound DDP job: its all-reduce is no finding
    assert comm["Status"] == "ok" and comm["RuleTriggered"] == 0


def _rank_1_limited(tmp: Path, slow: int, extra_s: float, steps: int = STEPS) -> Path:
    """The job with CPU work on every rank and rank 1 alone in a cgroup limited to a quarter of a core: its thread
    waits for the CPU (throttled) however busy the rest of the machine is."""
    with cpu_limited_group(25_000) as procs:
        run = tmp / "run"
        p = run_cli(tmp, "run", "--report", "off", "--out", str(run), "--rules-interval", "0", "--",
                    *_torchrun("--standalone", "--nproc_per_node", "2", str(JOB), str(tmp), str(slow), str(extra_s),
                               str(steps), "0", "cpu", str(procs)), timeout=240)
    assert_ranks_finished(p.returncode, p.stderr, tmp)
    return run


def _runq_ms_per_step(run: Path) -> dict[int, float]:
    steps = RunAnalysis(str(run)).run.framework(kinds=["step"]).to_pylist()
    out: dict[int, list[int]] = {}
    for e in steps:
        out.setdefault(e["rank"], []).append(json.loads(e["args"]).get("runq_us", 0))
    return {rank: sum(v) / len(v) / 1000 for rank, v in out.items()}


def test_a_rank_slowed_only_by_its_cpu_limit_is_no_straggler(tmp_path: Path):
    """Equal ranks, rank 1 under a CPU limit: its compute takes longer by the time it waited for the CPU, which is
    the machine's (CPUContention's finding), not the rank's: judged on its own time, no straggler."""
    run = _rank_1_limited(tmp_path, -1, 0.0)
    runq = _runq_ms_per_step(run)
    assert runq[1] > 10.0 and runq[1] > runq[0] + 5.0, runq  # rank 1 did wait for the CPU (what was planted)
    r = _straggler(run)
    assert r["Status"] == "ok" and r["RuleTriggered"] == 0, r["Details"]["ranks"]
    assert _rule(run, "CPUContention")["RuleTriggered"] >= 1


def test_a_rank_that_computes_more_under_a_cpu_limit_is_named(tmp_path: Path):
    """Rank 1 computes 30 ms more a step, under the same limit: the time it waited for the CPU is taken out, its
    own 30 ms stay. 40 steps (one window of the rule): at a quarter of a core each of rank 1's steps takes ~160 ms,
    and the mean excess over 40 of them already reads the planted 30 ms within the bounds (22-27 ms measured at 40
    and 80 steps)."""
    run = _rank_1_limited(tmp_path, 1, 0.03, steps=40)
    r = _straggler(run)
    (s,) = r["Details"]["stragglers"]
    assert (s["rank"], r["RuleTriggered"]) == (1, 1), r["Details"]["ranks"]
    assert 0.015 <= s["excess_s_per_step"] <= 0.06, s  # the planted 30 ms of CPU, give or take the machine's noise


def test_live_detection_after_onset(tmp_path: Path):
    """Equal ranks for 150 steps, then rank 1 lags 30 ms per step: followed every 2 s, the rule names it within
    two minutes of the onset (the issue's bound; docs/accuracy.md has the measured delay). Once it has, the job is
    told to stop (its remaining steps would show nothing more) and must still end as a finished job."""
    run = tmp_path / "run"
    job = Background(tmp_path, "run", "--report", "off", "--out", str(run), "--rules-interval", "2", "--",
                     *_torchrun("--standalone", "--nproc_per_node", "2", str(JOB), str(tmp_path), "1", "0.03", "600",
                                "150"), name="live")
    fired_at = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and job.proc.poll() is None:
            try:
                if json.loads((run / "rules" / "Straggler.json").read_text())["RuleTriggered"]:
                    fired_at = time.time()
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        (tmp_path / "stop").touch()  # seen: the job ends its loop a few steps on (straggler_job.py)
        assert_ranks_finished(job.wait(300), job.stderr, tmp_path)
    finally:
        job.kill_all()
    onset = json.loads((tmp_path / "onset.json").read_text())["onset"]
    assert fired_at is not None, "Straggler never fired while the job ran"
    print(f"\nStraggler live detection delay: {fired_at - onset:.1f} s")
    assert fired_at - onset < 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_loopback_name_the_slow_node(tmp_path: Path):
    run = tmp_path / "run"
    port = str(_free_port())
    procs = []
    for node_rank, node in enumerate(("node-a", "node-b")):
        procs.append(Background(tmp_path, "run", "--report", "off",
                                "--out", str(run), "--node", node, "--rules-interval", "0", "--",
                                *_torchrun("--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", "1",
                                           "--master-addr", "127.0.0.1", "--master-port", port, str(JOB),
                                           str(tmp_path), "1", "0.03", str(STEPS)),
                                env={"GLOO_SOCKET_IFNAME": "lo"}, name=node))
    try:
        for p in procs:
            assert_ranks_finished(p.wait(240), p.stderr, tmp_path)
    finally:
        for p in procs:
            p.kill_all()
    p = run_cli(tmp_path, "rules", str(run), "--rule", "Straggler", timeout=120)
    assert p.returncode == 0, p.stderr
    r = _straggler(run)
    (s,) = r["Details"]["stragglers"]
    assert (s["node"], s["rank"]) == ("node-b", 1)
    assert r["Details"]["straggling_nodes"] == ["node-b"]
