"""docs/guide.md is followed as a newcomer follows it: every command in its shell blocks runs, in order, in one
scratch folder, with the real example scripts and real PyTorch training, and what the guide says each one
shows is checked on what it printed. The idle-GPU section needs an NVIDIA GPU: its commands are parsed only."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.cli import build_parser
from tests.torch._teardown import TEARDOWN_ABORT

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
NEEDS_A_GPU = ("gpu_idle.py", "runs/gpu")  # the idle-GPU script and the commands that read its runs


def _needs_a_gpu(line: str) -> bool:
    return any(word in line for word in NEEDS_A_GPU)


def _sections() -> list[tuple[str, list[str]]]:
    """(section heading, its command lines) for every `bash` block of the guide, in order."""
    out: list[tuple[str, list[str]]] = []
    for part in re.split(r"^## ", GUIDE.read_text(), flags=re.M)[1:]:
        heading = part.splitlines()[0]
        lines = [line.strip() for block in re.findall(r"```bash\n(.*?)```", part, flags=re.S)
                 for line in block.splitlines() if line.strip()]
        out.append((heading, lines))
    return out


def _run(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line)
    if argv[0] == "stallwatch":
        argv = [sys.executable, "-m", "stallwatch", *argv[1:]]
    env = {**os.environ, "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


pytestmark = pytest.mark.timeout(900)  # real training runs, several per section, on a loaded 2-core CI machine


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    """Follows the guide section by section in one scratch folder; each section's commands run once, in order."""
    work = tmp_path_factory.mktemp("guide")
    (work / "examples").symlink_to(ROOT / "examples")
    done: dict[str, dict[str, subprocess.CompletedProcess[str]]] = {}

    def follow(word: str) -> dict[str, subprocess.CompletedProcess[str]]:
        (heading, lines), = [(h, ls) for h, ls in _sections() if word.lower() in h.lower()]
        if heading not in done:
            done[heading] = {line: _run(line, work) for line in lines
                             if not _needs_a_gpu(line) and "pip install" not in line}
            for line, proc in done[heading].items():
                # `--fail-on` exits 1 on what it fails on; a hung job ended by Hang=stop_training, with torchrun's 1
                expected = (0, 1) if "--fail-on" in line or "Hang=stop_training" in line else (0,)
                if "torch.distributed.run" in line and TEARDOWN_ABORT in proc.stderr:
                    expected = (0, 1)  # gloo's teardown abort after the last step: torch's (tests/torch/_teardown.py)
                assert proc.returncode in expected, f"`{line}` exited {proc.returncode}: {proc.stderr[-3000:]}"
        return done[heading]

    follow.cwd = work  # type: ignore[attr-defined]
    return follow


def _one(ran: dict, *words: str) -> subprocess.CompletedProcess[str]:
    (hit,) = [p for line, p in ran.items() if all(w in line for w in words)]
    return hit


def test_the_guide_has_a_worked_example_per_common_problem():
    headings = [h for h, _ in _sections()]
    for problem in ("Input-bound", "straggler", "slow start", "idle GPU"):
        assert any(problem.lower() in h.lower() for h in headings), problem
    for script in ("input_bound.py", "straggler.py", "slow_start.py", "gpu_idle.py"):
        assert (ROOT / "examples" / "problems" / script).is_file()
    for image in re.findall(r"\]\((img/[^)]+)\)", GUIDE.read_text()):
        assert (GUIDE.parent / image).is_file(), image


def test_the_gpu_commands_parse():
    gpu = [line for _, lines in _sections() for line in lines if _needs_a_gpu(line)]
    assert len(gpu) == 4
    for line in gpu:
        build_parser().parse_args(shlex.split(line)[1:])


def test_first_run_is_healthy_and_ends_with_its_report(guide):
    first = _one(guide("Install and profile"), "examples/train.py")
    assert "epoch 1/1" in first.stdout and "Healthy: no rule found a problem" in first.stderr
    report = re.search(r"stallwatch: report (\S+)", first.stderr)
    assert report and (guide.cwd / report.group(1)).is_file()


def test_input_bound_is_found_and_the_fix_makes_it_go_away(guide):
    ran = guide("Input-bound")
    slow = _one(ran, "input_bound.py", "runs/slow").stderr
    assert re.search(r"\[high\] Training waits for data \d+ % of the time on rank \S+/0", slow)
    assert "loaded in the training process itself (num_workers=0)" in slow
    fix_first = slow.split("What to fix first:")[1]
    assert fix_first.count("num_workers=") - fix_first.count("num_workers=0") <= 1  # one worker count, said once
    compare = _one(ran, "stallwatch compare runs/slow runs/fixed").stdout
    assert re.search(r"the median TRAIN step is [\d.]+ % faster", compare)
    before, after = map(float, re.search(r"waiting for data\s+([\d.]+)\s+([\d.]+)", compare).groups())
    assert after < before / 2  # on a quiet machine the finding goes away (18 % of step time); a loaded one waits more


def test_scripts_and_ci_commands(guide):
    guide("Input-bound")
    ran = guide("Scripts and CI")
    assert _one(ran, "--fail-on high").returncode == 1  # the input-bound run has a high finding
    assert "slow" in _one(ran, "stallwatch ls").stdout


def test_the_straggler_is_named(guide):
    ran = guide("straggler")
    uneven = _one(ran, "straggler.py", "--out runs/ddp --").stderr
    assert re.search(r"Rank \S+/1 is a straggler: \+\d+ ms per step", uneven)
    info = json.loads(_run("stallwatch info runs/ddp-balanced --json", guide.cwd).stdout)
    assert info["steps"] == {"TRAIN": 300} and sorted(s["rank"] for s in info["step_stats"]) == [0, 1]


def test_a_slow_start_is_found_when_asked_with_a_lower_threshold(guide):
    ran = guide("slow start")
    rules = _one(ran, "rules runs/start --param MaxInitializationTime.threshold=0.02")
    assert re.search(r"MaxInitializationTime: The first training step started [\d.]+ s after the job started",
                     rules.stdout + rules.stderr)
    assert (guide.cwd / "prepared.pt").is_file()  # the fix's cache, loaded by the last run
    assert "data ready after" in _one(ran, "runs/cached-again").stdout


def test_the_leak_is_named_by_its_line_and_the_fix_is_silent(guide):
    ran = guide("memory leak")
    assert _one(ran, "leak.py", "runs/leak --").returncode == 0
    leak = RunAnalysis(str(guide.cwd / "runs" / "leak"))
    result = leak.rule("MemoryGrowth")
    assert result.fired and result.details["series"][result.details["fired"][0]]["rate_mb_per_1000"] > 100
    title = next(f.title for f in leak.findings.findings if f.rule == "MemoryGrowth")
    assert title.endswith("allocated at " + str(guide.cwd / "examples" / "problems" / "leak.py") + ":31"), title
    assert "out = model(x)" == (ROOT / "examples/problems/leak.py").read_text().splitlines()[30].strip()
    fixed = RunAnalysis(str(guide.cwd / "runs" / "leak-fixed")).rule("MemoryGrowth")
    assert fixed.status == "ok" and not fixed.fired, fixed.details


def test_the_hung_rank_is_named_with_its_stacks_and_the_fix_is_silent(guide):
    ran = guide("hung rank")
    assert "the job is hung: ending it" in _one(ran, "hang.py", "runs/hang --").stderr
    hung = RunAnalysis(str(guide.cwd / "runs" / "hang"))
    d = hung.rule("Hang").details
    node = d["behind"][0].rpartition("/")[0]
    assert d["behind"] == [f"{node}/1"] and d["waiting_in"] == "backward's gradient all-reduce", d
    assert d["ranks"][f"{node}/1"]["where"].endswith("hang.py:25 in stuck_read")
    assert "threading.Event().wait()" == (ROOT / "examples/problems/hang.py").read_text().splitlines()[24].strip()
    assert sorted(p.name for p in (guide.cwd / "runs" / "hang" / "stacks" / node).iterdir()) == ["0", "1"]
    assert hung.summary.fate.state == "stopped" and hung.findings.findings[0].rule == "Hang"
    fixed = RunAnalysis(str(guide.cwd / "runs" / "hang-fixed")).rule("Hang")
    assert fixed.status == "ok" and not fixed.fired, fixed.details
