"""Live evaluation: each snapshot and framework event of a run is handed to the rules exactly once, as it
appears in the store, so a run followed while it goes on ends with the same results as a batch evaluation
of the finished run. Cost per evaluation follows the new data, not the history."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallwatch.analyze.judge.feed import node_frame
from stallwatch.analyze.rules.base import Chunk, Rule, RuleResult
from stallwatch.records import framework_schema
from stallwatch.store.stacks import dumps_of

# A framework event is written when its step ends and reaches the store up to a flush interval later, and a
# segment compacts parts already read: only files not read before are read, and the events handed out in this
# window are recognised by their identity when they come again.
EVENT_RETENTION_US = 600 * 1_000_000


class LiveFeed:
    """`next()` returns the data new since the last call, as a Chunk; `next(final=True)` the last one."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self._last_ts: dict[str, int] = {}
        self._floor: int | None = None  # events starting before this were all handed out
        self._newest = 0
        self._seen_keys = np.empty(0, np.int64)  # identities of the events handed out inside the window
        self._seen_starts = np.empty(0, np.int64)
        self._read_files: set[str] = set()  # framework files read already (files never change once written)

    def skip_existing(self) -> LiveFeed:
        """Hand out only events stored from now on (a viewer joining a long run does not read its history)."""
        self._read_files = self.run.framework_files()
        self._floor = self.run.time_range()[1]
        return self

    def new_events(self) -> pa.Table:
        """The framework events new since the last call, each once."""
        return self._new_events()

    def next(self, final: bool = False) -> Chunk:
        run = self.run
        info = dict(run.info)
        nodes = info.get("nodes", {})
        system = {}
        for node in run.nodes:
            last = self._last_ts.get(node)
            frame = node_frame(node, run.system_wide(node, start_us=None if last is None else last + 1),
                               nodes.get(node))
            if len(frame):
                self._last_ts[node] = int(frame.timestamps[-1])
            system[node] = frame
        info["operators"] = run.operators()
        info["stacks"] = dumps_of(run)  # few files, read again each time: the Hang rule asks for them as it fires
        return Chunk(system, self._new_events(), info, final=final)

    def _new_events(self) -> pa.Table:
        # Listed before reading: every file listed here is read now (or was before), so none is missed; a file
        # that appears in between is read now and again next time, and identities drop its repeats.
        listed = self.run.framework_files()
        events = self.run.framework(start_us=self._floor, skip_files=self._read_files)
        self._read_files = listed
        if self._floor is not None and events.num_rows:
            events = events.filter(pc.greater_equal(events["start_us"], self._floor))
        if events.num_rows == 0:
            return framework_schema().empty_table()
        starts = events["start_us"].to_numpy()
        keys = _identities(events)
        fresh = ~np.isin(keys, self._seen_keys)
        newest = max(int(starts.max()), self._newest)
        self._newest = newest
        floor = newest - EVENT_RETENTION_US
        # Only events inside the retention window can be read again: identities are kept for those alone.
        add = fresh & (starts >= floor)
        keep = self._seen_starts >= floor
        self._seen_keys = np.concatenate([self._seen_keys[keep], keys[add]])
        self._seen_starts = np.concatenate([self._seen_starts[keep], starts[add]])
        self._floor = floor if self._floor is None else max(self._floor, floor)
        return events if fresh.all() else events.filter(pa.array(fresh))


def _identities(events: pa.Table) -> np.ndarray:
    """A 64-bit identity per event (rank, pid, step, start, end, and the kind's and name's lengths, mixed):
    the same event read again has the same one."""
    def col(name: str) -> np.ndarray:
        return events[name].to_numpy(zero_copy_only=False).astype(np.uint64)

    step = np.nan_to_num(events["step"].to_numpy(zero_copy_only=False).astype(np.float64), nan=-1).astype(np.int64)
    kind_len = pc.utf8_length(events["kind"].cast(pa.string())).to_numpy(zero_copy_only=False).astype(np.uint64)
    name_len = pc.utf8_length(events["name"].cast(pa.string())).to_numpy(zero_copy_only=False).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = col("start_us") * np.uint64(0x9E3779B97F4A7C15)
        for part, mult in ((col("end_us"), 0xC2B2AE3D27D4EB4F), (col("rank"), 0x165667B19E3779F9),
                           (col("pid"), 0x27D4EB2F165667C5), (step.astype(np.uint64), 0x85EBCA77C2B2AE63),
                           (kind_len * np.uint64(131) + name_len, 0xFF51AFD7ED558CCD)):
            h ^= part * np.uint64(mult)
            h = (h << np.uint64(31)) | (h >> np.uint64(33))
    return h.view(np.int64)


class LiveEvaluation:
    """The rules, kept between evaluations; `evaluate(chunk)` gives every rule the new data and returns
    the results so far. A rule that fails is reported as an error and left out of later evaluations."""

    def __init__(self, rule_classes: list[type[Rule]], params: dict[str, dict[str, Any]] | None = None) -> None:
        params = params or {}
        self.rules = [cls(**params.get(cls.name, {})) for cls in rule_classes]
        self._failed: dict[str, RuleResult] = {}

    def evaluate(self, chunk: Chunk) -> list[RuleResult]:
        from stallwatch.analyze.judge.runner import failed_result

        results = []
        for rule in self.rules:
            if rule.name in self._failed:
                results.append(self._failed[rule.name])
                continue
            try:
                rule.update(chunk)
                results.append(rule.result())
            except Exception as exc:
                self._failed[rule.name] = failed_result(rule, exc)
                results.append(self._failed[rule.name])
        return results


def run_finished(run: Any) -> bool:
    """Every node of the run has ended (its sampler wrote its last record): the store's one decision."""
    return bool(run.finished())


def follow(run: Any, rule_classes: list[type[Rule]], params: dict[str, dict[str, Any]] | None, *,
           every_s: float, finished: Any = None, on_results: Any = None, sleep: Any = None) -> list[RuleResult]:
    """Evaluate the rules on new data every `every_s` seconds until `finished()` (default: every node of the
    run has ended), then once more on the rest; `on_results(results, final)` after each evaluation."""
    import time

    finished = finished or (lambda: run_finished(run))
    sleep = sleep or time.sleep
    feed, live = LiveFeed(run), LiveEvaluation(rule_classes, params)
    while True:
        done = bool(finished())
        results = live.evaluate(feed.next(final=done))
        if on_results is not None:
            on_results(results, done)
        if done:
            return results
        sleep(every_s)
