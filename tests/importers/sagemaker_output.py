"""Writing SageMaker Debugger profiler output the way SageMaker wrote it (file names, folders, one JSON object a
line), for tests that need shapes the public fixtures do not have. Every value is planted by the caller."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

S = 1_000_000


def hour_dir(us: int) -> str:
    return datetime.fromtimestamp(us / S, timezone.utc).strftime("%Y%m%d%H")


def system_line(type_: str, name: str, dimension: str, value: float, node: str, timestamp: float | int) -> str:
    """One value as SageMaker's system monitor wrote it (Name absent for memory, I/O and network totals)."""
    obj: dict[str, Any] = {"Type": type_}
    if name:
        obj["Name"] = name
    obj.update({"Dimension": dimension, "Value": value, "NodeId": node, "Timestamp": timestamp})
    return json.dumps(obj)


def write_system_file(root: Path, node: str, minute_s: int, lines: list[str], *, tail: str = "") -> Path:
    """system/incremental/<YYYYMMDDHH>/<minute>.<node>.json; `tail` is appended as is (a half-written line)."""
    path = root / "system" / "incremental" / hour_dir(minute_s * S) / f"{minute_s}.{node}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines) + tail)
    return path


@dataclass
class Round:
    """One sampling round of a node: every value of it at (nearly) one time."""

    t_us: int
    cores: list[float]
    iowait: list[float]
    gpus: list[float]
    gpu_mem: list[float]
    mem: float
    read_bps: float
    write_bps: float
    net_rx: tuple[float, float]  # (Algorithm, Platform)
    net_tx: tuple[float, float]

    def lines(self, node: str, unit: str = "s") -> list[str]:
        """The round's lines, with the few-ms offsets between kinds that SageMaker's monitor has."""
        def when(offset_us: int) -> float | int:
            t = self.t_us + offset_us
            return {"s": t / S, "us": t, "ns": t * 1000}[unit]
        out = [system_line("i/o", "ReadThroughputInBytesPerSecond", "", self.read_bps, node, when(0)),
               system_line("i/o", "WriteThroughputInBytesPerSecond", "", self.write_bps, node, when(0))]
        for i, (u, w) in enumerate(zip(self.cores, self.iowait)):
            out.append(system_line("cpu", f"cpu{i}", "CPUUtilization", u, node, when(150)))
            out.append(system_line("cpu", f"cpu{i}", "I/OWaitPercentage", w, node, when(150)))
        out.append(system_line("memory", "MemoryUsedPercent", "", self.mem, node, when(300)))
        for i, (g, m) in enumerate(zip(self.gpus, self.gpu_mem)):
            out.append(system_line("gpu", f"gpu{i}", "GPUUtilization", g, node, when(2000)))
            out.append(system_line("gpu", f"gpu{i}", "GPUMemoryUtilization", m, node, when(2000)))
        for dim, rx, tx in (("Algorithm", self.net_rx[0], self.net_tx[0]), ("Platform", self.net_rx[1], self.net_tx[1])):
            out.append(system_line("network", "ReceiveBytesPerSecond", dim, rx, node, when(4500)))
            out.append(system_line("network", "TransmitBytesPerSecond", dim, tx, node, when(4500)))
        return out


def write_rounds(root: Path, node: str, rounds: list[Round], unit: str = "s") -> list[Path]:
    """Rounds into minute files, as SageMaker split them (by the round's minute)."""
    by_minute: dict[int, list[str]] = {}
    for r in rounds:
        by_minute.setdefault(r.t_us // S // 60 * 60, []).extend(r.lines(node, unit))
    return [write_system_file(root, node, m, lines) for m, lines in sorted(by_minute.items())]


def trace_file(root: Path, process: str, suffix: str, end_us: int, name_time: str | None = None) -> Path:
    """framework/pevents/<YYYYMMDDHH>/<time>_<process>_<suffix>; `name_time` overrides the time in the name."""
    path = root / "framework" / "pevents" / hour_dir(end_us) / f"{name_time or end_us}_{process}_{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_trace(path: Path, base_us: int | None, phases: dict[int, str], events: list[dict[str, Any]],
                *, close: bool = True, tail: str = "") -> Path:
    """A timeline file as smdebug's writer made it: '[', metadata events, one event a line, ']'. Events'
    `ts` are µs from `base_us` (None: the file carries no start time, the previous file's holds)."""
    lines = []
    if base_us is not None:
        lines.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": base_us}})
    for pid, name in phases.items():
        lines.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        lines.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
    lines += events
    body = "[\n" + ",\n".join(json.dumps(e) for e in lines)
    path.write_text(body + ("\n]\n" if close else ",\n") + tail)
    return path
