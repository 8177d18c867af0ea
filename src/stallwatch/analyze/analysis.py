"""One façade over a run's analyses, in the spirit of Holistic Trace Analysis's `TraceAnalysis`: the report,
the terminal summary, `stallwatch info`, the notebook views and the dashboard all ask a `RunAnalysis`, which
reads the store once per question, computes in the analysis modules (one analysis each) and hands back typed
results. Renderers only render what it returns. Its whole-run figures come from one source chosen when it is
built (`sources.py`: every event, or the per-minute rollups), which its methods delegate to without asking which.

    from stallwatch.analyze import RunAnalysis
    analysis = RunAnalysis("stallwatch-runs/<run-id>")
    analysis.findings.verdict          # what to fix first
    analysis.summary.fate              # how the job ended
    analysis.rule("StepOutlier")       # a rule's typed result
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from functools import cached_property, partial
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze import captures as _captures
from stallwatch.analyze import compare as _compare
from stallwatch.analyze import cost as _cost
from stallwatch.analyze import finding_marks as _finding_marks
from stallwatch.analyze import findings as _findings
from stallwatch.analyze import heatmap as _heatmap
from stallwatch.analyze import job_usage as _job_usage
from stallwatch.analyze import loss as _loss
from stallwatch.analyze import memory_window as _memory_window
from stallwatch.analyze import node_series as _node_series
from stallwatch.analyze import node_tasks as _node_tasks
from stallwatch.analyze import nodes as _nodes
from stallwatch.analyze import overhead as _overhead
from stallwatch.analyze import price as _price
from stallwatch.analyze import python_profiles as _python_profiles
from stallwatch.analyze import rank_parts as _rank_parts
from stallwatch.analyze import rank_tracks as _rank_tracks
from stallwatch.analyze import ranks as _ranks
from stallwatch.analyze import sampled as _sampled
from stallwatch.analyze import sources as _sources
from stallwatch.analyze import step_digest as _step_digest
from stallwatch.analyze import step_window as _step_window
from stallwatch.analyze import steps as _steps
from stallwatch.analyze import summary as _summary
from stallwatch.analyze import timeline as _timeline
from stallwatch.analyze.collectives import DDP_EVENT, GradientSync, gradient_sync
from stallwatch.analyze.engine import Engine, on_run, open_engine
from stallwatch.analyze.frames import NodeFrame, interval_changes, node_frame
from stallwatch.analyze.framework_frame import FrameworkColumns
from stallwatch.analyze.results import NOT_APPLICABLE, RuleResult
from stallwatch.analyze.rules.base import Rule
from stallwatch.analyze.series import Marker, Panel, Span
from stallwatch.analyze.sources import BUCKETS_ONLY
from stallwatch.analyze.usage import UsageStat
from stallwatch.config import ProfilerConfig
from stallwatch.records import COLLECTIVE, COLUMN_SEP, DATA_WAIT, DDP_SYNC, LOOP, LOSS, OVERHEAD, STEP, TRAIN, UNTIMED
from stallwatch.store import run_files
from stallwatch.store.node_record import NodeRecord, run_finished
from stallwatch.store.reader import Run, open_run
from stallwatch.store.rollup_codec import SYSTEM_LEVELS_US
from stallwatch.store.rollups import RunRollups
from stallwatch.store.stacks import StackDump, dumps_of

SYSTEM_CACHE_BYTES = 256 * 2**20  # nodes' snapshots kept in memory (least recently used dropped): a day of a
# 16-core, 8-GPU node at 500 ms is ≈ 70 MB, so a fleet's report holds a few nodes, a small run all of them
MAX_DRAWN_NODES = 16  # per-node charts (step histograms, heatmaps) drawn at most; the tables list every node


class RunAnalysis:
    """One run, read lazily and once. Rule results are the stored ones when the run has finished and holds
    every rule asked for; otherwise the rules are evaluated here (built-ins, plus `rules` the caller names —
    a run directory never makes stallwatch load code)."""

    def __init__(self, run: Run | str, *, rule_results: Sequence[RuleResult] | None = None,
                 rules: Sequence[type[Rule]] | None = None, params: dict[str, dict[str, Any]] | None = None,
                 price_per_hour: float | None = None, baseline: RunAnalysis | None = None,
                 overview_from_rollups: bool = False, engine: str | Engine | None = None) -> None:
        """`price_per_hour`: what a node costs per hour (else the run's config's, if any): enables `cost`;
        `baseline`: a run to compare this one with (`comparison`); `overview_from_rollups`: the summary, phase
        shares, utilization, whole-run charts and totals from the rollups (the dashboard: a day of eight nodes
        opens in a second), not from every sample and event (the report); `engine`: where the per-node and
        per-slice work runs — "local" (default, this process), "dask" (a local Dask cluster),
        "dask=SCHEDULER_ADDRESS" or an open `analyze.engine` Engine (see `close()`)."""
        self.run = open_run(run) if isinstance(run, str) else run
        self._price = price_per_hour
        self.baseline = baseline
        self._given = list(rule_results) if rule_results is not None else None
        self._handed: Sequence[RuleResult] | None = rule_results
        self._extra_rules = list(rules or [])
        self._params = params or {}
        self._system: OrderedDict[str, tuple[frozenset[str] | None, NodeFrame]] = OrderedDict()
        self.overview_from_rollups = overview_from_rollups
        self._source = _sources.open_source(self, from_rollups=overview_from_rollups)  # chosen once, asked blindly
        self._engine_spec = engine
        self._opened: Engine | None = None
        self.rules_progress: Callable[[int], None] | None = None  # (slices done) while the rules are evaluated

    @property
    def engine(self) -> Engine:
        """The engine, opened on first use (a Dask cluster starts then): EngineError when it cannot be."""
        if self._opened is None:
            self._opened = open_engine(self._engine_spec)
        return self._opened

    def close(self) -> None:
        """Close the engine if this analysis opened it (an Engine passed in is the caller's to close)."""
        if self._opened is not None and self._opened is not self._engine_spec:
            self._opened.close()
        self._opened = None

    def __enter__(self) -> RunAnalysis:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the run as recorded ------------------------------------------------------------------------------
    @cached_property
    def info(self) -> dict[str, Any]:
        return dict(self.run.info)

    @cached_property
    def nodes(self) -> list[str]:
        return list(self.run.nodes)

    @cached_property
    def ranks(self) -> dict[str, list[str]]:
        return self.run.ranks()

    @cached_property
    def node_records(self) -> dict[str, NodeRecord]:
        """Each node's record (`nodes/<node>.json`), typed: cores, memory, GPUs, start/end, exit, intervals."""
        return self.run.node_records()

    def node_record(self, node: str) -> NodeRecord:
        """The node's record; an empty one (only its name) for a node with data and no record."""
        return self.node_records.get(node) or NodeRecord(node)

    @cached_property
    def has_gpus(self) -> bool:
        """Some node recorded a GPU: its steps' phases are then host time (CUDA runs asynchronously)."""
        return any(rec.has_gpus for rec in self.node_records.values())

    def node_info(self, node: str) -> dict[str, Any]:
        """The node's record as its JSON fields, for the frames the rules read (`NodeFrame.info`); elsewhere
        read `node_record`."""
        rec = self.node_records.get(node)
        return rec.to_json() if rec is not None else {}

    @cached_property
    def config(self) -> ProfilerConfig:
        """The configuration the run was recorded with (defaults when it has none or an invalid one)."""
        return run_files.config_or_default(self.run.location)

    @cached_property
    def recorded_custom_rules(self) -> list[str]:
        """Custom rules the run was recorded with: named, never loaded from here (re-run them with
        `stallwatch rules RUN --custom-rule SPEC`)."""
        return list(self.config.custom_rules)

    # -- data, read once ----------------------------------------------------------------------------------
    def system(self, node: str, metrics: Iterable[str] | None = None) -> NodeFrame:
        """One node's snapshots as a time-ordered NodeFrame with only the `metrics` asked for (all when None).
        Each node is read once for the union of what is asked: a later request for metrics already read is
        served from memory."""
        wanted = None if metrics is None else frozenset(metrics)
        have = self._system.get(node)
        if have is not None and (have[0] is None or (wanted is not None and wanted <= have[0])):
            self._system.move_to_end(node)
            return _subset(have[1], wanted)
        read = wanted if have is None or wanted is None or have[0] is None else wanted | have[0]
        frame = node_frame(node, self.run.system_wide(node, metrics=read), self.node_info(node))
        self._system[node] = (read, frame)
        self._system.move_to_end(node)
        while len(self._system) > 1 and sum(_nbytes(f) for _, f in self._system.values()) > SYSTEM_CACHE_BYTES:
            self._system.popitem(last=False)  # the least recently used node: read again if asked again
        return _subset(frame, wanted)

    def system_in_memory(self, node: str) -> bool:
        """The node's snapshots are held already (a zoom then slices them rather than reading its range)."""
        return node in self._system

    @cached_property
    def step_events(self) -> pa.Table:
        """The run's step events (node, rank, kind, mode, step, start_us, end_us), without decoding the other
        events' columns (a long multi-node run has tens of millions of events, a fifth of them steps)."""
        return self.run.framework(kinds={STEP}, fields=("kind", "mode", "step", "start_us", "end_us"))

    @cached_property
    def rollups(self) -> RunRollups:
        """The run's rollups (stored, or rebuilt from its segments and cached where the run is writable)."""
        return RunRollups(self.run)

    @cached_property
    def framework_rollup(self) -> pa.Table:
        """Every rank's per-minute framework rollup (rollup_codec.FRAMEWORK_SCHEMA + node, rank)."""
        return self.rollups.framework()

    def system_rollup(self, node: str, level_us: int = SYSTEM_LEVELS_US[0],
                      metrics: frozenset[str] | None = None) -> pa.Table:
        """One node's system rollup rows at `level_us` over the whole run, of `metrics`' series only when given
        (`BUCKETS_ONLY`: counts, spans and gaps); each combined once, however often the overview asks."""
        cache: dict[tuple[str, int, frozenset[str] | None], pa.Table] = self.__dict__.setdefault("_rollups", {})
        key = (node, level_us, metrics)
        if key not in cache:
            cache[key] = self.rollups.system(node, level_us, metrics).rows
        return cache[key]

    @cached_property
    def steps(self) -> FrameworkColumns:
        """The step events as numpy columns, decoded once for every analysis that needs them."""
        return FrameworkColumns(self.step_events)

    @cached_property
    def data_waits(self) -> FrameworkColumns:
        """The data-wait events (the loop waiting for its next batch), decoded once."""
        return FrameworkColumns(self.run.framework(kinds={DATA_WAIT},
                                                   fields=("kind", "mode", "step", "start_us", "end_us")))

    @cached_property
    def operators(self) -> pa.Table:
        """Per-operator totals of detailed-profiling windows (`operators_schema()`)."""
        return self.run.operators()

    def profiles(self, layer: str | None = None) -> list[dict[str, Any]]:
        return self.run.profiles(layer)

    @cached_property
    def sample_interval_ms(self) -> dict[str, float]:
        """Each node's sampling interval (its record's; else the spacing of its snapshots)."""
        out = {}
        for node in self.nodes:
            known = NodeFrame(node, _NO_TIMES, {}, self.node_info(node)).sample_interval_ms
            out[node] = known or self._source.measured_interval_ms(node)
        return out

    # -- the rules ----------------------------------------------------------------------------------------
    @cached_property
    def rule_results(self) -> list[RuleResult]:
        """Every rule's typed result: the built-ins in the report's order, then custom and imported ones. A rule
        without framework data says why when the job ended before its first step (not "was it run under …")."""
        results = self._rule_results()
        why = self.summary.ended_before_first_step if any(_no_framework(r) for r in results) else None
        if why is None:
            return results
        return [dataclasses.replace(r, message=f"{NO_FRAMEWORK}: {why}") if _no_framework(r) else r for r in results]

    def _rule_results(self) -> list[RuleResult]:
        from stallwatch.analyze.rules.registry import builtin_rules

        if self._given is not None:
            return list(self._given)
        wanted = builtin_rules() + [r for r in self._extra_rules if r not in builtin_rules()]
        names = [r.name for r in wanted]
        stored = self.stored_rule_results()
        if stored is not None and all(n in stored for n in names) and not self._params:
            return _ordered(stored, names)
        evaluated = self.evaluate_rules(wanted)
        # results this evaluation did not make stay listed (another tool's, imported with the run)
        others = {n: r for n, r in (stored or {}).items() if n not in names and r.imported}
        return evaluated + _ordered(others, [])

    def use_rule_results(self, results: Sequence[RuleResult] | None) -> None:
        """Take rule results evaluated elsewhere (`stallwatch run`'s last live evaluation), so that the summary,
        the findings and the report of one run share them; None leaves them to this analysis. Only before
        anything has read the rules (RuntimeError after)."""
        if results is self._handed:
            return
        if "rule_results" in self.__dict__:
            raise RuntimeError("the rules' results were read already: hand them over before")
        self._handed = results
        self._given = list(results) if results is not None else None

    def evaluate_rules(self, rule_classes: Sequence[type[Rule]]) -> list[RuleResult]:
        """Evaluate `rule_classes` over the whole run (an hour at a time), with the run's own rule parameters (its
        `--param`s) overridden by this analysis's."""
        from stallwatch.analyze.judge.by_node import evaluate_run
        from stallwatch.analyze.judge.params import run_rule_params
        from stallwatch.analyze.rules.registry import builtin_rules

        known = builtin_rules() + [r for r in [*self._extra_rules, *rule_classes] if r not in builtin_rules()]
        params = run_rule_params(self.run.location, known, self._params)  # the run's own, unless given here
        return evaluate_run(self.run, rule_classes, params, engine=self.engine, progress=self.rules_progress)

    def stored_rule_results(self) -> dict[str, RuleResult] | None:
        """rules/*.json as `stallwatch run` or `stallwatch rules` wrote them, once every node has finished (a
        running run's stored results may be stale); None otherwise."""
        if not run_finished(self.node_records.values()):
            return None
        return {name: RuleResult.from_json(record, default_name=name)
                for name, record in run_files.read_rule_results(self.run.location).items()}

    @cached_property
    def rules_by_name(self) -> dict[str, RuleResult]:
        return {r.name: r for r in self.rule_results}

    def rule(self, name: str) -> RuleResult | None:
        return self.rules_by_name.get(name)

    # -- analyses -----------------------------------------------------------------------------------------
    @cached_property
    def summary(self) -> _summary.JobSummary:
        info = self.info
        records = {n: self.node_record(n) for n in self.nodes}
        data_end = max((r.end_us_from_data for r in records.values() if r.end_us_from_data is not None),
                       default=None)
        command = info.get("command")
        steps, loop = self._source.step_counts(), _sampled.extend_loop(self._source.loop_span(), self.untimed)
        timed_share = _sampled.timed_share(self.untimed, sum(len(r) for r in self.ranks.values()),
                                           loop.last_us - loop.first_us if loop is not None else 0)
        steps = _sampled.add_counts(steps, self.untimed)
        return _summary.JobSummary(
            run_id=str(info.get("run_id") or self.run.uri), uri=self.run.uri,
            command=[str(c) for c in command] if isinstance(command, list) else [],
            start_us=_int(info.get("start_us")),
            end_us=_int(info.get("end_us")) if run_finished(self.node_records.values()) else None,
            data_end_us=data_end if data_end is not None else _int(info.get("end_us")), nodes=self.nodes,
            ranks=self.ranks, steps=steps, loop=loop,
            sample_interval_ms=self.sample_interval_ms,
            fate=_summary.job_fate(records, self.config.stop_training), notes=self.notes,
            loop_undetermined=self.loop_shapes.undetermined, timed_share=timed_share)

    @cached_property
    def notes(self) -> list[str]:
        """What the run says about its own measurements (lost events, loops whose steps could not be found)."""
        timed = self._source.step_counts() if self.untimed else {}
        notes = self.losses.notes() + self.loop_shapes.notes() + _overhead.notes(self.hook_costs) + \
            _sampled.notes(self.untimed, timed)
        return notes + _loss.damaged_notes(self.run.unreadable_files)  # after the reads above: what they met

    @cached_property
    def untimed(self) -> list[_sampled.Untimed]:
        """Per rank and mode, steps counted but not timed (sampled steps at high step rates)."""
        markers = self._markers
        return _sampled.untimed(markers.filter(pc.equal(markers["kind"], UNTIMED)))

    @cached_property
    def hook_costs(self) -> list[_overhead.HookCost]:
        """Per rank, what stallwatch's hooks cost its training process, as the process measured it."""
        markers = self._markers
        return _overhead.hook_costs(markers.filter(pc.equal(markers["kind"], OVERHEAD)))

    @cached_property
    def losses(self) -> _loss.Losses:
        """Framework events that were dropped and stretches without system snapshots, per node and rank."""
        markers = self._markers
        events = _loss.event_losses(markers.filter(pc.equal(markers["kind"], LOSS)))
        gaps = [g for node in self.nodes for g in self._source.sample_gaps(
            node, self.sample_interval_ms.get(node), interval_changes(self.node_info(node)))]
        return _loss.Losses(events, gaps)

    @cached_property
    def loop_shapes(self) -> _steps.LoopShapes:
        """How each rank's steps were delimited (DataLoader, marks, optimizer steps, forward/backward pairs)."""
        markers = self._markers
        return _steps.loop_shapes(markers.filter(pc.equal(markers["kind"], LOOP)))

    @cached_property
    def _markers(self) -> pa.Table:
        """The rare marker events (how steps were found, what was lost, what stallwatch cost), read in one pass over
        the run's files (kept verbatim in the rollups)."""
        return self._source.markers()

    @cached_property
    def findings(self) -> _findings.Findings:
        return _findings.build_findings(self.rule_results, self.summary,
                                       health=_findings.health_evidence(self.rules_by_name))

    def write_findings(self) -> str:
        """_findings.json into the run (through the store); its path in the run."""
        cost = self.cost
        return run_files.write_findings(self.run.location, {**self.findings.to_json(),
                                                            "cost": cost.to_json() if cost is not None else None})

    @cached_property
    def gradient_sync(self) -> list[GradientSync]:
        """Per rank, DDP's gradient all-reduce per step: its time, the part overlapping backward, the exposed
        part (DDP's own sampled timing; empty for a job without DDP)."""
        samples = self.run.framework(kinds=[COLLECTIVE], fields=["name", "args"])
        samples = samples.filter(pc.equal(samples["name"].cast(pa.string()), DDP_EVENT))
        counts: dict[tuple[str, int], int] = {}
        if samples.num_rows:
            counts = {(s.node, s.rank): s.steps for s in self.step_stats() if s.mode == TRAIN}
        return gradient_sync(samples, counts)

    @cached_property
    def _exposed_syncs(self) -> dict[tuple[str, int], tuple[float, int]]:
        """Per rank, the host-timed exposed all-reduce (DDP_SYNC events): µs summed, and how many."""
        samples = self.run.framework(kinds=[COLLECTIVE], fields=["name", "start_us", "end_us"])
        return _rank_parts.exposed_per_step(samples.filter(pc.equal(samples["name"].cast(pa.string()), DDP_SYNC)))

    def rank_parts(self, mode: str = TRAIN) -> list[_rank_parts.RankParts]:
        """Per rank of `mode`, its mean step split into data wait, compute, exposed communication and the rest."""
        return _rank_parts.rank_parts(self.step_stats(), mode, self._exposed_syncs if mode == TRAIN else {},
                                      self.gradient_sync if mode == TRAIN else [])

    @cached_property
    def escalations(self) -> list[dict[str, Any]]:
        """The automatic captures firing rules asked for: rule, start_us/end_us, layers, evidence."""
        return run_files.read_escalations(self.run.location)

    @cached_property
    def python_functions(self) -> list[_python_profiles.WindowFunctions]:
        """Each Python-profiling window with its most expensive functions (from the summary stored with it)."""
        windows = self.profiles("python")
        return _python_profiles.window_functions(windows, self.run.functions()) if windows else []

    @cached_property
    def captures(self) -> list[_captures.Capture]:
        """The automatic captures with their fate: stored, lost (never written: the job ended first) or pending."""
        if not self.escalations:
            return []
        return _captures.capture_fates(self.escalations, self.profiles(),
                                       finished=run_finished(self.node_records.values()))

    @cached_property
    def phase_shares(self) -> dict[str, dict[str, float]]:
        """Per mode, each phase's share of step time, % (all ranks together)."""
        return self._source.phase_shares()

    @cached_property
    def usage_over_nodes(self) -> tuple[dict[str, float], dict[str, float]]:
        """Per utilization label (%): the mean of the nodes' means, and the highest max."""
        means: dict[str, list[float]] = {}
        peaks: dict[str, float] = {}
        for node in self.nodes:
            for stat in self.usage(node):
                if stat.unit == "%" and stat.count:
                    means.setdefault(stat.label, []).append(stat.mean)
                    peaks[stat.label] = max(peaks.get(stat.label, 0.0), stat.max)
        return {k: float(np.mean(v)) for k, v in means.items()}, peaks

    @cached_property
    def cost(self) -> _price.RunCost | None:
        """The run as money (total, per part, waiting) and right-sizing advice; None without a price."""
        price = self._price if self._price is not None else self.config.price_per_hour
        if price is None:
            return None
        mean, peak = self.usage_over_nodes
        return _price.run_cost(price, self.summary, self.findings, usage_mean=mean, usage_max=peak,
                               data_wait_pct=self.phase_shares.get(TRAIN, {}).get(DATA_WAIT))

    @cached_property
    def operators_per_step(self) -> dict[str, float]:
        """Self time per profiled step of each operator (`name [device]`), µs, over the detailed windows."""
        return _compare.operators_per_step(self.operators, self.profiles("detailed"))

    @cached_property
    def comparison_figures(self) -> _compare.RunFigures:
        """What a comparison with another run reads of this one."""
        return _compare.RunFigures(
            uri=self.run.uri, step_times=_compare.step_times(self.steps.table), phase_shares=self.phase_shares,
            utilization=_compare.utilization(self.usage_over_nodes[0]),
            findings={f.rule: f.title for f in self.findings.findings}, operators_us=self.operators_per_step,
            nodes=len(self.nodes), ranks=sum(len(v) for v in self.ranks.values()))

    def compare_to(self, baseline: RunAnalysis) -> _compare.Comparison:
        """This run against `baseline`: step times, phases, utilization, findings, operators."""
        return _compare.compare(baseline.comparison_figures, self.comparison_figures)

    @cached_property
    def comparison(self) -> _compare.Comparison | None:
        """This run against the baseline it was given; None without one."""
        return None if self.baseline is None else self.compare_to(self.baseline)

    def usage(self, node: str) -> list[UsageStat]:
        """The terminal's per-node utilization statistics (mean, p50, p95, max) of the usual metrics (from the
        finest rollup with `overview_from_rollups`: p50 / p95 then of 10 s means)."""
        return self._source.usage(node)

    def job_usage(self, node: str) -> _job_usage.JobUsage | None:
        """The job's own CPU (of the host's cores, in cores), RSS and loader workers beside the host's CPU."""
        return _job_usage.job_usage(node, self.usage(node), self.node_record(node).cpu_cores_logical)

    def usage_level_us(self, node: str) -> int:
        """The rollup level whose bucket means give the node's utilization percentiles: the finest with at most
        `USAGE_BUCKETS` buckets (10 s up to ~5 h, 1 min up to ~33 h, then 10 min); means and maxima are exact."""
        return _sources.usage_level_us(self.system_rollup(node, metrics=BUCKETS_ONLY).num_rows)

    @cached_property
    def node_steps(self) -> list[_steps.NodeStepSummary]:
        """Per node (with framework data), its step statistics, step counts and loop span: each node read an
        hour at a time on the engine, so memory holds one node-hour of events and the nodes' durations."""
        return self._map_nodes(with_stats=True)

    @cached_property
    def node_step_totals(self) -> list[_steps.NodeStepSummary]:
        """`node_steps` without the statistics (step events only) unless those were asked for already."""
        return self.node_steps if "node_steps" in self.__dict__ else self._map_nodes(with_stats=False)

    def _map_nodes(self, *, with_stats: bool) -> list[_steps.NodeStepSummary]:
        task = on_run(self.engine, self.run, _node_tasks.node_steps, _node_tasks.node_steps_task)
        return list(self.engine.map(partial(task, with_stats=with_stats), sorted(self.ranks)))

    def step_stats(self, node: str | None = None) -> list[_steps.StepStat]:
        """Per node, rank and mode: steps, p50/p95/max and the phases' shares of step time."""
        if node is not None and "node_steps" not in self.__dict__:
            stats = _node_tasks.node_steps(self.run, node).stats if node in self.ranks else []
        else:
            stats = [s for part in self.node_steps if node is None or part.node == node for s in part.stats]
        return _sampled.with_untimed(stats, self.untimed)

    @cached_property
    def loop_spans(self) -> dict[str, _steps.LoopSpan]:
        return {p.node: p.span for p in self.node_step_totals if p.span is not None}

    def step_histograms(self, modes: set[str], nodes: Iterable[str] | None = None) -> list[_steps.NodeSteps]:
        """Per node (of `nodes`, default all), its steps of `modes` binned (`steps.step_histograms`), read node
        by node."""
        wanted = None if nodes is None else set(nodes)
        if "_report_steps" in self.__dict__ and frozenset(modes) == self._step_modes:  # read with the stretches
            digests: Iterable[_step_digest.NodeStepDigest] = self._report_steps
        else:
            digests = self._step_digests(lambda node: _step_digest.DigestPlan(
                hist_modes=frozenset(modes) if wanted is None or node in wanted else frozenset()))
        return sorted((d.histogram for d in digests
                       if d.histogram is not None and (wanted is None or d.node in wanted)), key=lambda h: h.node)

    def timeline_panels(self, node_names: Iterable[str] | None = None) -> list[Panel]:
        """The timeline's panels, each node's snapshots read (or taken from the cache) one node at a time."""
        return _timeline.panels((n, self.system(n, _timeline.METRICS)) for n in (node_names or self.nodes))

    @cached_property
    def phase_spans(self) -> list[Span]:
        """Initialization, the training / evaluation stretches and finalization (`timeline.phase_spans`), merged
        node by node; a mode's stretches end at pauses of 10 typical steps (its steps' weighted median p50)."""
        _, loop = _steps.merge_step_summaries(self.node_step_totals)
        if loop is None:
            return []
        gaps = self._phase_gaps
        merged: dict[str, list[tuple[int, int]]] = {}
        for d in self._report_steps:
            for mode, parts in d.intervals.items():
                merged.setdefault(mode, []).extend(parts)
        return _timeline.spans_of_phases({m: (parts, gaps[m]) for m, parts in merged.items()}, loop.first_us,
                                         loop.last_us, _int(self.info.get("start_us")), _int(self.info.get("end_us")))

    @cached_property
    def _phase_gaps(self) -> dict[str, int]:
        """Per mode, the pause that ends a training stretch (`timeline.phase_gap_us` of its typical step)."""
        return {mode: _timeline.phase_gap_us(1000.0 * ms) for mode, ms in self._median_step_ms.items()
                if mode in _timeline.PHASE_LABELS}

    @cached_property
    def _step_modes(self) -> frozenset[str]:
        return frozenset(s.mode for s in self.step_stats() if s.steps)

    @cached_property
    def _report_steps(self) -> list[_step_digest.NodeStepDigest]:
        """What the report draws of every step — the histograms of every mode, the TRAIN rank × step matrix, the
        training stretches — in one read of each node, made by `phase_spans` (the report's timeline comes first);
        the histograms and the matrix use it when it is there, else read what they need on their own."""
        grid = self._step_grid(TRAIN)
        drawn = {n for n, _ in grid.rows} if grid is not None else set()
        return list(self._step_digests(lambda node: _step_digest.DigestPlan(
            hist_modes=self._step_modes, grid=grid if node in drawn else None, gaps_us=self._phase_gaps)))

    @cached_property
    def _median_step_ms(self) -> dict[str, float]:
        """Per mode (and "" for all modes), the typical step: the median of the ranks' median steps, each
        weighted by its step count (the exact median would need every step of the run at once)."""
        stats = [s for s in self.step_stats() if s.steps]
        out = {}
        for mode in {"", *(s.mode for s in stats)} if stats else ():
            mine = sorted((s.p50_ms, s.steps) for s in stats if not mode or s.mode == mode)
            counts = np.cumsum([n for _, n in mine])
            out[mode] = float(mine[int(np.searchsorted(counts, counts[-1] / 2.0))][0])
        return out

    def _step_digests(self, plan_of: Callable[[str], _step_digest.DigestPlan]) -> Iterator[_step_digest.NodeStepDigest]:
        """Each node's `step_digest` for its plan, on the engine, in node order."""
        items = [(node, plan) for node in sorted(self.ranks) if not (plan := plan_of(node)).empty]
        return self.engine.map(on_run(self.engine, self.run, _digest_local, _digest_task), items)

    @cached_property
    def flagged_spans(self) -> list[Span]:
        """Time ranges the rules flagged: bottleneck ranges and the GPU rules' windows."""
        rules = self.rules_by_name
        return _timeline.bottleneck_spans(rules, self.sample_interval_ms) + _timeline.window_spans(rules)

    @cached_property
    def flagged_markers(self) -> list[Marker]:
        """Moments the rules flagged: the slowest outlier steps (and older results' last flagged windows)."""
        rules = self.rules_by_name
        return _timeline.outlier_markers(rules) + _timeline.last_window_markers(rules)

    @cached_property
    def finding_marks(self) -> tuple[list[Span], list[Marker]]:
        """Where the top findings happened: their windows as spans, their steps as markers (steps only when the
        step events are read anyway: not from rollups)."""
        return _finding_marks.finding_marks(self.findings.findings, self._source.steps_for_marks())

    @cached_property
    def flag_totals(self) -> dict[str, int]:
        return _timeline.flag_totals(self.rules_by_name)

    def heatmaps(self, dimensions: tuple[str, ...] = _heatmap.DEFAULT_DIMENSIONS,
                 node_names: Iterable[str] | None = None) -> dict[str, Any]:
        names = list(node_names or self.nodes)
        rows = sum(len(_heatmap.row_columns(self._stored_series(n, _timeline.METRICS), dimensions)) for n in names)
        return _heatmap.node_heatmaps(((n, self.system(n, _timeline.METRICS)) for n in names), dimensions,
                                      rows_total=rows)

    def _stored_series(self, node: str, metrics: Iterable[str]) -> NodeFrame:
        """The node's stored series of `metrics` as a frame without snapshots: which devices it has, unread."""
        wanted = set(metrics)
        keys = [k for k in self.run.system_keys(node) if k.metric in wanted]
        return NodeFrame(node, _NO_TIMES, {k.column: _NO_VALUES for k in keys}, {})

    def rank_steps(self, mode: str = TRAIN) -> _ranks.RankSteps | None:
        """The rank × step matrices of step time and data wait for `mode` (None without such steps), summed
        node by node on a grid from every rank's first and last step number."""
        grid = self._step_grid(mode)
        if grid is None:
            return None
        drawn = {n for n, _ in grid.rows}
        total = _ranks.RankCells(grid)
        shared = mode == TRAIN and "_report_steps" in self.__dict__  # read with the stretches already
        digests: Iterable[_step_digest.NodeStepDigest] = self._report_steps if shared else \
            self._step_digests(lambda node: _step_digest.DigestPlan(grid=grid if node in drawn else None))
        for d in digests:
            if d.cells is not None:
                total.merge(d.cells)
        return total.result()

    def _step_grid(self, mode: str) -> _ranks.StepGrid | None:
        """The rank × step grid of `mode` from every rank's first and last step number."""
        ranges = {(p.node, rank): r for p in self.node_step_totals for (rank, m), r in p.step_ranges.items()
                  if m == mode}
        return _ranks.step_grid(ranges, mode=mode)

    def node_series(self, node: str, start_us: int | None = None, end_us: int | None = None,
                    buckets: int = 600) -> _node_series.NodeSeries:
        """One node's CPU, cores, GPUs, memory, I/O wait and network in [start_us, end_us), min / max / mean per
        time bucket (the node is read once; zooming slices what is in memory). With `overview_from_rollups`, a
        range wide enough for a rollup level is drawn from the coarsest level that fills `buckets`; a narrower one
        (zooming in) reads the snapshots at full resolution."""
        return _node_series.without_quiet_buckets(self._source.node_series(node, start_us, end_us, buckets),
                                                  interval_changes(self.node_info(node)))

    def last_sample_us(self, node: str) -> int | None:
        """When the node's latest snapshot was taken (None without snapshots)."""
        return self._source.last_sample_us(node)

    def progress(self, points: int = 200) -> dict[str, list[Any]]:
        """Training steps done over time (all ranks), at most `points` points."""
        if not self.untimed:
            return self._source.progress(points)
        # sampled steps: the counted ones too, when their stretch ended
        markers = self._markers
        ends, counts = _sampled.steps_at(markers.filter(pc.equal(markers["kind"], UNTIMED)))
        t, n = self._source.timed_step_ends()
        return _sampled.progress(np.concatenate([t, ends]).astype(np.int64),
                                 np.concatenate([n, counts]).astype(np.int64), points)

    @property
    def latest_step(self) -> int | None:
        """The highest step number recorded (None without steps)."""
        return self._source.latest_step()

    def events_window(self, node: str, start_us: int | None, end_us: int | None,
                      limit: int = 4000) -> _step_window.EventsWindow:
        """The node's steps and phases overlapping [start_us, end_us): totals per kind, and the events when few
        (over the whole run, with `overview_from_rollups`, the totals come from the rollups when they are many)."""
        whole = self._source.run_totals(node, limit) if start_us is None and end_us is None else None
        if whole is not None:
            return whole
        events = self.run.framework(start_us, end_us, kinds=_step_window.EVENT_KINDS, nodes=[node],
                                    fields=("kind", "name", "mode", "step", "start_us", "end_us"))
        return _step_window.events_window(events, start_us, end_us, limit)

    def rank_tracks(self, node: str, start_us: int | None, end_us: int | None,
                    buckets: int = _rank_tracks.BUCKETS) -> _rank_tracks.RankTracks:
        """The node's ranks as tracks of phase blocks in [start_us, end_us) (per bucket when many). Over the
        whole of a run whose rollups count more than `rank_tracks.MAX_READ` events, nothing is read (`zoom_in`):
        what a request costs stays bounded however long the run."""
        if start_us is None and end_us is None and \
                self._source.run_totals(node, _rank_tracks.MAX_READ) is not None:
            return _rank_tracks.RankTracks(node, None, None, [], zoom_in=True)
        events = self.run.framework(start_us, end_us, kinds=_rank_tracks.READ_KINDS, nodes=[node],
                                    fields=("kind", "name", "mode", "step", "start_us", "end_us"))
        return _rank_tracks.rank_tracks(node, events, start_us, end_us, buckets=buckets)

    def memory_window(self, node: str, start_us: int | None, end_us: int | None) -> _memory_window.MemoryWindow:
        """The node's ranks' recorded memory (RSS, CUDA allocator) in [start_us, end_us), bounded as `rank_tracks`
        (an empty answer over the whole of a run too long to read)."""
        if start_us is None and end_us is None and \
                self._source.run_totals(node, _rank_tracks.MAX_READ) is not None:
            return _memory_window.MemoryWindow()
        table = self.run.framework(start_us, end_us, kinds=[STEP], nodes=[node],
                                   fields=("kind", "mode", "step", "start_us", "end_us", "args"))
        return _memory_window.memory_window(table)

    def latest_stacks(self) -> list[StackDump]:
        """Per process of each rank, its newest stack dump (the Hang rule asks for them when a rank stops)."""
        newest: dict[tuple[str, int, int], StackDump] = {}
        for d in dumps_of(self.run):  # oldest first
            newest[(d.node, d.rank, d.pid)] = d
        return sorted(newest.values(), key=lambda d: (d.node, d.rank, d.pid))

    def recent_steps(self, node: str, last: int = 30) -> list[_step_window.StepBreakdown]:
        """The node's first rank's last `last` steps, each split into its phases."""
        frm = self._source.recent_steps_from(node, last * max(len(self.ranks.get(node, [])), 1))
        if frm is None:
            return []
        events = self.run.framework(frm, None, kinds=_step_window.EVENT_KINDS, nodes=[node],
                                    fields=("kind", "name", "mode", "step", "start_us", "end_us"))
        return _step_window.step_breakdown(events, last)

    def drawn_nodes(self, among: Iterable[str] | None = None, limit: int | None = None) -> list[str]:
        """The nodes a per-node chart draws (of `among`, default all): the nodes the findings name, most time at
        stake first, then those that stand out in the node comparison, then the rest by name; at most `limit`
        (default `MAX_DRAWN_NODES`), so a fleet's report stays readable and does not grow with the nodes (its
        tables list them all)."""
        pool = list(among) if among is not None else list(self.nodes)
        named = [n for f in self.findings.findings
                 for n in (*f.where.nodes, *(r.split("/", 1)[0] for r in f.where.ranks))]
        odd = [o.node for o in self.node_comparison.oddities] if len(self.nodes) > 1 else []
        order = list(dict.fromkeys([*named, *odd, *sorted(pool)]))
        return [n for n in order if n in set(pool)][:MAX_DRAWN_NODES if limit is None else limit]

    @cached_property
    def node_comparison(self) -> _nodes.NodeComparison:
        return _nodes.compare_nodes(self.rules_by_name, self.nodes)

    @cached_property
    def profiling_cost(self) -> _cost.ProfilingCost:
        windows = list(enumerate(self.run.profiles("detailed")))
        costs: list[tuple[int, _cost.WindowCost]] = []
        if windows:
            mine = lambda node: _step_digest.DigestPlan(windows=[(i, w) for i, w in windows  # noqa: E731
                                                                 if str(w.get("node")) == node])
            costs = sorted((c for d in self._step_digests(mine) for c in d.windows), key=lambda c: c[0])
        per_mode, _ = _steps.merge_step_summaries(self.node_step_totals)
        return _cost.profiling_cost({n: self.node_record(n) for n in self.nodes}, self.run.files(),
                                    steps=sum(per_mode.values()), median_step_ms=self._median_step_ms.get(""),
                                    windows=[c for _, c in costs])


_NO_TIMES = np.empty(0, np.int64)
_NO_VALUES = np.empty(0, np.float32)


NO_FRAMEWORK = "no framework data"  # how a rule's "not applicable" begins when the run recorded no framework events


def _no_framework(r: RuleResult) -> bool:
    return r.status == NOT_APPLICABLE and r.message.startswith(NO_FRAMEWORK)


def _ordered(results: dict[str, RuleResult], names: list[str]) -> list[RuleResult]:
    out = [results[n] for n in names if n in results]
    out += [r for n, r in sorted(results.items()) if n not in names]
    return out


def _nbytes(frame: NodeFrame) -> int:
    return int(frame.timestamps.nbytes) + sum(int(v.nbytes) for v in frame.columns.values())


def _subset(frame: NodeFrame, metrics: frozenset[str] | None) -> NodeFrame:
    """The frame with only the columns of `metrics` (the same arrays, not copies)."""
    if metrics is None:
        return frame
    cols = {c: v for c, v in frame.columns.items() if c.partition(COLUMN_SEP)[2] in metrics}
    return NodeFrame(frame.node, frame.timestamps, cols, frame.info)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _digest_local(run: Run, item: tuple[str, _step_digest.DigestPlan]) -> _step_digest.NodeStepDigest:
    """In this process: one node's step digest from the open run."""
    return _step_digest.node_step_digest(run, *item)


def _digest_task(uri: str, item: tuple[str, _step_digest.DigestPlan]) -> _step_digest.NodeStepDigest:
    """On a worker: one node's step digest (`item`: the node and its plan)."""
    return _step_digest.node_step_digest_task(uri, *item)
