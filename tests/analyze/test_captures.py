"""An automatic capture asked for is not a capture stored: after a SIGKILL mid-capture the run says the capture
was lost, instead of listing it as captured."""

from __future__ import annotations

import signal
import sys
import time
from types import SimpleNamespace

import psutil

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.captures import LOST, PENDING, STORED, capture_fates
from stallwatch.analyze.judge.escalation import Escalation
from stallwatch.config import ProfilerConfig
from stallwatch.present.report.sections import findings as findings_section
from stallwatch.store.location import RunLocation
from tests.collect._support import Background, wait_until

T = 1_800_000_000_000_000
ASKED = {"rule": "InputBound", "start_us": T, "end_us": T + 5_000_000, "layers": ["detailed", "dataloader"],
         "reason": "rule InputBound fired (1 times so far)"}


def test_a_capture_is_stored_only_when_a_window_of_its_layers_holds_its_time():
    inside = {"layer": "detailed", "start_us": T + 300_000, "path": "traces/n/0/w1"}
    before = {"layer": "detailed", "start_us": T - 60_000_000, "path": "traces/n/0/w0"}
    other = {"layer": "python", "start_us": T + 300_000, "path": "traces/n/0/w2"}
    (stored,) = capture_fates([ASKED], [before, inside, other], finished=True)
    assert stored.status == STORED and stored.windows == ["traces/n/0/w1"]
    assert [c.status for c in capture_fates([ASKED], [before, other], finished=True)] == [LOST]
    assert [c.status for c in capture_fates([ASKED], [before], finished=False)] == [PENDING]
    assert capture_fates([{"rule": "x", "start_us": "soon"}], [], finished=True) == []  # untrusted record: skipped


JOB = '''
import os, sys, time, torch
torch.set_num_threads(1)
m = torch.nn.Linear(32, 4); opt = torch.optim.SGD(m.parameters(), lr=0.01)
for i, xb in enumerate(torch.utils.data.DataLoader(torch.randn(100000, 32), batch_size=4)):
    opt.zero_grad(); m(xb).sum().backward(); opt.step()
    if i == 20:
        open(sys.argv[1], "w").close()
    time.sleep(0.05)  # 2.5 s into the capture is 50 steps: a detailed window also ends after 100, then stored
'''


def test_a_job_killed_mid_capture_leaves_the_capture_marked_lost(tmp_path):
    """A rule fires, asks for a 5 s capture; the job is killed (SIGKILL) 2.5 s into it. The report said the
    capture was taken; it lists it as lost, never stored, with a warning line."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run = tmp_path / "run"
    going = tmp_path / "going"
    bg = Background(tmp_path, "run", "--report", "off", "--out", str(run), "--node", "n", "--rules-interval", "0",
                    "--", sys.executable, str(script), str(going))
    try:
        wait_until(going.exists, 60, what="the job's step 20")
        now = time.time_ns() // 1000
        # as the live rules do when InputBound fires (started long enough ago for the capture's budget)
        esc = Escalation(ProfilerConfig(), RunLocation(str(run)), start_us=now - 1_000_000_000)
        esc.on_results([SimpleNamespace(name="InputBound", triggered=1, violations=3, details={})], now_us=now)
        assert esc.records, "no capture asked for"
        time.sleep(3.5)  # 1 s lead, then 2.5 s into the capture
        job = next(p for p in psutil.Process(bg.proc.pid).children() if str(script) in " ".join(p.cmdline()))
        job.send_signal(signal.SIGKILL)
        assert bg.wait(120) == 137, bg.stderr
    finally:
        bg.kill_all()
    analysis = RunAnalysis(str(run))
    (capture,) = analysis.captures
    assert capture.status == LOST and capture.windows == [], capture
    text = repr(findings_section.build(analysis))
    assert "lost: never stored" in text and "1 automatic capture was asked for and never stored" in text
