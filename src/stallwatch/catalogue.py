"""The one vocabulary of what stallwatch shows: every framework phase (the parts of a step, the step modes, the
job's parts, the rules' flags) with its label and its one colour, every system metric with its label, unit,
scale and chart title, and the palettes. The report, the notebook, the dashboard (as JSON from its API) and the
timeline export all take names and colours from here, so one phase is one colour everywhere, never a slice's
place in a pie. Plain data: importing it imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stallwatch import records as r
from stallwatch import units


@dataclass(frozen=True)
class Phase:
    """A named part of the job's time. `key` is what the run stores (an event kind, a step mode); `aliases`
    are the other names the same part goes by in the rules' details and older texts; `trace_colour` is the
    Chrome trace format's reserved colour name (`cname`) closest to `colour`."""
    key: str
    label: str
    colour: str
    trace_colour: str | None = None
    aliases: tuple[str, ...] = ()


# The parts of a step (event kinds), in the order a step runs through them.
STEP_PARTS = (
    Phase(r.DATA_WAIT, "waiting for data", "#e08a00", "thread_state_iowait", ("data wait",)),
    Phase(r.FORWARD, "forward", "#2b5fa8", "thread_state_running"),
    Phase(r.BACKWARD, "backward", "#7b3fa8", "rail_animation"),
    Phase(r.OPTIMIZER, "optimizer step", "#2f7d32", "good", ("optimizer",)),
    Phase(r.COLLECTIVE, "collectives", "#c2185b", "bad", ("all-reduce", r.DDP_SYNC)),
    Phase("other", "the loop's own code", "#8d99a6", "generic_work",
          ("the loop's own code or a wait for the GPU", "rest of the steps", "outside_phases",
           "outside the recorded phases (the loop's own code)")),
    Phase("other_events", "other recorded events", "#bcbd22", "generic_work"),
    Phase("outside", "outside steps", "#cfd5dc", None, ()),
)
# The step modes, and the loop's time between steps.
MODES = (
    Phase(r.TRAIN, "Training", "#4c9be8", None, ("TRAIN steps",)),
    Phase(r.EVAL, "Evaluation", "#5cb85c", None, ("EVAL steps",)),
    Phase(r.GLOBAL, "Other steps", "#b39ddb", None, ("GLOBAL steps",)),
    Phase("others", "between steps", "#b8bec8", None, ()),
)
# The job's time: before the first step, the loop, after the last step.
JOB_PARTS = (
    Phase("initialization", "Initialization", "#9e9e9e"),
    Phase("loop", "Training loop", "#4c9be8"),
    Phase("finalization", "Finalization", "#616161"),
)
# What the rules flag on a timeline: ranges and moments.
FLAGS = (
    Phase("CPUBottleneck", "CPU bottleneck", "#d62728"),
    Phase("IOBottleneck", "I/O bottleneck", "#9467bd"),
    Phase("LowGPUUtilization", "Low GPU utilization", "#8c564b", None, ("Low GPU utilization (last)",)),
    Phase("GPUMemoryIncrease", "GPU memory increase", "#e377c2", None, ("GPU memory increase (last)",)),
    Phase("BatchSize", "Small batch", "#17becf", None, ("Small batch (last)",)),
    Phase("StepOutlier", "Outlier step", "#ff7f0e"),
)
PHASES = STEP_PARTS + MODES + JOB_PARTS + FLAGS

# Lines that are no phase (nodes, devices, operators): taken in order within one chart.
SERIES_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")
OTHERS_COLOUR = "#b8bec8"  # a pie's wedge of everything not listed
HIGHLIGHT_COLOUR = "#d62728"  # a bar or row that stands out
PLAIN_COLOUR = "#4c9be8"  # a bar that does not
NO_DATA_COLOUR = "#e0e0e0"  # a heatmap cell without a value
# How good or bad a statement is — the report's verdicts, the dashboard's findings and run states: (colour, tint).
LEVELS = {"good": ("#2e8540", "#eaf6ec"), "info": ("#2b5fab", "#eaf1fb"), "warn": ("#c98a00", "#fdf5e2"),
          "issue": ("#c0392b", "#fbeceb")}
SEVERITY_LEVEL = {"high": "issue", "medium": "warn", "low": "info"}  # a finding's severity, as a level
# Utilization heatmaps, report and dashboard alike: Viridis (purple idle, yellow busy), 256 levels.
_VIRIDIS = ("44015444025544035745055845065A45085B46095C460B5E460C5F460E61470F62471163471265471466471567471669"
            "47186A48196B481A6C481C6E481D6F481E70482071482172482273482374472575472676472777472878472A79472B7A"
            "472C7B462D7C462F7C46307D46317E45327F45347F453580453681443781443982433A83433B83433C84423D84423E85"
            "4240854141864142864043874044873F45873F47883E48883E49893D4A893D4B893D4C893C4D8A3C4E8A3B508A3B518A"
            "3A528B3A538B39548B39558B38568B38578C37588C37598C365A8C365B8C355C8C355D8C345E8D345F8D33608D33618D"
            "32628D32638D31648D31658D31668D30678D30688D2F698D2F6A8D2E6B8E2E6C8E2E6D8E2D6E8E2D6F8E2C708E2C718E"
            "2C728E2B738E2B748E2A758E2A768E2A778E29788E29798E287A8E287A8E287B8E277C8E277D8E277E8E267F8E26808E"
            "26818E25828E25838D24848D24858D24868D23878D23888D23898D22898D228A8D228B8D218C8D218D8C218E8C208F8C"
            "20908C20918C1F928C1F938B1F948B1F958B1F968B1E978A1E988A1E998A1E998A1E9A891E9B891E9C891E9D881E9E88"
            "1E9F881EA0871FA1871FA2861FA38620A48520A58521A68521A78422A78423A88323A98224AA8225AB8126AC8127AD80"
            "28AE7F29AF7F2AB07E2BB17D2CB17D2EB27C2FB37B30B47A32B57A33B67935B77836B87738B97639B9763BBA753DBB74"
            "3EBC7340BD7242BE7144BE7045BF6F47C06E49C16D4BC26C4DC26B4FC36951C46853C56755C66657C66559C7645BC862"
            "5EC96160C96062CA5F64CB5D67CC5C69CC5B6BCD596DCE5870CE5672CF5574D05477D05279D1517CD24F7ED24E81D34C"
            "83D34B86D44988D5478BD5468DD64490D64392D74195D73F97D83E9AD83C9DD93A9FD938A2DA37A5DA35A7DB33AADB32"
            "ADDC30AFDC2EB2DD2CB5DD2BB7DD29BADE27BDDE26BFDF24C2DF22C5DF21C7E01FCAE01ECDE01DCFE11CD2E11BD4E11A"
            "D7E219DAE218DCE218DFE318E1E318E4E318E7E419E9E419ECE41AEEE51BF1E51CF3E51EF6E61FF8E621FAE622FDE724")
HEAT_PALETTE = tuple("#" + _VIRIDIS[i:i + 6] for i in range(0, len(_VIRIDIS), 6))


@dataclass(frozen=True)
class Metric:
    """A stored system metric as it is shown. `device` is a device name or `gpu#`/`cpu#` for every numbered
    one; `label` names it in tables ({device} filled in), `title` on a chart, `track` as a trace counter;
    `unit` is the stored unit (see `stallwatch.units`), which charts scale to its display unit."""
    device: str
    metric: str
    label: str
    unit: str
    title: str
    track: str
    colour: str
    exported: bool = False  # a counter track of `stallwatch timeline` by default (the rest with --all-metrics)

    def matches(self, device: str) -> bool:
        if self.device.endswith("#"):
            prefix = self.device[:-1]
            return device.startswith(prefix) and device[len(prefix):].isdigit()
        return device == self.device


METRICS = (
    Metric(r.CPU, r.CPU_UTIL, "CPU total", "%", "CPU utilization (all cores)", "CPU util", "#1f77b4", True),
    Metric("cpu#", r.CPU_UTIL, "{device}", "%", "CPU utilization per core", "{device} util", "#1f77b4"),
    Metric(r.CPU, r.CPU_IOWAIT, "I/O wait", "%", "I/O wait (all cores)", "CPU I/O wait", "#d62728", True),
    Metric("cpu#", r.CPU_IOWAIT, "{device} I/O wait", "%", "I/O wait per core", "{device} I/O wait", "#d62728"),
    Metric(r.MEMORY, r.MEM_UTIL, "Memory", "%", "CPU memory", "memory used", "#9467bd", True),
    Metric(r.MEMORY, r.MEM_USED_BYTES, "Memory in use", "B", "CPU memory in use", "memory in use", "#9467bd"),
    Metric("gpu#", r.GPU_UTIL, "GPU", "%", "GPU utilization (mean of the node's GPUs)", "{device} util", "#2ca02c",
           True),
    Metric("gpu#", r.GPU_MEM_UTIL, "GPU memory", "%", "GPU memory (mean of the node's GPUs)",
           "{device} memory used", "#17becf", True),
    Metric("gpu#", r.GPU_MEM_USED_BYTES, "GPU memory in use", "B", "GPU memory in use", "{device} memory in use",
           "#17becf"),
    Metric("gpu#", r.GPU_MEM_BW_UTIL, "GPU memory bandwidth", "%", "GPU memory bandwidth",
           "{device} memory bandwidth", "#8c564b"),
    Metric("gpu#", r.GPU_POWER_W, "GPU power", "W", "GPU power", "{device} power", "#ff7f0e"),
    Metric("gpu#", r.GPU_TEMP_C, "GPU temperature", "°C", "GPU temperature", "{device} temperature", "#d62728"),
    Metric("gpu#", r.GPU_SM_CLOCK_MHZ, "GPU SM clock", "MHz", "GPU SM clock", "{device} SM clock", "#7f7f7f"),
    Metric(r.DISK, r.DISK_READ_BPS, "Disk read", "B/s", "Disk read", "disk read", "#8c564b", True),
    Metric(r.DISK, r.DISK_WRITE_BPS, "Disk write", "B/s", "Disk write", "disk write", "#e377c2", True),
    Metric(r.NET, r.NET_RX_BPS, "Network rx", "B/s", "Network received", "network received", "#1f77b4", True),
    Metric(r.NET, r.NET_TX_BPS, "Network tx", "B/s", "Network sent", "network sent", "#ff7f0e", True),
    Metric(r.PROC, r.PROC_CPU_UTIL, "Job CPU", "%", "The job's CPU", "job CPU", "#17becf"),
    Metric(r.PROC, r.PROC_RSS_BYTES, "Job memory (RSS)", "B", "The job's memory (RSS)", "job memory (RSS)",
           "#9467bd"),
    Metric(r.PROC, r.PROC_COUNT, "Job processes", "count", "The job's processes", "job processes", "#7f7f7f"),
    Metric(r.PROC, r.WORKERS_ALIVE, "Loader workers alive", "count", "Data-loader workers alive",
           "data workers alive", "#2ca02c"),
    Metric(r.PROC, r.WORKERS_BUSY, "Loader workers busy", "count", "Data-loader workers busy", "data workers busy",
           "#e08a00"),
    Metric(r.PROC, r.WORKERS_CPU_UTIL, "Loader workers CPU", "%", "Data-loader workers' CPU", "data workers CPU",
           "#e08a00"),
)
# Composite lines the charts draw from several stored metrics.
NETWORK_TOTAL = Metric(r.NET, "net_bps", "Network", "B/s", "Network (received + sent)", "network", "#1f77b4")


def _index() -> dict[str, Phase]:
    out: dict[str, Phase] = {}
    for p in PHASES:
        for name in (p.key, p.label, *p.aliases):
            out.setdefault(name, p)
            out.setdefault(name.lower(), p)
    return out


_BY_NAME = _index()


def phase(name: str) -> Phase | None:
    """The phase a key, label or alias names (any case), or None."""
    return _BY_NAME.get(name) or _BY_NAME.get(name.lower())


def colour(name: str) -> str | None:
    """The one colour of a phase, a mode, a job part or a flag, by any of its names; None for anything else."""
    p = phase(name)
    return p.colour if p is not None else None


def label(key: str) -> str:
    """What a stored phase key is called on every page (the key itself when it is no phase)."""
    p = phase(key)
    return p.label if p is not None else key


def colours(names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """A colour for each name of one chart: a phase's own, the rest from SERIES_PALETTE in order, skipping the
    colours the chart's phases already use."""
    out = {n: c for n in names if (c := colour(n)) is not None}
    free = [c for c in SERIES_PALETTE if c not in out.values()] or list(SERIES_PALETTE)
    rest = [n for n in dict.fromkeys(names) if n not in out]
    out.update({n: free[i % len(free)] for i, n in enumerate(rest)})
    return out


def metric(device: str, metric_name: str) -> Metric | None:
    """The catalogue's entry for a stored column `device/metric` (an exact device before a numbered one)."""
    exact = [m for m in METRICS if m.metric == metric_name and m.device == device]
    if exact:
        return exact[0]
    return next((m for m in METRICS if m.metric == metric_name and m.matches(device)), None)


def to_json() -> dict[str, Any]:
    """The catalogue as the dashboard reads it (GET /api/catalogue)."""
    def ph(group: tuple[Phase, ...]) -> list[dict[str, Any]]:
        return [{"key": p.key, "label": p.label, "colour": p.colour, "aliases": list(p.aliases)} for p in group]
    return {"step_parts": ph(STEP_PARTS), "modes": ph(MODES), "job_parts": ph(JOB_PARTS), "flags": ph(FLAGS),
            "metrics": [{"device": m.device, "metric": m.metric, "label": m.label, "unit": m.unit, "title": m.title,
                         "colour": m.colour} for m in (*METRICS, NETWORK_TOTAL)],
            "series_palette": list(SERIES_PALETTE), "others_colour": OTHERS_COLOUR,
            "highlight_colour": HIGHLIGHT_COLOUR, "no_data_colour": NO_DATA_COLOUR, "heat_palette": list(HEAT_PALETTE),
            "levels": {k: {"colour": c, "tint": t} for k, (c, t) in LEVELS.items()},
            "severity_level": dict(SEVERITY_LEVEL),
            **units.to_json()}
