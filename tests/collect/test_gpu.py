"""GpuReader against a stand-in for pynvml (there is no GPU here), and against the real pynvml."""

from __future__ import annotations

import inspect
import logging
import math
from pathlib import Path

import pytest

from stallwatch import records as r
from stallwatch.collect.gpu import GPU_METRICS, GpuReader

from ._support import load_fake_pynvml

GiB = 1 << 30
N = len(GPU_METRICS)


def by_key(reader: GpuReader, values: list[float]) -> dict[tuple[str, str], float]:
    keys = reader.keys()
    assert len(keys) == len(values)
    return {(k.device, k.metric): v for k, v in zip(keys, values)}


def gpu_values(reader: GpuReader, values: list[float], index: int) -> list[float]:
    return values[index * N:(index + 1) * N]


# -- the stand-in itself mirrors the real module ------------------------------------------------------------
FUNCTIONS = ["nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
             "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
             "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
             "nvmlSystemGetDriverVersion"]
CONSTANTS = ["NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM", "NVML_CLOCK_GRAPHICS", "NVML_CLOCK_MEM",
             "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_LIBRARY_NOT_FOUND",
             "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_UNKNOWN", "NVML_ERROR_TIMEOUT",
             "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", "nvmlMemory_v2"]
ERRORS = ["NVMLError_NotSupported", "NVMLError_GpuIsLost", "NVMLError_LibraryNotFound",
          "NVMLError_DriverNotLoaded", "NVMLError_Unknown", "NVMLError_Timeout", "NVMLError_Uninitialized",
          "NVMLError_FunctionNotFound"]


def test_fake_mirrors_the_real_pynvml_names_signatures_and_errors():
    real = pytest.importorskip("pynvml")
    fake = load_fake_pynvml()
    for name in FUNCTIONS:
        assert list(inspect.signature(getattr(fake, name)).parameters) == \
            list(inspect.signature(getattr(real, name)).parameters), name
    for name in CONSTANTS:
        assert getattr(fake, name) == getattr(real, name), name
    for name in ERRORS:
        real_cls, fake_cls = getattr(real, name), getattr(fake, name)
        assert issubclass(real_cls, real.NVMLError) and issubclass(fake_cls, fake.NVMLError)
        # both build the subclass from the code, and the subclass without arguments
        assert type(fake.NVMLError(real_cls().value)) is fake_cls
        assert fake_cls().value == real_cls().value
        assert str(fake_cls()) == str(real_cls())


# -- mapping ----------------------------------------------------------------------------------------------
def test_reads_every_metric_of_every_gpu_with_units_converted():
    nvml = load_fake_pynvml(gpus=2)
    reader = GpuReader(nvml=nvml)
    assert reader.count == 2 and reader.reason_absent == ""
    assert [k.device for k in reader.keys()] == ["gpu0"] * N + ["gpu1"] * N
    assert [k.metric for k in reader.keys()[:N]] == list(GPU_METRICS)
    v = by_key(reader, reader.read())
    for i in (0, 1):
        d = f"gpu{i}"
        assert v[(d, r.GPU_UTIL)] == 40 + i
        assert v[(d, r.GPU_MEM_BW_UTIL)] == 20 + i  # utilization.memory is the memory *controller* load
        assert v[(d, r.GPU_MEM_USED_BYTES)] == (4 + i) * GiB
        assert v[(d, r.GPU_MEM_UTIL)] == pytest.approx(100.0 * (4 + i) / (16 + 8 * i))  # used / total
        assert v[(d, r.GPU_POWER_W)] == pytest.approx(150.0 + i)  # mW -> W
        assert v[(d, r.GPU_TEMP_C)] == 60 + i
        assert v[(d, r.GPU_SM_CLOCK_MHZ)] == 1400 + 10 * i  # the SM clock, not graphics or memory
    assert reader.devices == [
        {"index": 0, "name": "Fake GPU 0", "uuid": "GPU-fake-0000", "memory_total_bytes": 16 * GiB},
        {"index": 1, "name": "Fake GPU 1", "uuid": "GPU-fake-0001", "memory_total_bytes": 24 * GiB},
    ]
    assert reader.driver_version() == "999.99.99"
    reader.close()
    assert nvml.calls["nvmlShutdown"] == 1
    assert reader.count == 0


def test_bytes_names_are_decoded():
    nvml = load_fake_pynvml(gpus=1)
    nvml.nvmlDeviceGetName = lambda h: b"Old Driver GPU"  # older nvidia-ml-py returned bytes
    nvml.nvmlDeviceGetUUID = lambda h: b"GPU-bytes"
    reader = GpuReader(nvml=nvml)
    assert reader.devices[0]["name"] == "Old Driver GPU" and reader.devices[0]["uuid"] == "GPU-bytes"


def test_disabled_reader_does_not_touch_nvml():
    nvml = load_fake_pynvml(gpus=2)
    reader = GpuReader(nvml=None, enabled=False)
    assert reader.count == 0 and reader.keys() == [] and reader.read() == []
    assert "gpu=false" in reader.reason_absent
    assert nvml.calls["nvmlInit"] == 0


def test_memory_used_leaves_out_what_the_driver_reserves_as_nvidia_smi_does():
    # Measured on an H100 (driver 580): NVML's v1 call said 480 MiB used on an idle GPU, nvidia-smi 0.
    nvml = load_fake_pynvml(gpus=1)
    reader = GpuReader(nvml=nvml)
    v = by_key(reader, reader.read())
    assert v[("gpu0", r.GPU_MEM_USED_BYTES)] == 4 * GiB
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 1  # the total, at start


def test_a_driver_without_the_v2_memory_call_is_read_with_v1_and_asked_once(stallwatch_log):
    nvml = load_fake_pynvml(gpus=2, not_supported=["nvmlDeviceGetMemoryInfo_v2"])
    reader = GpuReader(nvml=nvml)
    for _ in range(3):
        v = by_key(reader, reader.read())
        assert v[("gpu1", r.GPU_MEM_USED_BYTES)] == 5 * GiB + nvml.RESERVED  # v1 counts the reserved part
        assert v[("gpu1", r.GPU_MEM_UTIL)] == pytest.approx(100.0 * (5 * GiB + nvml.RESERVED) / (24 * GiB))
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 2  # once per GPU, then never again
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 2 + 6  # the totals at start, then every read
    assert stallwatch_log.lines(logging.WARNING) == []


# -- degrading --------------------------------------------------------------------------------------------
def test_not_supported_disables_only_that_metric(stallwatch_log):
    nvml = load_fake_pynvml(gpus=2, not_supported=["nvmlDeviceGetPowerUsage"])
    reader = GpuReader(nvml=nvml)
    for _ in range(3):
        v = by_key(reader, reader.read())
        for d in ("gpu0", "gpu1"):
            assert math.isnan(v[(d, r.GPU_POWER_W)])
            assert v[(d, r.GPU_UTIL)] > 0 and v[(d, r.GPU_TEMP_C)] > 0 and v[(d, r.GPU_SM_CLOCK_MHZ)] > 0
            assert not math.isnan(v[(d, r.GPU_MEM_UTIL)])
    # asked once per GPU, then never again
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 2
    assert nvml.calls["nvmlDeviceGetTemperature"] == 6
    said = [line for line in stallwatch_log.lines() if "power" in line]
    assert len(said) == 2, said
    assert stallwatch_log.lines(logging.WARNING) == []  # "not supported" is normal, not a warning


def test_lost_gpu_is_empty_from_then_on_while_the_others_continue(stallwatch_log):
    nvml = load_fake_pynvml(gpus=3, fail_after=2, fail_with="GpuIsLost", fail_gpus=[1])
    reader = GpuReader(nvml=nvml)
    rows = [reader.read() for _ in range(6)]
    for n, values in enumerate(rows, start=1):
        assert all(not math.isnan(x) for x in gpu_values(reader, values, 0)), n
        assert all(not math.isnan(x) for x in gpu_values(reader, values, 2)), n
        gpu1 = gpu_values(reader, values, 1)
        if n <= 2:
            assert all(not math.isnan(x) for x in gpu1), n
        else:
            assert all(math.isnan(x) for x in gpu1), n
    # the lost GPU is not asked again: one failing call, then nothing (a lost GPU can block each call)
    util_calls_gpu1 = nvml._handles[1].reads
    assert util_calls_gpu1 == 3
    warnings = stallwatch_log.lines(logging.WARNING)
    assert len(warnings) == 1 and "GPU 1" in warnings[0] and "GpuIsLost" in warnings[0], warnings
    assert len(reader.keys()) == 3 * N  # the shape of a snapshot never changes


def test_transient_error_gives_nan_once_and_one_log_line(stallwatch_log):
    nvml = load_fake_pynvml(gpus=2, fail_after=2, fail_count=1, fail_with="Unknown")
    reader = GpuReader(nvml=nvml)
    rows = [reader.read() for _ in range(5)]
    for n, values in enumerate(rows, start=1):
        nans = [math.isnan(x) for x in values]
        if n == 3:
            assert all(nans), values  # every call of this read failed, on both GPUs
        else:
            assert not any(nans), (n, values)
    warnings = stallwatch_log.lines(logging.WARNING)
    assert len(warnings) == 1, warnings  # not one per GPU and metric (that would be 10 lines)
    assert "NVMLError_Unknown" in warnings[0]
    # and it recovers for good: later reads are complete
    assert not any(math.isnan(x) for x in reader.read())


def test_repeated_errors_stay_one_line(stallwatch_log):
    nvml = load_fake_pynvml(gpus=2, fail_after=0, fail_with="Timeout")
    reader = GpuReader(nvml=nvml)
    for _ in range(20):
        assert all(math.isnan(x) for x in reader.read())
    assert len(stallwatch_log.lines(logging.WARNING)) == 1


@pytest.mark.parametrize("error", ["LibraryNotFound", "DriverNotLoaded"])
def test_no_driver_means_zero_gpus_with_a_reason(error):
    nvml = load_fake_pynvml(gpus=2, init_error=error)
    reader = GpuReader(nvml=nvml)
    assert reader.count == 0
    assert reader.keys() == [] and reader.read() == [] and reader.devices == []
    assert f"NVMLError_{error}" in reader.reason_absent
    assert reader.driver_version() == ""
    reader.close()  # nothing to shut down, and no error
    assert nvml.calls["nvmlShutdown"] == 0


def test_zero_devices_is_said():
    reader = GpuReader(nvml=load_fake_pynvml(gpus=0))
    assert reader.count == 0 and "no GPU" in reader.reason_absent


# -- the real pynvml on this machine ----------------------------------------------------------------------
def _has_nvidia_driver() -> bool:
    return Path("/proc/driver/nvidia").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_driver_raises_library_not_found_and_reader_has_no_gpu():
    pynvml = pytest.importorskip("pynvml")
    assert not getattr(pynvml, "__fake__", False), "the fake pynvml is on sys.path"
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    reader = GpuReader()
    assert reader.count == 0 and reader.read() == []
    assert "LibraryNotFound" in reader.reason_absent


def test_fake_reads_its_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("FAKE_NVML_GPUS", "3")
    monkeypatch.setenv("FAKE_NVML_FAIL_AFTER", "1")
    monkeypatch.setenv("FAKE_NVML_FAIL_WITH", "GpuIsLost")
    monkeypatch.setenv("FAKE_NVML_FAIL_GPUS", "2")
    reader = GpuReader(nvml=load_fake_pynvml())  # configured at import, from the environment
    assert reader.count == 3
    reader.read()
    second = reader.read()
    assert all(math.isnan(x) for x in gpu_values(reader, second, 2))
    assert not any(math.isnan(x) for x in gpu_values(reader, second, 0))
