"""Detailed profiling windows on Keras's JAX and TensorFlow backends: the backend's own profiler, its trace
stored like a torch.profiler one (Chrome trace JSON with `baseTimeNanoseconds`, operators tagged `cpu_op` on
the host and `kernel` on a device, so the report's operator tables and the timeline export read it as they
read PyTorch's). On the torch backend the windows use torch.profiler, as for any PyTorch job."""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable

from stallwatch.torch.windows import _Profiler

MAX_TRACE_BYTES = 512 * 2**20  # a larger (uncompressed) backend trace is not converted in the job's process


class _BackendProfiler(_Profiler):
    """Writes the backend's trace into a scratch folder; `stop()` converts it into the window's trace.json."""

    name = ""

    def __init__(self) -> None:
        self.meta = {"profiler": self.name, "activities": ["cpu"]}
        self._dir = ""
        self._start_ns = 0

    def start(self, first_step: int) -> None:
        self._dir = tempfile.mkdtemp(prefix="stallwatch-keras-trace-")
        self._start_ns = time.time_ns()
        try:
            self._start(self._dir)
        except Exception:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def stop(self, folder: str) -> dict[str, str]:
        try:
            self._stop()
            found = sorted(glob.glob(os.path.join(self._dir, "**", "*.trace.json.gz"), recursive=True))
            if not found:
                raise RuntimeError(f"{self.name} wrote no Chrome trace (*.trace.json.gz) for this window")
            path = os.path.join(folder, "trace.json")
            convert(found[-1], path, self._start_ns)
            return {"trace.json": path}
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _start(self, folder: str) -> None: ...
    def _stop(self) -> None: ...


class _JaxProfiler(_BackendProfiler):
    name = "jax.profiler"

    def _start(self, folder: str) -> None:
        import jax

        jax.profiler.start_trace(folder)

    def _stop(self) -> None:
        import jax

        jax.profiler.stop_trace()


class _TensorFlowProfiler(_BackendProfiler):
    """tf.profiler writes an XPlane file; XProf (`pip install xprof`, or the older tensorboard-plugin-profile)
    turns it into the Chrome trace the window stores. Without it the window is said to have failed."""

    name = "tf.profiler"

    def _start(self, folder: str) -> None:
        import tensorflow as tf

        tf.profiler.experimental.start(folder)

    def _stop(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()
        try:
            _xplane_to_trace(self._dir)
        except ImportError as exc:
            raise RuntimeError("tf.profiler wrote only an XPlane file: install xprof (pip install xprof) to have "
                               f"it converted into a trace ({exc})") from None


def _xplane_to_trace(folder: str) -> None:
    """XProf (TensorBoard's profile plugin) turns an XPlane file into the Chrome trace the window stores."""
    try:
        from xprof.convert import raw_to_tool_data  # type: ignore[import-not-found]
    except ImportError:
        from tensorboard_plugin_profile.convert import raw_to_tool_data  # type: ignore[import-not-found]

    for xplane in glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True):
        data, _ = raw_to_tool_data.xspace_to_tool_data([xplane], "trace_viewer", {})
        text = data.encode() if isinstance(data, str) else data
        with gzip.open(xplane[: -len(".xplane.pb")] + ".trace.json.gz", "wb") as f:
            f.write(text)


def factory(backend: str) -> Callable[[], _Profiler] | None:
    """The detailed-window profiler of a Keras backend (None on torch: the default torch.profiler)."""
    if backend == "jax":
        return _JaxProfiler
    if backend == "tensorflow":
        return _TensorFlowProfiler
    return None


def convert(source: str, target: str, start_ns: int) -> None:
    """A backend's Chrome trace (ts in µs from the profiler's start) as a stored trace: categories added for the
    operator summary (`cpu_op` for host work, `kernel` for device work, `python_function` for Python frames,
    which are not operators) and `baseTimeNanoseconds` = the profiler's start on the wall clock."""
    with gzip.open(source, "rb") as f:
        raw = f.read(MAX_TRACE_BYTES + 1)
    if len(raw) > MAX_TRACE_BYTES:
        raise RuntimeError(f"the trace holds more than {MAX_TRACE_BYTES // 2**20} MB of JSON; profile fewer steps")
    trace = json.loads(raw)
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise RuntimeError("the backend's trace has no traceEvents list")
    devices = {e.get("pid") for e in events if isinstance(e, dict) and e.get("ph") == "M"
               and e.get("name") == "process_name" and _is_device(str((e.get("args") or {}).get("name", "")))}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and "cat" not in e:
            e["cat"] = _category(str(e.get("name", "")), e.get("pid") in devices)
    out = {"traceEvents": events, "baseTimeNanoseconds": start_ns,
           "displayTimeUnit": trace.get("displayTimeUnit", "ms") if isinstance(trace, dict) else "ms"}
    with open(target, "w") as f:
        json.dump(out, f)


def _is_device(process_name: str) -> bool:
    return process_name.startswith("/device:") and "CPU" not in process_name


def _category(name: str, on_device: bool) -> str:
    if name.startswith("$"):
        return "python_function"  # the profiler's Python tracer: `$file.py:line function`
    if name.startswith("end: "):
        return "marker"  # XLA's region ends, not work of their own
    return "kernel" if on_device else "cpu_op"


