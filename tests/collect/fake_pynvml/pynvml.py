"""A stand-in for nvidia-ml-py's `pynvml` module, for machines without an NVIDIA GPU.

It mirrors the names, signatures and exception classes of the real module (nvidia-ml-py 13.x) for the
functions stallwatch calls, and returns fixed, per-GPU values that tests can assert exactly:

    GPU i: utilization.gpu = 40 + i %, utilization.memory = 20 + i %,
           memory total = (16 + 8 i) GiB, used = (4 + i) GiB, free = total - used - reserved, reserved by the
           driver = 480 MiB (the v1 call, like the real one, counts it as used: (4 + i) GiB + 480 MiB),
           power = 150000 + 1000 i mW, temperature = 60 + i °C, SM clock = 1400 + 10 i MHz,
           name = "Fake GPU i", uuid = "GPU-fake-000i", driver "999.99.99"

Behaviour comes from environment variables (read when the module is imported, so it can be put on the
PYTHONPATH of the sampler subprocess) or from `configure(**same_names_lowercase)` in-process:

    FAKE_NVML_GPUS            number of GPUs (default 2)
    FAKE_NVML_INIT_ERROR      raise this error class at nvmlInit, e.g. LibraryNotFound, DriverNotLoaded
    FAKE_NVML_FAIL_AFTER      reads of a GPU that succeed before failures start (default: never fail).
                              A "read" of a GPU starts with each nvmlDeviceGetUtilizationRates call on it;
                              every per-device metric call made during failing reads raises.
    FAKE_NVML_FAIL_COUNT      how many reads fail (default: all later ones; 1 = one transient error)
    FAKE_NVML_FAIL_WITH       error class of those failures: GpuIsLost (default), Unknown, Timeout, …
    FAKE_NVML_FAIL_GPUS       comma-separated GPU indices that fail (default: all)
    FAKE_NVML_NOT_SUPPORTED   comma-separated function names that always raise NVMLError_NotSupported,
                              e.g. nvmlDeviceGetPowerUsage, or nvmlDeviceGetMemoryInfo_v2 (an old driver)

`calls` counts every call by function name, so a test can see what was (and was not) asked.
"""

from __future__ import annotations

import os
from collections import Counter

__fake__ = True

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2

GiB = 1 << 30
MiB = 1 << 20
RESERVED = 480 * MiB  # what an H100's driver reserved (nvidia-smi leaves it out of memory.used)
nvmlMemory_v2 = 0x2000028

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument Version Mismatch",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """As in pynvml: `NVMLError(code)` builds the subclass for that code; subclasses take no argument."""

    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value=NVML_ERROR_UNKNOWN):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, *args):  # the value was set in __new__
        super().__init__()

    def __str__(self):
        return _ERROR_STRINGS.get(self.value, f"NVML error {self.value}")


def _error_class(name: str, value: int) -> type:
    def new(cls, *args):
        return NVMLError.__new__(cls, value)

    cls = type(name, (NVMLError,), {"__new__": new})
    cls.__module__ = __name__
    NVMLError._valClassMapping[value] = cls
    return cls


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_Timeout = _error_class("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)
NVMLError_FunctionNotFound = _error_class("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_ArgumentVersionMismatch = _error_class("NVMLError_ArgumentVersionMismatch",
                                                 NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


class c_nvmlUtilization_t:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu = gpu
        self.memory = memory


class c_nvmlMemory_t:
    def __init__(self, total: int, free: int, used: int) -> None:
        self.total = total
        self.free = free
        self.used = used


class c_nvmlMemory_v2_t:
    def __init__(self, version: int, total: int, reserved: int, free: int, used: int) -> None:
        self.version = version
        self.total = total
        self.reserved = reserved
        self.free = free
        self.used = used


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index
        self.reads = 0  # nvmlDeviceGetUtilizationRates calls so far

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t {self.index}>"


# -- behaviour ------------------------------------------------------------------------------------------
_settings: dict = {}
_handles: list[_Handle] = []
_initialized = False
calls: Counter = Counter()


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    return int(text) if text else None


def _env_list(name: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, "").split(",") if x.strip()]


def configure(*, gpus: int = 2, init_error: str | None = None, fail_after: int | None = None,
              fail_count: int | None = None, fail_with: str = "GpuIsLost", fail_gpus: list[int] | None = None,
              not_supported: list[str] | None = None) -> None:
    """Set the behaviour (the same knobs as the FAKE_NVML_* environment variables); resets all state."""
    global _initialized
    _settings.clear()
    _settings.update(gpus=gpus, init_error=init_error, fail_after=fail_after, fail_count=fail_count,
                     fail_with=fail_with, fail_gpus=None if fail_gpus is None else set(fail_gpus),
                     not_supported=set(not_supported or ()))
    _handles[:] = [_Handle(i) for i in range(gpus)]
    _initialized = False
    calls.clear()


def _configure_from_env() -> None:
    fail_gpus = _env_list("FAKE_NVML_FAIL_GPUS")
    configure(gpus=_env_int("FAKE_NVML_GPUS") if _env_int("FAKE_NVML_GPUS") is not None else 2,
              init_error=os.environ.get("FAKE_NVML_INIT_ERROR") or None,
              fail_after=_env_int("FAKE_NVML_FAIL_AFTER"),
              fail_count=_env_int("FAKE_NVML_FAIL_COUNT"),
              fail_with=os.environ.get("FAKE_NVML_FAIL_WITH") or "GpuIsLost",
              fail_gpus=[int(x) for x in fail_gpus] if fail_gpus else None,
              not_supported=_env_list("FAKE_NVML_NOT_SUPPORTED"))


def _error(name: str) -> NVMLError:
    cls = globals().get(f"NVMLError_{name}")
    if not (isinstance(cls, type) and issubclass(cls, NVMLError)):
        raise ValueError(f"fake pynvml: unknown error class NVMLError_{name}")
    return cls()


def _device_call(fn: str, handle: _Handle) -> None:
    """Count the call and raise whatever the configuration says this call raises."""
    calls[fn] += 1
    if not _initialized:
        raise NVMLError_Uninitialized()
    if not isinstance(handle, _Handle):
        raise NVMLError_InvalidArgument()
    if fn in _settings["not_supported"]:
        raise NVMLError_NotSupported()
    after = _settings["fail_after"]
    if after is None:
        return
    if _settings["fail_gpus"] is not None and handle.index not in _settings["fail_gpus"]:
        return
    count = _settings["fail_count"]
    if handle.reads > after and (count is None or handle.reads <= after + count):
        raise _error(_settings["fail_with"])


# -- the functions stallwatch uses, with the real signatures ---------------------------------------------
def nvmlInit():
    global _initialized
    calls["nvmlInit"] += 1
    if _settings["init_error"]:
        raise _error(_settings["init_error"])
    _initialized = True


def nvmlShutdown():
    global _initialized
    calls["nvmlShutdown"] += 1
    if not _initialized:
        raise NVMLError_Uninitialized()
    _initialized = False


def nvmlSystemGetDriverVersion():
    calls["nvmlSystemGetDriverVersion"] += 1
    if not _initialized:
        raise NVMLError_Uninitialized()
    return "999.99.99"


def nvmlDeviceGetCount():
    calls["nvmlDeviceGetCount"] += 1
    if not _initialized:
        raise NVMLError_Uninitialized()
    return len(_handles)


def nvmlDeviceGetHandleByIndex(index):
    calls["nvmlDeviceGetHandleByIndex"] += 1
    if not _initialized:
        raise NVMLError_Uninitialized()
    if not 0 <= index < len(_handles):
        raise NVMLError_InvalidArgument()
    return _handles[index]


def nvmlDeviceGetName(handle):
    _device_call("nvmlDeviceGetName", handle)
    return f"Fake GPU {handle.index}"


def nvmlDeviceGetUUID(handle):
    _device_call("nvmlDeviceGetUUID", handle)
    return f"GPU-fake-{handle.index:04d}"


def nvmlDeviceGetUtilizationRates(handle):
    if isinstance(handle, _Handle):
        handle.reads += 1
    _device_call("nvmlDeviceGetUtilizationRates", handle)
    return c_nvmlUtilization_t(gpu=40 + handle.index, memory=20 + handle.index)


def nvmlDeviceGetMemoryInfo(handle, version=None):
    total = (16 + 8 * handle.index) * GiB
    used = (4 + handle.index) * GiB
    if version:
        _device_call("nvmlDeviceGetMemoryInfo_v2", handle)
        if version != nvmlMemory_v2:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return c_nvmlMemory_v2_t(version, total=total, reserved=RESERVED, free=total - used - RESERVED, used=used)
    _device_call("nvmlDeviceGetMemoryInfo", handle)
    return c_nvmlMemory_t(total=total, free=total - used - RESERVED, used=used + RESERVED)


def nvmlDeviceGetPowerUsage(handle):
    _device_call("nvmlDeviceGetPowerUsage", handle)
    return 150_000 + 1_000 * handle.index  # milliwatts


def nvmlDeviceGetTemperature(handle, sensor):
    _device_call("nvmlDeviceGetTemperature", handle)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError_InvalidArgument()
    return 60 + handle.index


def nvmlDeviceGetClockInfo(handle, type):  # noqa: A002 - the real parameter name
    _device_call("nvmlDeviceGetClockInfo", handle)
    if type != NVML_CLOCK_SM:
        return 5000 + handle.index
    return 1400 + 10 * handle.index


_configure_from_env()
