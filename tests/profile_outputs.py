"""Real profiler outputs for tests, made the way the training job makes them: a torch.profiler Chrome trace
of a tiny CPU model, a cProfile dump and a pyinstrument session, each with a known number of calls."""

from __future__ import annotations

import cProfile
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MATMULS = 7  # explicit torch.mm calls in the traced window
LINEAR_CALLS = 3  # forward passes of the tiny model (one aten::linear -> aten::addmm each)
WORK_CALLS = 25  # calls of busy_work() under cProfile
START_US = 1_763_800_000_000_000


@dataclass
class RealOutputs:
    """Files of one generation, kept in a session-wide directory; tests copy them into their staging dir."""

    trace: Path
    pstats: Path
    pyinstrument: Path
    # torch's own key_averages() for a few operators: name -> (count, self_us, total_us)
    torch_totals: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    pyinstrument_root_s: float = 0.0


def busy_work(n: int = 2000) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def recurse(depth: int) -> int:
    return busy_work(3000) if depth == 0 else recurse(depth - 1) + busy_work(1000)


def make_real_outputs(directory: Path) -> RealOutputs:
    import torch
    from torch.profiler import ProfilerActivity, profile

    directory.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, a, b = torch.randn(4, 8), torch.randn(6, 6), torch.randn(6, 6)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(MATMULS):
            torch.mm(a, b)
        for _ in range(LINEAR_CALLS):
            model[0](x)
    trace = directory / "trace.json"
    prof.export_chrome_trace(str(trace))
    totals = {e.key: (e.count, e.self_cpu_time_total, e.cpu_time_total) for e in prof.key_averages()
              if e.key in ("aten::mm", "aten::addmm", "aten::linear")}

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(WORK_CALLS):
        busy_work()
    profiler.disable()
    pstats_path = directory / "profile.pstats"
    profiler.dump_stats(str(pstats_path))

    from pyinstrument import Profiler

    pyi = Profiler(interval=0.0005)
    pyi.start()
    deadline = time.perf_counter() + 0.15
    while time.perf_counter() < deadline:
        recurse(3)
    pyi.stop()
    session = pyi.last_session
    pyi_path = directory / "pyinstrument.json"
    session.save(str(pyi_path))
    root = session.root_frame()
    return RealOutputs(trace, pstats_path, pyi_path, totals, root.time if root is not None else 0.0)


def stage(source: Path, staging: Path, name: str | None = None) -> str:
    """Copy a real output into the staging directory as the job leaves it (a folder per window, unless a
    `name` directly in `staging` is given); its absolute path."""
    if name is None:
        folder = staging / f"1234-window-{time.monotonic_ns()}"
        target = folder / source.name
    else:
        folder, target = staging, staging / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return str(target)


def artifact(layer: str, files: dict[str, str], start_us: int = START_US, **meta: Any) -> dict[str, Any]:
    """The job's artifact message for one window, as the sampler receives it (decoded)."""
    profiler = meta.pop("profiler", "torch.profiler" if layer == "detailed" else
                        ("pyinstrument" if "pyinstrument.json" in files else "cprofile"))
    return {"layer": layer, "window": f"{layer}-{start_us:016d}", "files": files,
            "meta": {"layer": layer, "start_us": start_us, "end_us": start_us + 250_000, "mode": "TRAIN",
                     "first_step": 5, "last_step": 5, "pid": 1234, "profiler": profiler,
                     "timer": None if profiler != "cprofile" else "total", "activities": ["cpu"],
                     "status": "complete", **meta}}
