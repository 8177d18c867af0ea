"""NVIDIA GPUs through NVML (nvidia-ml-py); without a driver there are simply no GPUs, said once."""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Callable

from stallwatch import records as r
from stallwatch.log import logger, warn_once
from stallwatch.records import MetricKey

_NAN = math.nan

GPU_METRICS = (r.GPU_UTIL, r.GPU_MEM_UTIL, r.GPU_MEM_USED_BYTES, r.GPU_MEM_BW_UTIL,
               r.GPU_POWER_W, r.GPU_TEMP_C, r.GPU_SM_CLOCK_MHZ)

# What an NVML without the v2 memory call raises (an old driver: no such symbol, or a struct version it does not
# know); it is then asked with v1 from then on.
V2_MISSING = ("NotSupported", "FunctionNotFound", "ArgumentVersionMismatch")


def load_nvml() -> ModuleType | None:
    """The pynvml module, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuReader:
    """One NVML session; reads every GPU's metrics and keeps going when a call, a metric or a GPU fails."""

    def __init__(self, nvml: ModuleType | None = None, enabled: bool = True) -> None:
        self._nvml = nvml if nvml is not None else (load_nvml() if enabled else None)
        self._handles: list[Any] = []
        self._lost: set[int] = set()
        self._unsupported: set[tuple[int, str]] = set()
        self._memory_v1: set[int] = set()  # GPUs whose driver or bindings lack the v2 memory call
        self.devices: list[dict[str, Any]] = []
        self.reason_absent = ""
        if not enabled:
            self.reason_absent = "GPU sampling is off (gpu=false)"
            return
        if self._nvml is None:
            self.reason_absent = "nvidia-ml-py is not installed"
            return
        try:
            self._nvml.nvmlInit()
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
            self.reason_absent = f"NVML is not available ({_err_text(exc)})"
            self._handles = []
            return
        if not self._handles:
            self.reason_absent = "NVML found no GPU"
        for i, h in enumerate(self._handles):
            self.devices.append({
                "index": i,
                "name": self._safe(lambda: _text(self._nvml.nvmlDeviceGetName(h)), ""),
                "uuid": self._safe(lambda: _text(self._nvml.nvmlDeviceGetUUID(h)), ""),
                "memory_total_bytes": self._safe(lambda: int(self._nvml.nvmlDeviceGetMemoryInfo(h).total), None),
            })

    @property
    def count(self) -> int:
        return len(self._handles)

    def driver_version(self) -> str:
        if not self._handles:
            return ""
        return self._safe(lambda: _text(self._nvml.nvmlSystemGetDriverVersion()), "")

    def keys(self) -> list[MetricKey]:
        return [MetricKey(f"gpu{i}", m) for i in range(self.count) for m in GPU_METRICS]

    def read(self) -> list[float]:
        """Values in the order of `keys()`; NaN for whatever could not be read this time."""
        out: list[float] = []
        for i, h in enumerate(self._handles):
            if i in self._lost:
                out += [_NAN] * len(GPU_METRICS)
                continue
            util = self._call(i, "utilization", lambda: self._nvml.nvmlDeviceGetUtilizationRates(h))
            mem = self._call(i, "memory", lambda: self._memory_info(i, h))
            power = self._call(i, "power", lambda: self._nvml.nvmlDeviceGetPowerUsage(h))
            temp = self._call(i, "temperature", lambda: self._nvml.nvmlDeviceGetTemperature(h, self._nvml.NVML_TEMPERATURE_GPU))
            clock = self._call(i, "sm_clock", lambda: self._nvml.nvmlDeviceGetClockInfo(h, self._nvml.NVML_CLOCK_SM))
            if i in self._lost:  # lost during this read
                out += [_NAN] * len(GPU_METRICS)
                continue
            mem_util = _NAN
            if mem is not None and mem.total:
                mem_util = 100.0 * mem.used / mem.total
            out += [
                float(util.gpu) if util is not None else _NAN,
                mem_util,
                float(mem.used) if mem is not None else _NAN,
                float(util.memory) if util is not None else _NAN,
                power / 1000.0 if power is not None else _NAN,
                float(temp) if temp is not None else _NAN,
                float(clock) if clock is not None else _NAN,
            ]
        return out

    def _memory_info(self, index: int, handle: Any) -> Any:
        """Used memory as nvidia-smi counts it: NVML's v2 call leaves out what the driver reserves (480 MiB on an
        H100, which the v1 call counts as used even on an idle GPU); drivers or bindings without v2 get v1."""
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        if index not in self._memory_v1 and version is not None:
            try:
                return self._nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except Exception as exc:
                if not any(s in type(exc).__name__ for s in V2_MISSING):
                    raise
            self._memory_v1.add(index)
        return self._nvml.nvmlDeviceGetMemoryInfo(handle)

    def close(self) -> None:
        if self._handles:
            self._safe(self._nvml.nvmlShutdown, None)
            self._handles = []

    def _call(self, index: int, what: str, fn: Callable[[], Any]) -> Any:
        # A lost GPU is not asked again (calls on a GPU that fell off the bus can block for seconds).
        if (index, what) in self._unsupported or index in self._lost:
            return None
        try:
            return fn()
        except Exception as exc:
            name = type(exc).__name__
            if "NotSupported" in name:
                self._unsupported.add((index, what))
                logger.info("GPU %d does not report %s; that metric is left out", index, what)
            elif "GpuIsLost" in name:
                self._lost.add(index)
                warn_once(f"gpu-lost-{index}", "GPU %d stopped answering (%s); its metrics are left empty from now on",
                          index, _err_text(exc))
            else:
                # One line per kind of error, not per GPU and metric: a driver hiccup on 8 GPUs is one line.
                warn_once(f"gpu-err-{name}",
                          "reading %s of GPU %d failed (%s); GPU readings are left empty where they fail",
                          what, index, _err_text(exc))
            return None

    @staticmethod
    def _safe(fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except Exception:
            return default


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _err_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ")
