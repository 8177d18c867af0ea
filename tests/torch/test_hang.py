"""The Hang rule on real training (gloo on CPU, torchrun under `stallwatch run`): rank 1 stops before an all-reduce
that rank 0 waits in → followed live, a Hang finding names rank 1 within 60 s, with both ranks' Python stacks in
the run, and `Hang=stop_training` ends the hung job; a job whose steps are slow but keep coming gets none (the
rule's parameters scaled down: a floor of seconds against steps of 2.5 s, as the default 40 s floor and factor
10 stand against 30 s steps)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from stallwatch.analyze.analysis import RunAnalysis

from ..collect._support import Background
from ..collect._support import stallwatch as run_cli

JOB = Path(__file__).with_name("hang_job.py")


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]


def _hang(run: Path) -> dict | None:
    try:
        return json.loads((run / "rules" / "Hang.json").read_text())
    except (OSError, ValueError):
        return None


def test_a_rank_that_stops_before_the_all_reduce_is_named_with_every_stack(tmp_path: Path):
    run = tmp_path / "run"
    job = Background(tmp_path, "run", "--report", "off", "--out", str(run), "--rules-interval", "1",
                     "--flush-interval", "1", "--param", "Hang.floor_s=3", "--rule-action", "Hang=stop_training",
                     "--", *_torchrun(str(JOB), str(tmp_path), "1", "30", "1000", "0.02"))
    named_at = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and job.proc.poll() is None:
            r = _hang(run)
            if r is not None and r["Details"].get("behind"):
                named_at = time.time()
                break
            time.sleep(0.2)
        code = job.wait(120)  # ended by the rule's action
    finally:
        job.kill_all()
    onset = json.loads((tmp_path / "onset.json").read_text())["onset"]
    assert named_at is not None, job.stderr
    print(f"\nHang named the culprit {named_at - onset:.1f} s after the onset")
    assert named_at - onset < 60
    assert code != 0 and "the job is hung: ending it" in job.stderr
    r = _hang(run)
    assert r is not None and r["RuleTriggered"] >= 1
    d = r["Details"]
    node = next(iter(d["ranks"])).rpartition("/")[0]
    assert d["behind"] == [f"{node}/1"] and d["waiting_in"] == "all_reduce"
    assert sorted(d["stopped"]) == [f"{node}/0", f"{node}/1"]
    zero, one = d["ranks"][f"{node}/0"], d["ranks"][f"{node}/1"]
    assert (zero["phase"], zero["call"]) == ("collective", "all_reduce")
    assert one["phase"] == "loop_code" and "hang_job.py" in one["where"]
    assert one["last_step"] == 29  # it finished step 29 and stopped inside step 30
    # every process of both ranks answered: the stacks of all their threads are in the run
    for rank in (0, 1):
        dumps = sorted((run / "stacks" / node / str(rank)).glob("*.json"))
        assert dumps, f"no stacks of rank {rank}"
        threads = json.loads(dumps[0].read_text())["threads"]
        assert threads[0]["main"] and any("hang_job.py" in f["file"] for f in threads[0]["frames"])
    assert any("time.sleep(3600)" in line for line in one["main_stack"])
    found = [f for f in RunAnalysis(str(run)).findings.findings if f.rule == "Hang"]
    assert found and found[0].where.ranks == [f"{node}/0", f"{node}/1"] and "rank 1 never reached all_reduce" \
        in found[0].title


def test_slow_steps_that_keep_coming_are_no_hang(tmp_path: Path):
    """Steps of 2.5 s against a limit of max(4 s, 1 × the median step): followed every second, never a hang."""
    steps = 4  # 10 s of slow steps, each gap 1.5 s short of the limit: about ten live evaluations that must not fire
    run = tmp_path / "run"
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(run), "--rules-interval", "1",
                "--flush-interval", "1", "--param", "Hang.floor_s=4", "--param", "Hang.factor=1",
                "--", sys.executable, str(JOB), str(tmp_path), "-1", "0", str(steps), "2.5",
                env={"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533"},
                timeout=120)
    assert p.returncode == 0, p.stderr
    r = _hang(run)
    assert r is not None and r["Status"] == "ok" and r["RuleTriggered"] == 0, r
    assert r["Details"]["ranks"] and all(v["steps"] == steps for v in r["Details"]["ranks"].values())
    assert "rule Hang triggered" not in p.stderr


def test_stacks_asked_for_by_hand_from_a_running_job(tmp_path: Path):
    """`stallwatch config RUN --dump-stacks` while the job sleeps in its loop: every thread's stack is in the run."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    run = tmp_path / "run"
    job = Background(tmp_path, "run", "--report", "off", "--out", str(run), "--param", "Hang.floor_s=1000", "--",
                     sys.executable, str(JOB), str(tmp_path), "0", "2", "100", "0.01",
                     env={"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
    try:
        deadline = time.time() + 120
        while not (tmp_path / "onset.json").exists() and time.time() < deadline and job.proc.poll() is None:
            time.sleep(0.2)
        asked = run_cli(tmp_path, "config", str(run), "--dump-stacks")
        assert asked.returncode == 0 and b"dump_stacks: 0 -> 1" in asked.stdout, asked.stderr
        dumps: list[Path] = []
        while not dumps and time.time() < deadline:
            dumps = list((run / "stacks").glob("*/0/000001-*.json"))
            time.sleep(0.2)
    finally:
        job.kill_all()
    assert dumps, job.stderr
    main = json.loads(dumps[0].read_text())["threads"][0]
    assert main["main"] and "time.sleep(3600)" in main["frames"][-1]["code"]
