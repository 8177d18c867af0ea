"""Memory per step and where it grows, on real PyTorch CPU jobs under `stallwatch run`: a loop that keeps each
step's activations in a list → MemoryGrowth fires live, the automatic capture (tracemalloc, 5 steps apart) names
the job's line; a loop whose memory plateaus after warm-up → silent. Each step records its RSS (`rss_kb`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.records import STEP
from stallwatch.torch.memory import StepMemory, cgroup_memory_limit
from stallwatch.torch.steps import StepTracker, now_us
from tests.collect._support import stallwatch as run_cli

LEAK = '''
import time, torch
torch.manual_seed(0)
model = torch.nn.Linear(64, 1024)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
kept = []
for i in range({steps}):
    x = torch.randn(32, 64)
    kept.append(out := model(x)){leak_note}
    loss = out.square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.004)
'''

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


def _run(tmp: Path, body: str, *flags: str) -> tuple[RunAnalysis, Path]:
    script = tmp / "job.py"
    script.write_text(body)
    run = tmp / "run"
    p = run_cli(tmp, "run", "--report", "off", "--out", str(run), *flags, "--", sys.executable, str(script),
                timeout=240, env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
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
    analysis, script = _run(tmp_path, LEAK.format(steps=2000, leak_note="  # the leak"), "--rules-interval", "1",
                            "--escalate-budget", "100", "--interval", "500ms", "--flush-interval", "1")
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
    stored = list((tmp_path / "run" / "traces").rglob("memory_sites.json"))
    assert stored and json.loads(stored[0].read_text())["sites"][0]["line"] == leak_line


def test_memory_that_plateaus_after_warm_up_is_silent(tmp_path: Path):
    analysis, _ = _run(tmp_path, PLATEAU.format(steps=700), "--rules-interval", "0")
    result = analysis.rule("MemoryGrowth")
    assert result.status == "ok" and result.datapoints >= 600 and not result.fired, result.details
    assert all(abs(g["rate_mb_per_1000"]) < 10 for g in result.details["series"].values()), result.details
