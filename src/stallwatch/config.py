"""The profiling configuration: one set of fields shared by the Python API, CLI flags and JSON files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeGuard

SAMPLE_INTERVAL_PRESETS_MS = (100, 200, 500, 1000, 5000, 60000)
MIN_SAMPLE_INTERVAL_MS = 100
MAX_SAMPLE_INTERVAL_MS = 60_000
PYTHON_PROFILERS = ("cprofile", "pyinstrument")
CPROFILE_TIMERS = ("total", "cpu", "off_cpu")
MAX_TIME_US = 253_402_300_800 * 1_000_000  # 10000-01-01T00:00:00Z
# What a running job picks up from its run's config.json (`stallwatch config RUN ...`).
LIVE_FIELDS = ("sample_interval_ms", "detailed_profiling", "dataloader_profiling", "python_profiling", "memory_profiling",
               "python_profiler", "cprofile_timer", "stop_training", "dump_stacks")
ACTION_KINDS = ("log", "stop_training", "command:", "notify:")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_URI_LIKE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(/*)([^/?#]*)")


def _uri_problem(out: str) -> str | None:
    """Why `out` is a URI no store can take ("s3://" with no bucket, "gs://b"), or None. Left alone, "s3://"
    became a local folder named "s3:" that later runs silently joined."""
    m = _URI_LIKE.match(out.strip())
    if m is None or not (m.group(2) or not m.group(3)):
        return None  # a plain path ("runs/exp:1" stays a path)
    scheme, bucket = m.group(1).lower(), m.group(3)
    if scheme == "file":
        return None
    if scheme != "s3":
        return f"is a {scheme}:// URI: use a local path or s3://bucket/prefix/run"
    return None if bucket and m.group(2) == "//" else "names no bucket: use s3://bucket/prefix/run"
MAX_STORAGE_MB = 1e9  # a petabyte: anything above is a typo, and its bytes would not fit an int64
# torch.profiler keeps every event of a window in the job's memory until the window ends (10,000 steps of a
# small model: 1.5 GB), so a detailed window is a few steps or seconds, never an open-ended recording.
MAX_DETAILED_STEPS = 100
MAX_DETAILED_SECONDS = 300.0
# Reading a config file (or a run's config.json) is bounded: a config is a few hundred bytes of flat JSON.
MAX_CONFIG_BYTES = 1 << 20
_MAX_INT_DIGITS = 40  # far beyond any allowed value; a longer literal is refused before it is converted


class ConfigError(ValueError):
    """A configuration value that is not allowed; the message names the field, the value and the fix."""

    def __init__(self, field_name: str, value: Any, allowed: str):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        name = field_name if isinstance(field_name, str) and field_name.isprintable() and len(field_name) <= 100 \
            else _shown(field_name)
        # One line, whatever the file held (a key may be any text, newlines included).
        super().__init__(" ".join(f"invalid {name}={_shown(value)}: {allowed}".splitlines()))


def _shown(value: Any, limit: int = 200) -> str:
    """The value as it appears in a message: one short line, whatever it is (a megabyte of JSON, a 5,000-digit
    integer, a list nested a thousand deep)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an integer of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<a {type(value).__name__} that cannot be shown>"
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclass(frozen=True)
class ProfilingRange:
    """Which steps (or which wall-clock window) a profiling layer covers, as in SageMaker's FrameworkProfile."""

    start_step: int | None = None
    num_steps: int | None = None
    start_time_us: int | None = None
    duration_s: float | None = None

    @property
    def by_steps(self) -> bool:
        return self.start_step is not None

    def validate(self, name: str) -> None:
        by_step = self.start_step is not None or self.num_steps is not None
        by_time = self.start_time_us is not None or self.duration_s is not None
        if by_step and by_time:
            raise ConfigError(name, self.to_spec(), "give either steps (START:NUM) or a time window (TIME/SECONDS), not both")
        detailed = name == "detailed_profiling"
        if by_step:
            if not _is_int(self.start_step) or not 0 <= self.start_step < 2**63:
                raise ConfigError(f"{name}.start_step", self.start_step, "must be an integer >= 0")
            if detailed and not (_is_int(self.num_steps) and 1 <= self.num_steps <= MAX_DETAILED_STEPS):
                raise ConfigError(f"{name}.num_steps", self.num_steps,
                                  f"must be an integer >= 1 and at most {MAX_DETAILED_STEPS} (torch.profiler holds every "
                                  "event of the window in the job's memory: profile a few representative steps)")
            if not _is_int(self.num_steps) or not 1 <= self.num_steps < 2**63:
                raise ConfigError(f"{name}.num_steps", self.num_steps, "must be an integer >= 1")
        if by_time:
            if not _is_int(self.start_time_us) or not 0 <= self.start_time_us < MAX_TIME_US:
                raise ConfigError(f"{name}.start_time_us", self.start_time_us,
                                  "must be an integer of µs since the Unix epoch (>= 0, before the year 10000)")
            if detailed and not (_is_number(self.duration_s) and 0 < self.duration_s <= MAX_DETAILED_SECONDS):
                raise ConfigError(f"{name}.duration_s", self.duration_s,
                                  f"must be > 0 and <= {MAX_DETAILED_SECONDS:g} seconds (torch.profiler holds every "
                                  "event of the window in the job's memory)")
            if not _is_number(self.duration_s) or not 0 < self.duration_s <= 86_400:
                raise ConfigError(f"{name}.duration_s", self.duration_s, "must be > 0 and <= 86400 seconds")

    def to_spec(self) -> str:
        if self.start_step is not None or self.num_steps is not None:
            return f"{self.start_step}:{self.num_steps}"
        start = datetime.fromtimestamp((self.start_time_us or 0) / 1e6, tz=timezone.utc)
        seconds = repr(float(self.duration_s or 0))  # exact: `:g` rounded 1.000001 to 1
        return f"{start.isoformat().replace('+00:00', 'Z')}/{seconds.removesuffix('.0')}"

    @classmethod
    def parse(cls, name: str, spec: str) -> ProfilingRange:
        """Parse `START:NUM` (steps) or `TIME/SECONDS` (TIME is ISO-8601 or Unix seconds)."""
        if not isinstance(spec, str):
            raise ConfigError(name, spec, "must be a string: START:NUM for steps or TIME/SECONDS for a time window")
        text = spec.strip()
        if "/" in text:
            start_text, _, dur_text = text.partition("/")
            start_us = _parse_time_us(name, start_text)
            dur_text = dur_text.strip().removesuffix("s")
            try:
                duration = float(dur_text)
            except ValueError:
                raise ConfigError(name, spec, "time windows are TIME/SECONDS, e.g. 2026-11-22T06:00:00Z/30") from None
            rng = cls(start_time_us=start_us, duration_s=duration)
        else:
            m = re.fullmatch(r"(\d+)(?::(\d+))?", text)
            if not m:
                raise ConfigError(name, spec, "use START:NUM for steps (e.g. 5:2) or TIME/SECONDS for a time window")
            rng = cls(start_step=int(m.group(1)), num_steps=int(m.group(2) or 1))
        rng.validate(name)
        return rng


def _parse_time_us(name: str, text: str) -> int:
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ConfigError(name, text, "the start time must be ISO-8601 (2026-11-22T06:00:00Z) or Unix seconds")
        return int(round(seconds * 1e6))
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(name, text, "the start time must be ISO-8601 (2026-11-22T06:00:00Z) or Unix seconds") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(round(when.timestamp() * 1e6))


MAX_STOP_REASON_CHARS = 4000  # a stop_training reason past this is cut, with a note of its length


@dataclass(frozen=True)
class ProfilerConfig:
    """Everything a run can be told; immutable, validated on construction."""

    sample_interval_ms: int = 500
    out: str | None = None
    runs_dir: str = "stallwatch-runs"
    node: str | None = None
    flush_interval_s: float = 5.0
    max_storage_mb: float = 10_240.0
    upload_timeout_s: float = 30.0
    gpu: bool = True
    detailed_profiling: ProfilingRange | None = None
    dataloader_profiling: ProfilingRange | None = None
    python_profiling: ProfilingRange | None = None
    # Where memory grows: tracemalloc snapshots a few steps apart (and CUDA's allocator history) in this window
    memory_profiling: ProfilingRange | None = None
    python_profiler: str = "cprofile"
    cprofile_timer: str = "total"
    rules_interval_s: float = 10.0  # live rule evaluation during `stallwatch run`; 0: only when the job ends
    # "RULE=ACTION": log | stop_training | command:SHELL COMMAND | notify:http(s)://URL, run when RULE fires
    rule_actions: tuple[str, ...] = ()
    # "module:Class" or "path/to/file.py:Class": user rules evaluated like the built-ins
    custom_rules: tuple[str, ...] = ()
    # "RULE.parameter=value": the rules' parameters for this run (live and at the end), e.g. StepOutlier.stddev=4
    rule_params: tuple[str, ...] = ()
    # Set (live) to stop training at the next step boundary; the text is the reason, recorded in the run
    stop_training: str | None = None
    # What one node costs per hour (any currency): the report and summary turn the run into a cost
    price_per_hour: float | None = None
    # When a live rule fires: a short detailed capture on its own, at most one per rule per `escalate_every_s`
    # and within `escalate_budget_pct` of the job's time so far (docs/format.md, Escalation)
    escalate: bool = True
    escalate_every_s: float = 600.0
    escalate_budget_pct: float = 2.0
    # Above this many steps a second on a rank, steps are timed TIMED_S of every second and the others counted
    # (docs/accuracy.md, Sampled steps); 0: every step is timed, whatever it costs the job
    sample_steps_above_per_s: float = 500.0
    # Raised (live) to ask every process of the job for the Python stacks of all its threads, once per increase
    # (the Hang rule does it when a rank stops; stored under stacks/, docs/format.md)
    dump_stacks: int = 0

    def __post_init__(self) -> None:
        reason = self.stop_training
        if isinstance(reason, str) and len(reason) > MAX_STOP_REASON_CHARS + 64:  # (room for the note: cut once)
            # It travels to every job process in one message and into the run's events: bounded, said so.
            object.__setattr__(self, "stop_training", f"{reason[:MAX_STOP_REASON_CHARS]} … (cut to "
                               f"{MAX_STOP_REASON_CHARS} of its {len(reason)} characters)")
        self.validate()

    def validate(self) -> None:
        iv = self.sample_interval_ms
        if isinstance(iv, bool) or not isinstance(iv, int) or not MIN_SAMPLE_INTERVAL_MS <= iv <= MAX_SAMPLE_INTERVAL_MS:
            presets = ", ".join(str(p) for p in SAMPLE_INTERVAL_PRESETS_MS)
            raise ConfigError(
                "sample_interval_ms", iv,
                f"must be an integer from {MIN_SAMPLE_INTERVAL_MS} to {MAX_SAMPLE_INTERVAL_MS} ms (presets: {presets})",
            )
        if not _is_number(self.flush_interval_s) or not 0.2 <= self.flush_interval_s <= 300:
            raise ConfigError("flush_interval_s", self.flush_interval_s, "must be from 0.2 to 300 seconds")
        if not _is_number(self.max_storage_mb) or not 0 < self.max_storage_mb <= MAX_STORAGE_MB:
            raise ConfigError("max_storage_mb", self.max_storage_mb,
                              f"must be a number of megabytes > 0 and at most {MAX_STORAGE_MB:.0e} (a petabyte)")
        if self.price_per_hour is not None and not (_is_number(self.price_per_hour)
                                                    and 0 <= self.price_per_hour <= 1_000_000):
            raise ConfigError("price_per_hour", self.price_per_hour,
                              "must be what one node costs per hour, a number from 0 to 1000000 (or null)")
        if not isinstance(self.escalate, bool):
            raise ConfigError("escalate", self.escalate, "must be true or false")
        if not _is_number(self.escalate_every_s) or not 1 <= self.escalate_every_s <= 86_400:
            raise ConfigError("escalate_every_s", self.escalate_every_s, "must be from 1 to 86400 seconds")
        if not _is_number(self.escalate_budget_pct) or not 0 <= self.escalate_budget_pct <= 100:
            raise ConfigError("escalate_budget_pct", self.escalate_budget_pct, "must be from 0 to 100 (%)")
        if not _is_number(self.sample_steps_above_per_s) or not 0 <= self.sample_steps_above_per_s <= 10_000_000:
            raise ConfigError("sample_steps_above_per_s", self.sample_steps_above_per_s,
                              "must be a number of steps per second from 0 (time every step) to 10000000")
        if isinstance(self.dump_stacks, bool) or not isinstance(self.dump_stacks, int) \
                or not 0 <= self.dump_stacks < 2**31:
            raise ConfigError("dump_stacks", self.dump_stacks, "must be a whole number from 0 (raise it to ask the "
                              "job's processes for their stacks)")
        if not _is_number(self.upload_timeout_s) or not 0 <= self.upload_timeout_s <= 3600:
            raise ConfigError("upload_timeout_s", self.upload_timeout_s, "must be from 0 to 3600 seconds")
        if self.node is not None and not (isinstance(self.node, str) and _NODE_NAME.match(self.node)):
            raise ConfigError("node", self.node,
                              "must be 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit")
        if self.out is not None and not (isinstance(self.out, str) and self.out.strip()):
            raise ConfigError("out", self.out, "must be a directory path or an s3:// URI")
        if isinstance(self.out, str) and (why := _uri_problem(self.out)):
            raise ConfigError("out", self.out, why)
        if not isinstance(self.runs_dir, str) or not self.runs_dir.strip():
            raise ConfigError("runs_dir", self.runs_dir, "must be a directory path (where new runs are created)")
        if not isinstance(self.gpu, bool):
            raise ConfigError("gpu", self.gpu, "must be true or false")
        if self.python_profiler not in PYTHON_PROFILERS:
            raise ConfigError("python_profiler", self.python_profiler, f"must be one of {', '.join(PYTHON_PROFILERS)}")
        if not _is_number(self.rules_interval_s) or not (self.rules_interval_s == 0 or 1 <= self.rules_interval_s <= 3600):
            raise ConfigError("rules_interval_s", self.rules_interval_s,
                              "must be 0 (evaluate the rules only when the job ends) or from 1 to 3600 seconds")
        for name in ("rule_actions", "custom_rules", "rule_params"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise ConfigError(name, value, "must be a list of strings")
        for text in self.rule_actions:
            rule, sep, action = text.partition("=")
            if not sep or not rule.strip() or not _valid_action(action.strip()):
                raise ConfigError("rule_actions", text, "write RULE=ACTION with ACTION one of log, stop_training, "
                                  "command:SHELL COMMAND, notify:https://URL")
        for text in self.rule_params:
            name, sep, _ = text.partition("=")
            rule, dot, key = name.strip().partition(".")
            if not sep or not dot or not rule or not key.strip():
                raise ConfigError("rule_params", text, "write RULE.parameter=value, e.g. StepOutlier.stddev=4")
        for text in self.custom_rules:
            module, sep, cls = text.rpartition(":")
            if not sep or not module or not cls.isidentifier():
                raise ConfigError("custom_rules", text, "write module.path:ClassName or path/to/file.py:ClassName")
        if self.stop_training is not None and not (isinstance(self.stop_training, str) and self.stop_training.strip()):
            raise ConfigError("stop_training", self.stop_training, "must be the reason, as text (or null)")
        if self.cprofile_timer not in CPROFILE_TIMERS:
            raise ConfigError("cprofile_timer", self.cprofile_timer, f"must be one of {', '.join(CPROFILE_TIMERS)}")
        for name in ("detailed_profiling", "dataloader_profiling", "python_profiling", "memory_profiling"):
            rng = getattr(self, name)
            if rng is not None:
                if not isinstance(rng, ProfilingRange):
                    raise ConfigError(name, rng, "must be a ProfilingRange, START:NUM or TIME/SECONDS")
                rng.validate(name)

    @property
    def flush_interval_us(self) -> int:
        return int(self.flush_interval_s * 1e6)

    @property
    def max_storage_bytes(self) -> int:
        return int(self.max_storage_mb * 1024 * 1024)

    def replace(self, **changes: Any) -> ProfilerConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, ProfilingRange):
                value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
            out[f.name] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, base: ProfilerConfig | None = None) -> ProfilerConfig:
        """Build from a JSON-like dict; unknown keys are errors (a typo must not be silently ignored)."""
        if not isinstance(data, dict):
            raise ConfigError("config", type(data).__name__, "must be a JSON object of field: value")
        known = {f.name for f in fields(cls)}
        changes: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ConfigError(key, value, f"is not a config field; known fields: {', '.join(sorted(known))}")
            if key.endswith("_profiling") and value is not None:
                value = _range_from_json(key, value)
            if key in ("rule_actions", "custom_rules", "rule_params") and isinstance(value, list):
                value = tuple(value)
            changes[key] = value
        return dataclasses.replace(base or cls(), **changes)

    @classmethod
    def load(cls, path: str | Path, *, base: ProfilerConfig | None = None) -> ProfilerConfig:
        """A config file, read within bounds (a regular file of at most MAX_CONFIG_BYTES: a FIFO or /dev/zero
        is refused, not waited on); any problem is a ConfigError naming the file."""
        return cls.from_json_bytes(read_config_file(path), str(path), base=base)

    @classmethod
    def from_json_bytes(cls, data: bytes, source: str, *, base: ProfilerConfig | None = None) -> ProfilerConfig:
        """A config file's or a run's config.json bytes: every way they can be wrong is a ConfigError."""
        value = parse_config_json(data, source)
        try:
            return cls.from_dict(value, base=base)
        except (TypeError, OverflowError) as exc:  # a value of the wrong type that comparison choked on
            raise ConfigError("config file", source, f"has a value of the wrong type ({exc})") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")


def read_config_file(path: str | Path) -> bytes:
    """At most MAX_CONFIG_BYTES of a regular file. Opened without blocking (a FIFO would wait for a writer
    forever) and checked before reading (a device such as /dev/zero never ends)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:
        raise ConfigError("config file", str(path), f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError("config file", str(path), "is not a regular file (a FIFO, a device or a directory): "
                              "give a JSON file")
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError("config file", str(path), f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError("config file", str(path), f"is larger than {MAX_CONFIG_BYTES // 2**20} MB; a config is a "
                          "few hundred bytes of JSON")
    return b"".join(chunks)


def parse_config_json(data: bytes, source: str) -> Any:
    """JSON config bytes -> their value, bounded in size, depth (json's own recursion guard) and integer length
    (a long literal is refused before its quadratic conversion), whatever the bytes are."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("config file", source, f"is larger than {MAX_CONFIG_BYTES // 2**20} MB; a config is a "
                          "few hundred bytes of JSON")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError("config file", source, f"is not UTF-8 text (byte {exc.start}); write it as UTF-8 JSON") \
            from None
    try:
        return json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise ConfigError("config file", source, f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise ConfigError("config file", source, "nests arrays or objects too deeply; a config is a flat JSON "
                          "object") from None
    except ValueError as exc:
        raise ConfigError("config file", source, f"is not valid JSON ({exc})") from None


class _LongInteger:
    """An integer literal too long to be any allowed value, kept unconverted (a 5,000-digit literal costs
    quadratic time to convert, and more raises): every field refuses it by type, naming itself."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _bounded_int(text: str) -> int | _LongInteger:
    digits = len(text.lstrip("-"))
    return _LongInteger(digits) if digits > _MAX_INT_DIGITS else int(text)


def _valid_action(action: str) -> bool:
    if action in ("log", "stop_training"):
        return True
    if action.startswith("command:"):
        return bool(action[len("command:"):].strip())
    if action.startswith("notify:"):
        url = action[len("notify:"):].strip()
        return url.startswith(("http://", "https://")) and len(url) > 8
    return False


def _range_from_json(name: str, value: Any) -> ProfilingRange:
    if isinstance(value, ProfilingRange):
        return value
    if isinstance(value, str):
        return ProfilingRange.parse(name, value)
    if isinstance(value, dict):
        allowed = {f.name for f in fields(ProfilingRange)}
        extra = set(value) - allowed
        if extra:
            raise ConfigError(name, value, f"unknown keys {sorted(extra)}; allowed: {', '.join(sorted(allowed))}")
        rng = ProfilingRange(**value)
        rng.validate(name)
        return rng
    raise ConfigError(name, value, "must be START:NUM, TIME/SECONDS or an object with start_step/num_steps or start_time_us/duration_s")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[float]:
    """A finite int or float (an int of any size is finite: math.isfinite would overflow converting it)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
