"""The built-in rules, in the report's order."""

from __future__ import annotations

from stallwatch.analyze.rules.batch_size import BatchSize
from stallwatch.analyze.rules.bottleneck import CPUBottleneck, IOBottleneck
from stallwatch.analyze.rules.communication import CommunicationBound
from stallwatch.analyze.rules.contention import CPUContention
from stallwatch.analyze.rules.dataloader import Dataloader
from stallwatch.analyze.rules.framework_metrics import OverallFrameworkMetrics
from stallwatch.analyze.rules.gpu_memory_increase import GPUMemoryIncrease
from stallwatch.analyze.rules.hang import Hang
from stallwatch.analyze.rules.input_bound import InputBound
from stallwatch.analyze.rules.load_balancing import LoadBalancing
from stallwatch.analyze.rules.low_gpu_utilization import LowGPUUtilization
from stallwatch.analyze.rules.max_initialization_time import MaxInitializationTime
from stallwatch.analyze.rules.memory_growth import MemoryGrowth
from stallwatch.analyze.rules.step_outlier import StepOutlier
from stallwatch.analyze.rules.straggler import Straggler
from stallwatch.analyze.rules.system_usage import OverallSystemUsage

RULES: list = [
    CPUBottleneck, IOBottleneck, CPUContention, Dataloader, InputBound, GPUMemoryIncrease, BatchSize,
    LowGPUUtilization, MaxInitializationTime, LoadBalancing, StepOutlier, Straggler, CommunicationBound, MemoryGrowth,
    Hang,
    OverallSystemUsage, OverallFrameworkMetrics,
]
