"""The baseline: a straightforward psutil loop sampling the same metrics as stallwatch, the way MLflow's
system-metrics monitor does (fresh psutil calls every sample, sleep(interval) between samples), writing
SageMaker-style JSON lines. Run as a process: `python naive_monitor.py INTERVAL_MS OUT_FILE ROOT_PID`."""

from __future__ import annotations

import json
import sys
import time

import psutil


def sample(root: psutil.Process) -> list[dict]:
    ts = time.time()
    out = []
    per_core = psutil.cpu_percent(percpu=True)
    per_core_times = psutil.cpu_times_percent(percpu=True)
    out.append({"Type": "cpu", "Name": "cpu", "Dimension": "CPUUtilization", "Value": psutil.cpu_percent(), "Timestamp": ts})
    for i, (util, times) in enumerate(zip(per_core, per_core_times)):
        out.append({"Type": "cpu", "Name": f"cpu{i}", "Dimension": "CPUUtilization", "Value": util, "Timestamp": ts})
        out.append({"Type": "cpu", "Name": f"cpu{i}", "Dimension": "IOWait", "Value": times.iowait, "Timestamp": ts})
    vm = psutil.virtual_memory()
    out.append({"Type": "memory", "Name": "memory", "Dimension": "MemoryUsedPercent", "Value": vm.percent, "Timestamp": ts})
    disk = psutil.disk_io_counters()
    net = psutil.net_io_counters()
    out.append({"Type": "io", "Name": "disk", "Dimension": "ReadBytes", "Value": disk.read_bytes, "Timestamp": ts})
    out.append({"Type": "io", "Name": "disk", "Dimension": "WriteBytes", "Value": disk.write_bytes, "Timestamp": ts})
    out.append({"Type": "network", "Name": "net", "Dimension": "BytesRecv", "Value": net.bytes_recv, "Timestamp": ts})
    out.append({"Type": "network", "Name": "net", "Dimension": "BytesSent", "Value": net.bytes_sent, "Timestamp": ts})
    procs = [root] + root.children(recursive=True)
    cpu = rss = 0.0
    for p in procs:
        try:
            cpu += p.cpu_percent()
            rss += p.memory_info().rss
        except psutil.Error:
            pass
    out.append({"Type": "process", "Name": "job", "Dimension": "CPUUtilization", "Value": cpu, "Timestamp": ts})
    out.append({"Type": "process", "Name": "job", "Dimension": "RSS", "Value": rss, "Timestamp": ts})
    out.append({"Type": "process", "Name": "job", "Dimension": "Processes", "Value": len(procs), "Timestamp": ts})
    return out


def main() -> None:
    interval_s = int(sys.argv[1]) / 1000
    root = psutil.Process(int(sys.argv[3]))
    with open(sys.argv[2], "a") as out:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        while True:
            for rec in sample(root):
                out.write(json.dumps(rec) + "\n")
            out.flush()
            time.sleep(interval_s)


if __name__ == "__main__":
    main()
