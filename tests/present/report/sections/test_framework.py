"""Section 3, Framework metrics summary, with its CPU operators and GPU operators subsections: the
OverallFrameworkMetrics rule's breakdowns on generated runs, and plain statements when there is nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.present.report.model import WARN, Chart, NotApplicable, Paragraph, Table, Verdict
from stallwatch.present.report.sections import framework
from stallwatch.store import layout
from stallwatch.store.location import RunLocation
from stallwatch.store.reader import open_run

from .._full_runs import OPERATORS, STEPS, full_run


def _build(root: Path, **kwargs):
    sections = framework.build(RunAnalysis(open_run(str(root)), **kwargs))
    assert [(s.id, s.title, s.level) for s in sections] == [
        ("framework", "Framework metrics summary", 2), ("cpu-operators", "CPU operators", 3),
        ("gpu-operators", "GPU operators", 3)]
    return sections


def _text(section) -> str:
    return "\n".join(getattr(b, "text", "") or getattr(b, "reason", "") for b in section.blocks)


def _wedges(chart: Chart) -> dict[str, float]:
    return {s.label: s.value for s in chart.model.slices}


def test_time_breakdowns_collectives_and_ranks(tmp_path: Path):
    main, cpu, gpu = _build(full_run(tmp_path / "run", nodes=("algo-1", "algo-2"), ranks=2).root)
    text = _text(main)
    calls = 2 * 2 * 2 * STEPS  # nodes x ranks x two training passes, one all-reduce a step
    assert f"took {calls * 0.006:,.1f} s in all ranks together, over {calls:,} calls" in text  # 6 ms each
    assert "backward pass" in text  # backward is 50 % of a training step, forward 30 %: backward leads
    phases = next(b for b in main.blocks if isinstance(b, Chart) and "TRAIN/EVAL" in b.caption)
    assert [f.title for f in phases.model.children] == ["The training loop's time: steps and between them"]
    # per mode, each part is a share of that mode's step time, and says so; no pie of the general events
    parts = next(b for b in main.blocks if isinstance(b, Chart) and "each mode's steps" in b.caption)
    assert [f.title for f in parts.model.children] == ["TRAIN steps' time", "EVAL steps' time"]
    assert "Of the 12,000 timed TRAIN steps' 1,291.5 s: backward 48 %, forward 29 %" in text
    assert "Of the 800 timed EVAL steps' 40.0 s: forward 72 %" in text
    assert not any(isinstance(b, Chart) and b.caption == "General framework events" for b in main.blocks)
    per_rank = next(b for b in main.blocks if isinstance(b, Table) and b.caption == "Per rank")
    assert [r[0] for r in per_rank.rows] == ["algo-1/0", "algo-1/1", "algo-2/0", "algo-2/1"]
    assert per_rank.columns[2:5] == ["TRAIN %", "EVAL %", "others %"]
    events = next(b for b in main.blocks if isinstance(b, Table) and b.caption.startswith("Framework events"))
    assert ["collectives", "all_reduce", calls] in [r[:3] for r in events.rows]  # the catalogue's label
    # both devices: the ratio pie, labelled right (SageMaker swapped the labels)
    cpu_us = sum(s for _, d, _, s, _ in OPERATORS if d == "cpu")
    gpu_us = sum(s for _, d, _, s, _ in OPERATORS if d == "cuda")
    ratio = next(b for b in main.blocks if isinstance(b, Chart) and "CPU/GPU" in b.caption)
    assert _wedges(ratio) == pytest.approx({"CPU": 100 * cpu_us / (cpu_us + gpu_us),
                                           "GPU": 100 * gpu_us / (cpu_us + gpu_us)})
    assert f"{100 * gpu_us / (cpu_us + gpu_us):.0f} % of the operators' time was spent on executing GPU" in text
    table = next(b for b in cpu.blocks if isinstance(b, Table))
    assert [r[0] for r in table.rows] == ["aten::convolution_backward", "aten::addmm", "aten::relu", "aten::mm"]
    assert table.rows[0][1:] == pytest.approx([20, 40.0, 52.0, 100 * 40_000 / cpu_us])
    assert table.caption == "All 4 CPU operators, over 1 detailed-profiling window(s)"
    assert '"aten::convolution_backward" with 56 %' in _text(cpu)
    assert _wedges(next(b for b in gpu.blocks if isinstance(b, Chart))) == pytest.approx(
        {"volta_sgemm_128x64_nn": 90.0, "void at::native::elementwise_kernel": 10.0})


def test_cpu_only_windows_say_there_are_no_gpu_operators(tmp_path: Path):
    main, cpu, gpu = _build(full_run(tmp_path / "run", gpus=0).root)
    assert any(isinstance(b, Table) for b in cpu.blocks)
    assert gpu.blocks == [NotApplicable("The detailed-profiling windows recorded no GPU operators: the job ran on the "
                                        "CPU only (no CUDA device was profiled).")]
    assert "All of the operators' time in the detailed-profiling windows was spent on CPU operators." in _text(main)
    assert not any(isinstance(b, Chart) and "CPU/GPU" in b.caption for b in main.blocks)


def test_without_a_profiling_window_it_says_how_to_get_one(tmp_path: Path):
    _, cpu, gpu = _build(full_run(tmp_path / "run", gpus=1, operators=False).root)
    for s in (cpu, gpu):
        (na,) = s.blocks
        assert "No detailed-profiling window was recorded" in na.reason and "--detailed-profiling 5:1" in na.reason


def test_a_window_without_its_summary_is_named(tmp_path: Path):
    root = full_run(tmp_path / "run", gpus=1, operators=False).root
    d = layout.trace_window_dir("algo-1", 0, "detailed-1700000060505000")
    RunLocation(str(root)).write_atomic(f"{d}/{layout.WINDOW_JSON}", json.dumps({
        "layer": "detailed", "node": "algo-1", "rank": 0, "window": "detailed-1700000060505000",
        "start_us": 1_700_000_060_505_000, "files": ["trace.json.gz"], "summary_error": "trace too big"}).encode())
    _, cpu, _ = _build(root)
    assert "1 detailed-profiling window(s) were recorded, but none holds an operator summary" in cpu.blocks[0].reason


def test_without_framework_data_it_says_so_plainly(tmp_path: Path):
    main, cpu, _ = _build(full_run(tmp_path / "run", gpus=0, framework=False).root)
    (na,) = main.blocks
    assert na.reason.startswith("No framework metrics in this run (no framework data") and "stallwatch run" in na.reason
    assert "--detailed-profiling 5:1" in cpu.blocks[0].reason


def test_time_between_steps_and_uneven_passes_are_called_out(tmp_path: Path):
    root = full_run(tmp_path / "run", gpus=0, framework=False).root
    details = {"phase": {"TRAIN": 55.0, "others": 45.0}, "phase_us": {"TRAIN": 55_000_000, "others": 45_000_000},
               "forward_backward": {"forward": 80.0, "backward": 20.0},
               "forward_backward_us": {"forward": 8_000_000, "backward": 2_000_000},
               "operator_windows": 1,
               "operators": {"CPU": [{"operator": "aten::mm", "calls": 3, "self_us": 6_000.0, "total_us": 6_000.0,
                                      "percent": 60.0}], "CPU_count": 9}}
    result = {"RuleName": "OverallFrameworkMetrics", "Status": "ok", "Details": details}
    main, cpu, _ = _build(root, rule_results=[RuleResult.from_json(result)])
    (warn,) = [b for b in main.blocks if isinstance(b, Verdict)]
    assert warn.level == WARN and "(45.0 %) in phase \"others\"" in warn.text
    (para,) = [b for b in main.blocks if isinstance(b, Paragraph)][:1]
    assert "In the training steps, 80 % of the time of forward and backward passes was spent in the forward pass" \
        in para.text
    assert "significant difference between the time spent on forward and backward pass" in para.text  # both kept
    pie = next(b for b in cpu.blocks if isinstance(b, Chart))
    assert _wedges(pie) == pytest.approx({"aten::mm": 6.0, "other operators": 4.0})  # 60 % listed: 4 ms unlisted
    assert next(b for b in cpu.blocks if isinstance(b, Table)).caption.startswith("The 1 most expensive of 9 CPU")


def test_a_gpu_run_says_its_phases_are_host_time(tmp_path: Path):
    """Measured on an H100: with a `loss.item()` each step, "other" read 91 % where CUDA events said forward 34 %."""
    gpu_main = _build(full_run(tmp_path / "gpu", gpus=2).root)[0]
    cpu_main = _build(full_run(tmp_path / "cpu", gpus=0).root)[0]
    assert framework.GPU_HOST_TIME in _text(gpu_main)
    assert framework.GPU_HOST_TIME not in _text(cpu_main)



def test_a_share_says_of_what_and_one_slice_is_a_sentence_not_a_pie(tmp_path: Path):
    """A loop of GLOBAL steps whose only recorded part is the optimizer read "100 % optimizer" in a pie; the
    general events' pie read "61 % waiting for data" for a DDP run whose steps waited 4 % of their time."""
    root = full_run(tmp_path / "run", gpus=0, framework=False).root
    details = {"phase": {"GLOBAL": 100.0}, "phase_us": {"GLOBAL": 10_000_000},
               "modes": {"GLOBAL": {"steps": 100, "step_us": 10_000_000, "parts_us": {"optimizer": 10_000_000},
                                    "parts": {"optimizer": 100.0}},
                         "TRAIN": {"steps": 50, "step_us": 20_000_000,
                                   "parts_us": {"backward": 18_000_000, "data_wait": 800_000, "optimizer": 400_000,
                                                "other": 800_000},
                                   "parts": {"backward": 90.0, "data_wait": 4.0, "other": 4.0, "optimizer": 2.0}}},
               "general": {"data_wait": 61.0, "optimizer": 39.0},
               "general_us": {"data_wait": 800_000, "optimizer": 500_000}}
    result = {"RuleName": "OverallFrameworkMetrics", "Status": "ok", "Details": details}
    main, _, _ = _build(root, rule_results=[RuleResult.from_json(result)])
    text = _text(main)
    assert "All of it was in GLOBAL steps." in text  # the loop's one phase: a sentence
    assert "All of the 100 timed GLOBAL steps' 10.0 s was optimizer step." in text  # the catalogue's label
    assert "Of the 50 timed TRAIN steps' 20.0 s: backward 90 %, waiting for data 4 %, the loop's own code 4 %, " \
           "optimizer step 2 %." in text
    charts = [b for b in main.blocks if isinstance(b, Chart)]
    assert [[f.title for f in c.model.children] for c in charts] == [["TRAIN steps' time"]]
    assert "61 %" not in text
