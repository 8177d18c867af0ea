"""What naming each data wait's loader costs a step (issue 35): the StepTracker's per-step work (batch_begin/end,
forward, backward, optimizer) of two checkouts side by side, in interleaved rounds in one process.

Run: python benchmarks/loader_attribution.py OLD_SRC NEW_SRC   (each a checkout's src/ directory)"""
import importlib.util, sys, time, statistics
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m; spec.loader.exec_module(m); return m
old = load(f"{sys.argv[1]}/stallwatch/torch/steps.py", "steps_old")
new = load(f"{sys.argv[2]}/stallwatch/torch/steps.py", "steps_new")
def run(mod, n):
    sink = []
    t = mod.StepTracker(sink.append, 1)
    now = mod.now_us
    t0 = time.perf_counter_ns()
    for i in range(n):
        b = t.batch_begin(1, True); t.batch_end(1, b, False)
        a = now(); t.forward(a, now(), "Net", True); t.backward(a, now())
        t.optimizer_begin(a, 7); t.optimizer(a, now(), "SGD", 7)
        if len(sink) > 1000: sink.clear()
    return (time.perf_counter_ns() - t0) / n
res = {"old": [], "new": []}
for r in range(30):
    for name, mod in (("old", old), ("new", new)) if r % 2 else (("new", new), ("old", old)):
        res[name].append(run(mod, 20000))
o, n = statistics.median(res["old"]), statistics.median(res["new"])
d = statistics.median([b - a for a, b in zip(res["old"], res["new"])])
print(f"per step (ns, median of 30 rounds x 20,000 steps): old {o:.0f}, new {n:.0f}, paired difference {d:+.0f}")
