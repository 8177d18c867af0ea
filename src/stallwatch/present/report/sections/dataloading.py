"""5. Dataloading analysis: data-loader workers against CPU cores per node, pinned memory and prefetching, the
loaders' settings, and how long the training loop waited for each batch (the Dataloader rule's numbers)."""

from __future__ import annotations

from typing import Any

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.rules.dataloader import DataloaderDetails, LoaderNode, LoaderSettings, WaitHistogram
from stallwatch.analyze.rules.input_bound import InputBoundDetails
from stallwatch.present.report.model import INFO, WARN, Chart, Paragraph, Section, Table, Verdict
from stallwatch.present.report.sections import _loop_charts as charts
from stallwatch.present.report.sections._loop import num, plural, rule_verdict, rule_view

RULE = "Dataloader"
TITLE = "Dataloading analysis"


def build(analysis: RunAnalysis) -> list[Section]:
    sec = Section("dataloading", TITLE, level=3)
    view, missing = rule_view(analysis, RULE, "the dataloading analysis")
    if missing is not None:
        sec.blocks.append(missing)
        return [sec]
    assert view is not None
    d = DataloaderDetails.from_json(view.details)
    p = view.parameters
    sec.blocks.append(Paragraph(
        "The number of data-loader workers can greatly affect the overall performance of your training job. The "
        "Dataloader rule first measured how much of each step the training loop spent waiting for its next batch: "
        f"only where that exceeded wait_threshold ({p.get('wait_threshold')} % of step time) is the loader a "
        "bottleneck worth changing — an in-memory dataset loaded in the main process is fine, and more workers "
        "would only cost memory. Where it is, the rule compared the number of data-loader worker processes "
        "running in parallel on the node (the median during the training loop) with its CPU cores: below "
        f"{p.get('min_threshold')} % too few workers prepare the batches, above {p.get('max_threshold')} % they "
        "compete for the CPU with the training processes, and in between the workers are enough but each batch is "
        f"too slow to produce. The rule analyzed {view.datapoints} samples of the worker count and fired on "
        f"{plural(view.triggered, 'node')}."))
    nodes = d.nodes
    if nodes:
        sec.blocks.append(_nodes_table(nodes, _judged_waits(analysis, nodes)))
    loaders = d.loaders
    if loaders:
        sec.blocks.append(_loaders_table(loaders, d.loaders_total or len(loaders)))
    timing = d.dataloading_time
    if timing.probs:
        sec.blocks += _timing(timing)
    # fired: the rule's recommendation names the nodes, the worker counts to try, pinned memory and prefetching
    sec.blocks.append(rule_verdict(view, "", view.recommendation if d.bottleneck is False else
                                   "The number of data-loader workers fits the CPU cores of every node."))
    advice = _advice(analysis, nodes, d)
    if advice and not view.triggered and d.bottleneck is not False:
        sec.blocks.append(Verdict(advice, INFO))
    starved = analysis.rule("InputBound")
    if not view.triggered and starved is not None and starved.status == "ok" and starved.triggered > 0:
        # a typical step waited little, but windows of steps waited more: the section must not read as the opposite
        # of the finding at the top of the report
        title = InputBoundDetails.from_json(starved.details).title or "The loop waits for data"
        sec.blocks.append(Verdict(f"Yet the InputBound rule found: {title}. {_cap(starved.recommendation)}", WARN))
    return [sec]


def _cap(text: str | None) -> str:
    return (text[:1].upper() + text[1:]) if text else ""


def _judged_waits(analysis: RunAnalysis, nodes: dict[str, LoaderNode]) -> dict[str, float | None]:
    """Per node, the training loop's wait for data as InputBound judged it (its steps' own time), which the report's
    top finding and verdict quote; the Dataloader rule's own share (as recorded) where InputBound has none."""
    starved = analysis.rule("InputBound")
    judged = InputBoundDetails.from_json(starved.details) if starved is not None and starved.status == "ok" else None
    out = {}
    for node, e in nodes.items():
        share = judged.train_wait_share(node) if judged is not None else None
        out[node] = share if share is not None else e.wait_share
    return out


def _nodes_table(nodes: dict[str, LoaderNode], waits: dict[str, float | None]) -> Table:
    rows = []
    for node, e in nodes.items():
        verdict = {"below": "too few workers", "above": "too many workers", "slow_fetch": "workers cannot keep up",
                   "not_a_bottleneck": "not a bottleneck"}.get(e.reason or "", "fine")
        if e.percent is None and e.reason not in ("slow_fetch", "not_a_bottleneck"):
            verdict = e.reason or "unknown"
        rows.append([node, e.cores, e.ranks, e.dataloaders, e.percent, e.max_alive, waits.get(node), e.source,
                     e.suggested_num_workers, verdict])
    return Table(["Node", "CPU cores", "Ranks", "Workers in parallel (median)", "% of cores", "Most workers alive",
                  "Data wait (% of step time, worst rank)", "Counted from", "Suggested num_workers per rank",
                  "Verdict"], rows,
                 caption="Data-loader workers and CPU cores per node; the data wait as InputBound judged it (the "
                         "steps' own time, a busy machine's share taken out)")


def _advice(analysis: RunAnalysis, nodes: dict[str, LoaderNode], d: DataloaderDetails) -> str:
    """The seeds' sentences on pinned memory (for GPU nodes) and prefetching, where they apply."""
    parts = []
    gpu_nodes = [n for n in nodes if analysis.node_record(n).has_gpus]
    if gpu_nodes and d.pin_memory is False:
        parts.append("Pinned memory makes copies to the GPUs faster and lets them overlap with compute; your "
                     "training job did not use it everywhere. With a PyTorch DataLoader, set pin_memory=True.")
    if d.prefetch is False:
        parts.append("Your training job did not prefetch data (every loader ran with num_workers=0, loading each "
                     "batch in the training process when it was needed). Prefetching prepares batches ahead of "
                     "time: use worker processes (num_workers > 0, prefetch_factor >= 2).")
    return " ".join(parts)


def _loaders_table(loaders: list[LoaderSettings], total: int) -> Table:
    rows = [[e.node, e.rank, e.dataset, _short_path(e.created_at), e.mode, e.batch_size, e.num_workers, e.pin_memory,
             e.prefetch_factor, e.persistent_workers, e.iterators] for e in loaders]
    more = f" (the first {len(loaders)} of {total})" if total > len(loaders) else ""
    # DataLoader's own argument names, shortened so the table fits its box (the caption names them)
    return Table(["Node", "Rank", "Dataset", "Built at", "Loop", "Batch size", "Workers", "Pin memory", "Prefetch",
                  "Persistent", "Iterators"], rows,
                 caption=f"The data loaders and their settings{more} (Loop: the mode of the steps that waited for it; "
                         "Workers, Pin memory, Prefetch, Persistent: `num_workers`, `pin_memory`, `prefetch_factor`, "
                         "`persistent_workers`)")


def _short_path(where: Any) -> Any:
    """`file:line` as its last two path parts (`torch/train.py:16`): enough to find the loader, narrow enough for
    the table (the whole path of a job deep in a checkout widened it past the page)."""
    if not isinstance(where, str):
        return where
    parts = where.replace("\\", "/").split("/")
    return "…/" + "/".join(parts[-2:]) if len(parts) > 3 else where


def _timing(t: WaitHistogram) -> list[Any]:
    which = "training steps" if t.mode == "TRAIN" else "steps"
    text = (f"The following histogram shows how long the training loop waited for each batch ({t.count} "
            f"waits during {which}). The median wait was {num(t.p50, 4)} s, the 95th percentile "
            f"{num(t.p95, 4)} s, the 25th percentile {num(t.p25, 4)} s and the longest "
            f"{num(t.max, 4)} s.")
    chart = charts.histogram("Waiting for data", "Wait for a batch in s", [("Waits for a batch", t.probs,
                                                                          t.binedges)],
                             y_label="Share of waits")
    return [Paragraph(text), Chart(chart, caption="Time the training loop waited for each batch")]
