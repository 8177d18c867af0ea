"""A node's record (`nodes/<node>.json`, docs/format.md) as one typed, frozen value: the machine, the job's start,
end and exit, the sampling interval and its live changes. The store reads and checks it once
(`Run.node_records()`); everything else reads fields, never keys. Whether a node, and so a run, has finished is
decided here and nowhere else. The file on disk is unchanged: `to_json()` is the dict `Run.info["nodes"]` holds."""

from __future__ import annotations

import signal as _signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RUNNING_STATES = ("starting", "running")  # what a node's status says while its job runs


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class RankInfo:
    """A process of the job that sent framework events."""
    rank: int
    local_rank: int | None = None
    world_size: int | None = None
    pid: int | None = None


@dataclass(frozen=True)
class IntervalChange:
    """The sampling interval in force from `from_us` on (the sampler's start, then each live change)."""
    from_us: int
    sample_interval_ms: int


@dataclass(frozen=True)
class NodeRecord:
    """One node of a run. Times are µs since the epoch; a field the record lacks (or held with the wrong type,
    left out by the store's check) is None or empty."""
    name: str
    status: str | None = None  # starting | running | finished | sampler_stopped
    hostname: str | None = None
    start_us: int | None = None
    end_us: int | None = None  # None while running, or when the machine died before writing it
    end_us_from_data: int | None = None  # for a node without end_us: its last stored sample (the reader's)
    command: tuple[str, ...] = ()
    cwd: str | None = None
    job_pid: int | None = None
    exit_code: int | None = None  # as a shell reports it (128+N when signal N ended the command)
    recorded_signal: str | None = None  # the signal that ended the command, as written ("SIGTERM")
    signal_recorded: bool = False  # the record has the field (runs before it had none: see `exit_signal`)
    interrupted: bool = False  # `stallwatch run` forwarded a stop signal to the job
    cpu_cores_logical: int | None = None
    cpu_cores_physical: int | None = None
    memory_total_bytes: int | None = None
    gpus: tuple[Gpu, ...] = ()
    gpu_driver: str | None = None
    gpu_absent_reason: str | None = None
    sample_interval_ms: int | None = None  # in force now
    sample_intervals: tuple[IntervalChange, ...] = ()  # in time order
    metrics: tuple[str, ...] = ()
    ranks: tuple[RankInfo, ...] = ()
    samples_written: int | None = None
    samples_dropped: int | None = None
    ticks_missed: int | None = None
    sampler_cpu_s: float | None = None
    sampler_max_rss_bytes: int | None = None
    sampler_pid: int | None = None
    sampler_end_us: int | None = None
    platform: str | None = None
    python: str | None = None
    imported: Mapping[str, Any] | None = None  # an importer's provenance
    fields: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)  # as checked, by key

    @classmethod
    def from_json(cls, name: str, checked: Mapping[str, Any], end_us_from_data: int | None = None) -> NodeRecord:
        """The record from its JSON fields as the store checked them (docs/format.md; `records_check`)."""
        c = checked
        sig = c.get("exit_signal")
        if isinstance(sig, int) and not isinstance(sig, bool):
            sig = _signal_name(sig)
        return cls(
            name=name, status=_str(c.get("status")), hostname=_str(c.get("hostname")), start_us=_int(c.get("start_us")),
            end_us=_int(c.get("end_us")), end_us_from_data=end_us_from_data,
            command=tuple(str(w) for w in c.get("command") or ()), cwd=_str(c.get("cwd")),
            job_pid=_int(c.get("job_pid")), exit_code=_int(c.get("exit_code")),
            recorded_signal=sig if isinstance(sig, str) and sig else None, signal_recorded="exit_signal" in c,
            interrupted=c.get("interrupted") is True, cpu_cores_logical=_int(c.get("cpu_cores_logical")),
            cpu_cores_physical=_int(c.get("cpu_cores_physical")), memory_total_bytes=_int(c.get("memory_total_bytes")),
            gpus=tuple(Gpu(int(g["index"]), _str(g.get("name")), _str(g.get("uuid")),
                           _int(g.get("memory_total_bytes"))) for g in c.get("gpus") or () if _has_int(g, "index")),
            gpu_driver=_str(c.get("gpu_driver")), gpu_absent_reason=_str(c.get("gpu_absent_reason")),
            sample_interval_ms=_int(c.get("sample_interval_ms")),
            sample_intervals=tuple(sorted((IntervalChange(int(e["from_us"]), int(e["sample_interval_ms"]))
                                           for e in c.get("sample_intervals") or ()
                                           if _has_int(e, "from_us") and _has_int(e, "sample_interval_ms")),
                                          key=lambda e: e.from_us)),
            metrics=tuple(str(m) for m in c.get("metrics") or ()),
            ranks=tuple(RankInfo(int(r["rank"]), _int(r.get("local_rank")), _int(r.get("world_size")),
                                 _int(r.get("pid"))) for r in c.get("ranks") or () if _has_int(r, "rank")),
            samples_written=_int(c.get("samples_written")), samples_dropped=_int(c.get("samples_dropped")),
            ticks_missed=_int(c.get("ticks_missed")), sampler_cpu_s=_float(c.get("sampler_cpu_s")),
            sampler_max_rss_bytes=_int(c.get("sampler_max_rss_bytes")), sampler_pid=_int(c.get("sampler_pid")),
            sampler_end_us=_int(c.get("sampler_end_us")), platform=_str(c.get("platform")),
            python=_str(c.get("python")), imported=c.get("imported") if isinstance(c.get("imported"), dict) else None,
            fields=dict(c))

    def to_json(self) -> dict[str, Any]:
        """The record as `Run.info["nodes"][name]` documents it: the checked fields, `node` its file's name, and
        `end_us_from_data` for a node whose end was never written."""
        out = {**self.fields, "node": self.name}
        if self.end_us is None:
            out["end_us_from_data"] = self.end_us_from_data
        return out

    @property
    def finished(self) -> bool:
        """The node's job has ended: its status is past starting and running (finished, or sampler_stopped when
        the sampler stopped before the job). A record without a status has not been seen to finish."""
        return self.status is not None and self.status not in RUNNING_STATES

    @property
    def last_us(self) -> int | None:
        """The node's end, or where its data ends when the end was never written (its machine died)."""
        return self.end_us if self.end_us is not None else self.end_us_from_data

    @property
    def exit_signal(self) -> str | None:
        """The signal that ended the job: as recorded; for runs that did not record it, an exit code of 128+N
        read as signal N, as a shell does."""
        if self.recorded_signal is not None or self.signal_recorded or self.exit_code is None:
            return self.recorded_signal
        return _signal_name(self.exit_code - 128) if 129 <= self.exit_code <= 128 + 64 else None

    @property
    def interval_changes(self) -> list[tuple[int, float]]:
        """(from µs, interval ms) of the live interval changes, in time order; [] when the interval never changed
        (as `analyze.frames.interval_changes` reads the JSON record)."""
        out = [(c.from_us, float(c.sample_interval_ms)) for c in self.sample_intervals]
        return out if len({ms for _, ms in out}) > 1 else []

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpus)


def run_finished(records: Iterable[NodeRecord]) -> bool:
    """The run has finished: it has nodes and every one has (the one place this is decided)."""
    records = list(records)
    return bool(records) and all(r.finished for r in records)


def as_record(name: str, record: NodeRecord | Mapping[str, Any]) -> NodeRecord:
    """A NodeRecord, or one made of a record's JSON fields (e.g. a test's dict)."""
    return record if isinstance(record, NodeRecord) else NodeRecord.from_json(name, record)


def _signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _has_int(d: Any, key: str) -> bool:
    return isinstance(d, Mapping) and _int(d.get(key)) is not None
