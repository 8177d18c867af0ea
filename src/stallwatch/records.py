"""Record types shared by every stage: the system-metric vocabulary and the Arrow schemas of what readers return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

# Devices of a node's snapshot. Cores are "cpu0"…, GPUs "gpu0"….
CPU = "cpu"
MEMORY = "memory"
DISK = "disk"
NET = "net"
PROC = "proc"

# Metric names (units in the name, percentages are 0-100).
CPU_UTIL = "cpu_util"
CPU_IOWAIT = "cpu_iowait"
MEM_UTIL = "mem_util"
MEM_USED_BYTES = "mem_used_bytes"
DISK_READ_BPS = "disk_read_bps"
DISK_WRITE_BPS = "disk_write_bps"
NET_RX_BPS = "net_rx_bps"
NET_TX_BPS = "net_tx_bps"
GPU_UTIL = "gpu_util"
GPU_MEM_UTIL = "gpu_mem_util"
GPU_MEM_USED_BYTES = "gpu_mem_used_bytes"
GPU_MEM_BW_UTIL = "gpu_mem_bw_util"
GPU_POWER_W = "gpu_power_w"
GPU_TEMP_C = "gpu_temp_c"
GPU_SM_CLOCK_MHZ = "gpu_sm_clock_mhz"
PROC_CPU_UTIL = "cpu_util"
PROC_RSS_BYTES = "rss_bytes"
PROC_COUNT = "num_procs"
WORKERS_ALIVE = "workers_alive"
WORKERS_BUSY = "workers_busy"
WORKERS_CPU_UTIL = "workers_cpu_util"
# CPU contention (collect/contention.py, proctree.py): what takes CPUs from the job
CGROUP = "cgroup"  # the job's cgroup (its CPU limit)
CPU_STEAL = "cpu_steal"  # cpu: % of the node's CPU time a hypervisor gave to others
LOAD_1 = "load1"  # cpu: 1-minute load average (runnable + uninterruptible tasks)
CPU_THROTTLED = "cpu_throttled"  # cgroup: CFS periods throttled in the interval
CPU_THROTTLED_S = "cpu_throttled_s"  # cgroup: seconds throttled in the interval
CPU_QUOTA_CORES = "cpu_quota_cores"  # cgroup: the CPU limit in cores (quota / period); null when unlimited
RUNQ_MS_PER_S = "runq_ms_per_s"  # proc: run-queue delay of the job's processes' main threads, ms per second
WORKERS_RUNQ_MS_PER_S = "workers_runq_ms_per_s"  # proc: the same, of its data-loader workers alone
NVCSW_PER_S = "nvcsw_per_s"  # proc: involuntary context switches of the job's processes' main threads, per second

# Framework event kinds (what the training loop was doing), and the phases of a step.
STEP = "step"
DATA_WAIT = "data_wait"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
COLLECTIVE = "collective"
DDP_SYNC = "ddp_gradient_sync"  # a `collective`: the exposed part of DDP's gradient all-reduce in one step
DDP_CONFIG = "ddp"  # a DDP model's communication settings, once
LOSS = "loss"  # events a process had to drop (args: events, steps; start/end: their first and last start)
OVERHEAD = "overhead"  # a marker: stallwatch's own time in the training process (args: own_ns, window_ns, calls)
# a marker: steps counted but not timed while steps were sampled, one per stretch between timed ones and mode
# (args: steps, first, stretches, us; start/end: when timing paused and resumed)
UNTIMED = "untimed"
LOOP = "loop"  # a marker: how a rank's steps are delimited (name: loader, explicit, optimizer, pairs, undetermined)
MEMORY_LIMIT = "memory_limit"  # a marker: a memory limit the rank runs under (name: cgroup, gpu; args: bytes)
OOM = "oom"  # a marker: an allocation failed (name: cuda, host); args: the memory state at the failure
TRAIN, EVAL, GLOBAL = "TRAIN", "EVAL", "GLOBAL"
MODES = (TRAIN, EVAL, GLOBAL)

COLUMN_SEP = "/"
TIMESTAMP = "timestamp_us"


@dataclass(frozen=True, order=True)
class MetricKey:
    """One stored series of a node: a device and a metric; its column name in system files is `device/metric`."""

    device: str
    metric: str

    @property
    def column(self) -> str:
        return f"{self.device}{COLUMN_SEP}{self.metric}"

    @classmethod
    def from_column(cls, column: str) -> MetricKey:
        device, _, metric = column.partition(COLUMN_SEP)
        return cls(device, metric)


@dataclass(frozen=True)
class FrameworkEvent:
    """One timed thing a rank did: a step, waiting for a batch, forward, backward, an optimizer step…
    `step` is the step it belongs to (None outside steps); `args` is JSON text, "" when there is none."""

    kind: str
    name: str
    start_us: int
    end_us: int
    mode: str = GLOBAL
    step: int | None = None
    pid: int = 0
    args: str = ""


def framework_schema() -> pa.Schema:
    """The table `Run.framework()` returns: one row per event, node and rank taken from where it is stored."""
    import pyarrow as pa

    text = pa.dictionary(pa.int32(), pa.string())
    return pa.schema([
        pa.field("node", text, nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("pid", pa.int32(), nullable=False),
        pa.field("kind", text, nullable=False),
        pa.field("name", text, nullable=False),
        pa.field("mode", text, nullable=False),
        pa.field("step", pa.int64()),
        pa.field("start_us", pa.int64(), nullable=False),
        pa.field("end_us", pa.int64(), nullable=False),
        pa.field("args", pa.string(), nullable=False),
    ])


def system_schema() -> pa.Schema:
    """The tidy table `Run.system()` returns: one row per (snapshot, device, metric)."""
    import pyarrow as pa

    text = pa.dictionary(pa.int32(), pa.string())
    return pa.schema([
        pa.field(TIMESTAMP, pa.int64(), nullable=False),
        pa.field("node", text, nullable=False),
        pa.field("device", text, nullable=False),
        pa.field("metric", text, nullable=False),
        pa.field("value", pa.float64()),
    ])
