"""Memory per step and where it grows, on real PyTorch CPU jobs under `stallwatch run`: a loop that keeps each
step's activations in a list → MemoryGrowth fires live, the automatic capture (tracemalloc, 5 steps apart) names
the job's line; a loop whose memory plateaus after warm-up → silent. Each step records its RSS (`rss_kb`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import pyarrow.compute as pc

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.frames import Chunk
from stallwatch.analyze.rules.memory_growth import MemoryGrowth
from stallwatch.records import STEP
from stallwatch.torch.memory import StepMemory, cgroup_memory_limit
from stallwatch.torch.steps import StepTracker, now_us
from tests.collect._support import stallwatch as run_cli

LEAK = '''
import glob, sys, time, torch
torch.manual_seed(0)
stop_at = None
model = torch.nn.Linear(64, 1024)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
kept = []
for i in range({steps}):
    x = torch.randn(32, 64)
    kept.append(out := model(x)){leak_note}
    loss = out.square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.004){stop}
'''

# LEAK's {stop}: the job ends 20 steps after its capture's sites are in the run (argv[1]) — all the test waits for
STOP_AFTER_CAPTURE = '''
    if i % 10 == 0 and stop_at is None and glob.glob(sys.argv[1] + "/traces/**/memory_sites.json", recursive=True):
        stop_at = i + 20
    if i == stop_at:
        break'''

PLATEAU = '''
import time, torch
torch.manual_seed(0)
model = torch.nn.Linear(64, 1024)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
cache = {{}}
for i in range({steps}):
    x = torch.randn(32, 64)
    out = model(x)
    if i < 100:  # warm-up fills a cache of 100 entries (12 MB), then it stays
        cache[i] = out.detach().clone()
    loss = out.square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.002)
'''


# Under an address-space limit 600 MB above what it has at the start, a loop that keeps 1 MB of activations a step
# dies of an allocation failure after about 600 steps.
DIES = '''
import os, resource, torch
size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (size + 600 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
torch.manual_seed(0)
model = torch.nn.Linear(64, 4096)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
kept = []
for i in range(100_000):
    kept.append(out := model(torch.randn(64, 64)))
    loss = out.square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
'''


def _run(tmp: Path, body: str, *flags: str, code: int = 0) -> tuple[RunAnalysis, Path]:
    script = tmp / "job.py"
    script.write_text(body)
    run = tmp / "run"
    p = run_cli(tmp, "run", "--report", "off", "--out", str(run), *flags, "--", sys.executable, str(script), str(run),
                timeout=240, env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == code, p.stderr
    return RunAnalysis(str(run)), script


def test_each_step_records_its_rss_and_a_forked_child_reads_its_own():
    events: list[tuple] = []
    tracker = StepTracker(events.append, 1)
    for _ in range(3):
        w = tracker.batch_begin(1, True)
        tracker.batch_end(1, w, False)
        t = now_us()
        tracker.forward(t, t, "Net", True)
        tracker.backward(t, t)
    tracker.finish()
    steps = [e for e in events if e[0] == STEP]
    assert len(steps) == 3
    for s in steps:
        rss = json.loads(s[7])["rss_kb"]
        assert 10_000 < rss < 100 * 2**20, s[7]  # this Python process: more than 10 MB, less than 100 GB
    mem = StepMemory()
    mine = int(mem.read(0).split(": ")[1])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, mem.read(0).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert int(os.read(r, 64).decode().split(": ")[1]) > 0 and mine > 0


def test_cgroup_memory_limit_reads_v1_and_v2_files(tmp_path: Path):
    (tmp_path / "proc/7").mkdir(parents=True)
    (tmp_path / "proc/7/cgroup").write_text("4:memory:/job/a\n0::/\n")
    (tmp_path / "cg/memory/job/a").mkdir(parents=True)
    (tmp_path / "cg/memory/job/a/memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cg/memory/job/memory.limit_in_bytes").write_text(f"{3 << 30}\n")
    assert cgroup_memory_limit(7, str(tmp_path / "cg"), str(tmp_path / "proc")) == 3 << 30
    (tmp_path / "proc/8").mkdir()
    (tmp_path / "proc/8/cgroup").write_text("0::/k/p\n")
    (tmp_path / "v2/k/p").mkdir(parents=True)
    (tmp_path / "v2/cgroup.controllers").write_text("memory\n")
    (tmp_path / "v2/k/p/memory.max").write_text("max\n")
    (tmp_path / "v2/k/memory.max").write_text(f"{5 << 30}\n")
    assert cgroup_memory_limit(8, str(tmp_path / "v2"), str(tmp_path / "proc")) == 5 << 30
    assert cgroup_memory_limit(9, str(tmp_path / "v2"), str(tmp_path / "proc")) is None


def test_a_loop_that_keeps_its_activations_is_named_by_its_line(tmp_path: Path):
    # at most 2,000 steps: the job ends once its capture is in the run (~900 steps in, quiet)
    body = LEAK.format(steps=2000, leak_note="  # the leak", stop=STOP_AFTER_CAPTURE)
    analysis, script = _run(tmp_path, body, "--rules-interval", "1", "--escalate-budget", "100", "--interval", "500ms",
                            "--flush-interval", "1")
    result = analysis.rule("MemoryGrowth")
    assert result.fired, result.details
    d = result.details
    g = d["series"][d["fired"][0]]
    # 32 x 1024 float32 outputs a step (128 KiB) and what each keeps of the graph: 125 MB or more per 1,000 steps
    assert 100 < g["rate_mb_per_1000"] < 400, g
    leak_line = LEAK.splitlines().index("    kept.append(out := model(x)){leak_note}") + 1  # the file begins with LEAK
    captures = [c for c in d["captures"] if c["sites"]]
    assert captures, (d["captures"], analysis.escalations)
    top = captures[0]["sites"][0]
    assert (top["file"], top["line"]) == (str(script), leak_line), captures[0]["sites"][:3]
    assert captures[0]["cost_ms"] > 0 and captures[0]["last_step"] - captures[0]["first_step"] == 4
    finding = next(f for f in analysis.findings.findings if f.rule == "MemoryGrowth")
    assert f"{script}:{leak_line}" in finding.title and finding.evidence["sites"][0]["traceback"]
    assert [w["layer"] for w in analysis.profiles("memory")] == ["memory"]  # a window the reader lists
    stored = list((tmp_path / "run" / "traces").rglob("memory_sites.json"))
    assert stored and json.loads(stored[0].read_text())["sites"][0]["line"] == leak_line


def test_memory_that_plateaus_after_warm_up_is_silent(tmp_path: Path):
    analysis, _ = _run(tmp_path, PLATEAU.format(steps=700), "--rules-interval", "0")
    result = analysis.rule("MemoryGrowth")
    assert result.status == "ok" and result.datapoints >= 600 and not result.fired, result.details
    assert all(abs(g["rate_mb_per_1000"]) < 10 for g in result.details["series"].values()), result.details


FLAT = PLATEAU.replace("if i < 100:", "if i < 0:")  # no warm-up cache either: flat from the start


def _capture_left_out(analysis: RunAnalysis, first: int) -> dict:
    (window,) = analysis.profiles("detailed")
    assert window["first_step"] == first, window
    (g,) = analysis.rule("MemoryGrowth").details["series"].values()
    assert g["captures"] == 1 and g["left_out"] >= 3, g  # the capture's windows of steps and the first after it
    return g


def test_a_profiling_capture_is_not_read_as_a_leak(tmp_path: Path):
    """A flat job with a torch.profiler capture of 100 steps late in its run: the memory the capture takes, and
    the allocator keeps, is no growth of the job's. Read without the capture's event, the same steps grow at a rate
    the rule fires on."""
    analysis, _ = _run(tmp_path, FLAT.format(steps=600), "--detailed-profiling", "350:100", "--rules-interval", "0")
    result = analysis.rule("MemoryGrowth")
    assert result.status == "ok" and not result.fired, result.details
    g = _capture_left_out(analysis, 350)
    assert abs(g["rate_mb_per_1000"]) < 10, g
    events = analysis.run.framework()
    unmarked = MemoryGrowth()
    unmarked.update(Chunk({}, events.filter(pc.not_equal(events["kind"], "profiling")), analysis.run.info, final=True))
    before = unmarked.result()  # what the rule read before captures were left out
    (g0,) = before.details["series"].values()
    # read as the job's, the capture's memory is growth at a rate the rule fires on (whether its size also passes
    # min_growth_mb depends on how much the profiler kept: 39 MB idle, 17 MB once under load)
    assert g0["rate_mb_per_1000"] >= before.parameters["min_rate_mb"] > abs(g["rate_mb_per_1000"]), (g0, g)


def test_a_leak_with_a_profiling_capture_still_fires_at_its_rate(tmp_path: Path):
    """The leak grows before, through and after the capture: it fires. For a while after the capture the leak's
    tensors reuse what the profiler freed and RSS stands still (≈ 250 steps here), so the rate reads lower than the
    leak's own (92 against ≈ 125 MB per 1,000 steps, measured): the run goes on long enough to outgrow it."""
    analysis, _ = _run(tmp_path, LEAK.format(steps=1000, leak_note="", stop=""), "--detailed-profiling", "300:100",
                       "--rules-interval", "0")
    result = analysis.rule("MemoryGrowth")
    assert result.fired, result.details
    g = _capture_left_out(analysis, 300)
    assert 50 < g["rate_mb_per_1000"] < 400, g  # 128 KiB of outputs a step and what they keep of the graph
    assert g["late_rate_mb_per_1000"] > 100, g  # past the stretch RSS stood still: the leak's own rate


def test_a_job_that_runs_out_of_address_space_is_said_to_have_run_out_of_memory(tmp_path: Path):
    analysis, _ = _run(tmp_path, DIES, "--rules-interval", "0", code=1)
    result = analysis.rule("MemoryGrowth")
    death = result.details["death"]
    assert death["kind"] == "host" and death["limit"] == "address space (RLIMIT_AS)", death
    assert "can't allocate memory" in death["error"]
    assert 500 < death["at_mb"] <= death["limit_mb"] and death["rate_mb_per_1000"] > 500, death
    verdict = analysis.findings.verdict
    assert verdict.startswith("The job ran out of memory (RuntimeError: can't allocate memory) at "), verdict
    assert " of address space of a " in verdict and " limit (RLIMIT_AS)" in verdict, verdict
    assert analysis.findings.findings[0].rule == "MemoryGrowth" and analysis.findings.findings[0].severity == "high"
    assert f"memory grew {death['rate_mb_per_1000']:,.0f} MB per 1,000 steps since step" in verdict, verdict


# Moves itself into the cgroup named by argv[1] (memory charged from then on), then keeps 512 KB a step.
KILLED = '''
import os, sys, torch
open(os.path.join(sys.argv[1], "cgroup.procs"), "w").write(str(os.getpid()))
torch.manual_seed(0)
model = torch.nn.Linear(64, 2048)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
kept = []
for i in range(100_000):
    kept.append(out := model(torch.randn(64, 64)))
    loss = out.square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
'''


def _memory_cgroup(limit: int) -> Path:
    """A cgroup with a memory limit (v2 memory.max, v1 memory.limit_in_bytes without swap); skips where it can't."""
    import uuid

    root = Path("/sys/fs/cgroup")
    name = f"stallwatch-test-{uuid.uuid4().hex[:8]}"
    v2 = (root / "cgroup.controllers").exists()
    group = root / name if v2 else root / "memory" / name
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup here ({exc}): needs root and a writable cgroup hierarchy")
    try:
        if v2:
            (group / "memory.max").write_text(str(limit))
            (group / "memory.swap.max").write_text("0") if (group / "memory.swap.max").exists() else None
        else:
            (group / "memory.limit_in_bytes").write_text(str(limit))
            if (group / "memory.memsw.limit_in_bytes").exists():
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
    except OSError as exc:
        group.rmdir()
        pytest.skip(f"cannot set a memory limit on {group} ({exc})")
    return group


def test_a_kill_by_the_oom_killer_is_said_so_with_the_growth_before_it(tmp_path: Path):
    group = _memory_cgroup(300 * 2**20)
    try:
        script = tmp_path / "job.py"
        script.write_text(KILLED)
        p = run_cli(tmp_path, "run", "--report", "off", "--out", str(tmp_path / "run"), "--rules-interval", "0",
                    "--", sys.executable, str(script), str(group), timeout=240, env={"OMP_NUM_THREADS": "1"})
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)
    assert p.returncode == 137, p.stderr
    analysis = RunAnalysis(str(tmp_path / "run"))
    death = analysis.rule("MemoryGrowth").details["death"]
    assert death["kind"] == "oom_killer" and death["limit_mb"] == 300 and 250 < death["at_mb"] <= 301, death
    verdict = analysis.findings.verdict
    assert verdict.startswith("The job was killed by the out-of-memory killer at "), verdict
    assert "of a 300 MB limit" in verdict and "memory grew " in verdict and "SIGKILL" not in verdict, verdict
