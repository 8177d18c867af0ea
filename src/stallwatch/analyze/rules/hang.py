"""Hang: a rank made no step progress for much longer than its steps take — `factor` × the median of its recent
steps, and at least `floor_s`. Time passing is read from the data: the sampler's snapshots go on every interval
while a rank is stuck, so "now" is the newest timestamp seen (at the end of a run, its end), never the wall
clock, and a finished run evaluated in one batch says what was said live. While the run goes on, a rank's last
progress may still be on its way to the store (one flush interval): live, a stop counts only past that margin.

Which phase each stopped rank is in, and which rank is behind, come from the Python stacks every process sends
when asked (`during_run` raises `dump_stacks` as this rule fires; store.stacks): a rank inside a collective
waits there; a stopped rank that is not in it never reached it — the culprit. Without stacks, a rank that
stopped while the others go on, or whose last step came before theirs, is named behind. A slow job that keeps
stepping never fires: its steps set the limit."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from stallwatch.analyze.rules.base import Chunk, ParameterError, Rule, RuleResult
from stallwatch.analyze.framework_frame import new_events
from stallwatch.analyze.stack_phase import BACKWARD, COLLECTIVE, UNKNOWN, Phase, frame_text, phase_of
from stallwatch.records import STEP, UNTIMED
from stallwatch.store.stacks import StackDump
from stallwatch.timeutil import format_duration

US = 1_000_000
RECENT_STEPS = 50  # the median of this many recent steps is a rank's typical step
MAX_STALLS = 20  # stalls kept in Details (all are counted)
LIVE_MARGIN_S = 1.5  # besides the flush interval: the sender's interval and the sampler's own wake-ups
SHOWN_FRAMES = 30  # of a stopped rank's main thread, in Details (the whole dump is in stacks/)


@dataclass(frozen=True)
class Stall:
    """One stretch without progress on one rank longer than its limit; `until_us` None: still stopped."""

    node: str
    rank: int
    since_us: int
    until_us: int | None
    seconds: float
    limit_s: float


@dataclass(frozen=True)
class RankProgress:
    """A rank's progress as the rule last saw it, and what its stacks say when it is stopped."""

    node: str
    rank: int
    steps: int
    last_step: int | None
    last_progress_us: int | None
    median_step_s: float | None
    limit_s: float | None
    idle_s: float  # since its last progress, at the evaluation
    stopped: bool
    phase: str = UNKNOWN
    phase_text: str = ""
    call: str = ""  # the collective (or torch function) it is in
    where: str = ""  # the job's own innermost line
    stacks: list[str] = field(default_factory=list)  # stored dumps of this stop (stacks/…)
    main_stack: list[str] = field(default_factory=list)  # its main thread, innermost last ("file:line in fn")
    threads: int = 0


@dataclass(frozen=True)
class HangDetails:
    """The rule's Details (`to_json` / `from_json`): per rank (`node/rank`), the stops, the culprit."""

    factor: float
    floor_s: float
    now_us: int | None
    ranks: dict[str, RankProgress]
    stopped: list[str]  # node/rank of the ranks stopped now
    behind: list[str]  # the culprits
    behind_reason: str
    waiting_in: str  # the collective the others wait in ("" when none)
    stalls: list[Stall]
    stalls_total: int
    stacks_wanted: list[str]  # stopped ranks without stacks of this stop yet (live asks for them)
    time_at_stake_s: float
    title: str | None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ranks_fired"] = list(self.stopped) or sorted({f"{s.node}/{s.rank}" for s in self.stalls})
        out["nodes"] = sorted({k.rpartition("/")[0] for k in out["ranks_fired"]})
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> HangDetails:
        """The Details of a result (KeyError/TypeError on another shape: the findings fall back)."""
        return HangDetails(
            factor=float(d["factor"]), floor_s=float(d["floor_s"]), now_us=d.get("now_us"),
            ranks={k: RankProgress(**v) for k, v in d["ranks"].items()},
            stopped=[str(x) for x in d["stopped"]], behind=[str(x) for x in d["behind"]],
            behind_reason=str(d.get("behind_reason") or ""), waiting_in=str(d.get("waiting_in") or ""),
            stalls=[Stall(**s) for s in d["stalls"]], stalls_total=int(d["stalls_total"]),
            stacks_wanted=[str(x) for x in d.get("stacks_wanted") or []],
            time_at_stake_s=float(d["time_at_stake_s"]), title=d.get("title"))


class _Rank:
    __slots__ = ("durs", "last_step", "last_us", "node", "pid", "rank", "sampled", "stalled_s", "stalls",
                 "stalls_total", "steps")

    def __init__(self, node: str, rank: int) -> None:
        self.node, self.rank, self.pid = node, rank, 0
        self.steps = 0
        self.last_us: int | None = None
        self.last_step: int | None = None
        self.durs: deque[int] = deque(maxlen=RECENT_STEPS)
        self.stalls: list[Stall] = []
        self.stalls_total = 0
        self.stalled_s = 0.0
        self.sampled = False  # some of its steps were counted, not timed: its timed steps are not all its steps

    def median_s(self) -> float | None:
        return float(np.median(np.fromiter(self.durs, np.int64))) / US if self.durs else None


class Hang(Rule):
    """Per rank: each gap between progress (a step's end, or sampled steps' marker) longer than
    max(`floor_s`, `factor` × median of the last RECENT_STEPS steps) is a stall; one still open at the evaluation is
    a stopped rank. A rank is judged from its first step on (before it, MaxInitializationTime judges)."""

    name = "Hang"
    metrics = ()  # of snapshots, only their timestamps: the clock
    description = ("Checks that every rank keeps making progress. The rule triggers when a rank makes no step "
                   "progress for much longer than its steps take (factor times the median of its recent steps, "
                   "and at least the floor), names the phase each stopped rank is in from its Python stacks, kept "
                   "in the run, and the rank that is behind: the one that never reached the collective the others "
                   "wait in. A job that is slow but keeps stepping never triggers it.")
    recommendation = ("A rank stopped making progress. Read the stacks of the rank named behind: a data loader that "
                      "stalls, a deadlock, a branch only one rank takes, or uneven data that ends one rank's loop "
                      "early keep it from the collective the others wait in. Give init_process_group a timeout "
                      "so that a hung job fails instead of holding its machines, and stop it with "
                      "`--rule-action Hang=stop_training`.")
    defaults = {"factor": 10, "floor_s": 40}

    @classmethod
    def findings(cls, result: RuleResult, summary: Any) -> list[Any]:
        """Each stopped rank (or stalls that resumed) as a finding, with its phase and the rank behind."""
        return findings_of(result, summary)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        for key in ("factor", "floor_s"):
            value = self.params[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise ParameterError(f"{self.name}.{key}={value!r}: must be a number > 0")
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._run: dict[str, Any] = {}
        self._final = False
        self._now: int | None = None

    def _limit_us(self, r: _Rank) -> float | None:
        median = r.median_s()
        if median is None:
            return None
        return max(float(self.params["floor_s"]), float(self.params["factor"]) * median) * US

    def _seen(self, t: int) -> None:
        self._now = t if self._now is None else max(self._now, t)

    def update(self, chunk: Chunk) -> None:
        self._run = chunk.run or self._run
        self._final = self._final or chunk.final
        for frame in chunk.system.values():
            if len(frame):
                self._seen(int(frame.timestamps.max()))
        cols = new_events(chunk)
        if cols is None:
            return
        self._seen(int(max(cols.end.max(), cols.start.max())))
        mask = cols.kind_is(STEP, UNTIMED)
        if not mask.any():
            return
        is_step = cols.kind_is(STEP)
        pids = cols.table["pid"].to_numpy(zero_copy_only=False) if "pid" in cols.table.column_names else None
        for (node, rank), rows in cols.groups(mask, by_mode=False):
            r = self._ranks.get((node, rank))
            if r is None:
                r = self._ranks[(node, rank)] = _Rank(node, rank)
            rows = rows[np.argsort(cols.end[rows], kind="stable")]
            self._progress(r, cols.end[rows], cols.start[rows], is_step[rows], cols.step[rows],
                           None if pids is None else pids[rows])

    def _progress(self, r: _Rank, ends: np.ndarray, starts: np.ndarray, steps: np.ndarray, numbers: np.ndarray,
                  pids: np.ndarray | None) -> None:
        """A rank's new progress, in order of its end: each gap since the progress before it (the running
        latest) longer than the limit at that moment is a stall. Vectorized; only gaps past the floor (no limit is
        lower) look at the median of the steps before them."""
        before = np.maximum.accumulate(np.concatenate([[r.last_us if r.last_us is not None else ends[0]], ends]))[:-1]
        gaps = ends - before
        durations = np.maximum(ends[steps] - starts[steps], 0)
        known = np.fromiter(r.durs, np.int64, len(r.durs))
        history = np.concatenate([known, durations])
        upto = len(known) + np.cumsum(steps) - steps  # durations known before each row
        floor = float(self.params["floor_s"]) * US
        for i in np.flatnonzero((gaps > floor) & (upto > 0)).tolist():
            k = int(upto[i])
            limit = max(floor, float(self.params["factor"]) * float(np.median(history[max(0, k - RECENT_STEPS):k])))
            if gaps[i] > limit:
                self._stall(r, int(before[i]), int(ends[i]), limit)
        r.last_us = int(max(before[-1], ends[-1]))
        r.sampled = r.sampled or not bool(steps.all())
        if durations.size:
            r.steps += int(durations.size)
            r.durs.extend(durations[-RECENT_STEPS:].tolist())
            numbered = np.flatnonzero(steps & (numbers >= 0))
            if numbered.size:
                r.last_step = int(numbers[numbered[-1]])
            if pids is not None:
                r.pid = int(pids[np.flatnonzero(steps)[-1]])

    def _stall(self, r: _Rank, since: int, until: int, limit: float) -> None:
        r.stalls_total += 1
        r.stalled_s += (until - since) / US
        if len(r.stalls) < MAX_STALLS:
            r.stalls.append(Stall(r.node, r.rank, since, until, round((until - since) / US, 3), round(limit / US, 3)))

    def merge(self, other: Rule, node: str) -> None:
        assert isinstance(other, Hang)
        self._run = other._run or self._run
        self._final = self._final or other._final
        self._ranks.update(other._ranks)
        if other._now is not None:
            self._seen(other._now)

    # -- the verdict ------------------------------------------------------------------------------------------
    def _clock(self) -> tuple[int | None, float]:
        """(now, margin µs): the newest datum, at the end the run's end too; the live margin while it runs."""
        now = self._now
        if self._final:
            end = self._run.get("end_us")
            if isinstance(end, int) and not isinstance(end, bool):
                now = end if now is None else max(now, end)
            return now, 0.0
        config = self._run.get("config") if isinstance(self._run.get("config"), dict) else {}
        flush = config.get("flush_interval_s", 5.0)
        flush = float(flush) if isinstance(flush, (int, float)) and not isinstance(flush, bool) else 5.0
        return now, (min(max(flush, 0.0), 300.0) + LIVE_MARGIN_S) * US

    def _ended_well(self) -> bool:
        """Every node's job exited by itself with 0: its ranks finished their loops, whatever came after. An
        imported run does not say how its job ended: the quiet after its last step is not judged either."""
        if self._run.get("imported"):
            return True
        nodes = self._run.get("nodes") or {}
        return bool(nodes) and all(isinstance(n, dict) and n.get("exit_code") == 0 and not n.get("interrupted")
                                   for n in nodes.values())

    def result(self) -> RuleResult:
        if not self._ranks:
            return self.not_applicable("no framework data: no rank recorded a step, so progress cannot be judged")
        now, margin = self._clock()
        dumps: list[StackDump] = [d for d in self._run.get("stacks") or [] if isinstance(d, StackDump)]
        ended_well = self._final and self._ended_well()
        ranks: dict[str, RankProgress] = {}
        open_stalls: list[Stall] = []
        phases: dict[str, Phase] = {}
        wanted: list[str] = []
        for (node, rank), r in sorted(self._ranks.items()):
            key = f"{node}/{rank}"
            limit = self._limit_us(r)
            idle = max(0, (now or 0) - (r.last_us or 0)) if r.last_us is not None and now is not None else 0
            stopped = limit is not None and idle > limit + margin and not ended_well
            fields: dict[str, Any] = {}
            if stopped:
                assert r.last_us is not None and limit is not None
                open_stalls.append(Stall(node, rank, r.last_us, None, round(idle / US, 3), round(limit / US, 3)))
                mine = [d for d in dumps if d.node == node and d.rank == rank and d.at_us >= r.last_us]
                main = [d for d in mine if d.pid == r.pid] or mine
                dump = main[-1] if main else None
                if dump is None:
                    wanted.append(key)
                phase = phases[key] = phase_of(dump)
                thread = dump.main if dump is not None else None
                fields = {"phase": phase.kind, "phase_text": phase.words, "call": phase.call, "where": phase.where,
                          "stacks": [d.path for d in mine if d.path],
                          "main_stack": [frame_text(f) + (f"  |  {f.code}" if f.code else "")
                                         for f in (thread.frames[-SHOWN_FRAMES:] if thread is not None else [])],
                          "threads": len(dump.threads) if dump is not None else 0}
            ranks[key] = RankProgress(node, rank, r.steps, r.last_step, r.last_us,
                                      None if r.median_s() is None else round(r.median_s() or 0.0, 6),
                                      None if limit is None else round(limit / US, 3), round(idle / US, 3), stopped,
                                      **fields)
        stopped_keys = [k for k, v in ranks.items() if v.stopped]
        behind, reason, waiting_in = _behind(stopped_keys, phases, ranks, any(r.sampled for r in self._ranks.values()))
        closed = [s for r in self._ranks.values() for s in r.stalls]
        stalls = sorted(closed + open_stalls, key=lambda s: (s.since_us, s.node, s.rank))
        total = sum(r.stalls_total for r in self._ranks.values()) + len(open_stalls)
        per_rank = {f"{r.node}/{r.rank}": r.stalled_s for r in self._ranks.values()}
        for s in open_stalls:
            per_rank[f"{s.node}/{s.rank}"] += s.seconds
        stake = round(max(per_rank.values(), default=0.0), 3)
        details = HangDetails(float(self.params["factor"]), float(self.params["floor_s"]), now, ranks, stopped_keys,
                              behind, reason, waiting_in, stalls[:MAX_STALLS], total, wanted, stake,
                              _title(ranks, stopped_keys, behind, waiting_in, stalls, ended=self._final))
        return self.make_result(triggered=total, violations=total, datapoints=len(ranks), details=details.to_json())


def _behind(stopped: list[str], phases: dict[str, Phase], ranks: dict[str, RankProgress],
            sampled: bool) -> tuple[list[str], str, str]:
    """The culprits among stopped ranks: those not in the collective the others wait in (from stacks); else, the
    stopped ones when others go on; else those whose last step came earlier (every step timed: a sampled rank's
    last timed step is not its last step)."""
    if not stopped:
        return [], "", ""
    calls = Counter(p.call for k, p in phases.items() if k in stopped and p.kind == COLLECTIVE)
    if calls:
        waiting_in = calls.most_common(1)[0][0]
        behind = [k for k in stopped if phases[k].kind != UNKNOWN
                  and not (phases[k].kind == COLLECTIVE and phases[k].call == waiting_in)]
        if behind:
            waiting = [k for k in stopped if k not in behind]
            return behind, (f"{_names(waiting)} {'waits' if len(waiting) == 1 else 'wait'} inside {waiting_in}; "
                            f"{_names(behind)} never reached it"), waiting_in
        return [], f"every stopped rank waits inside {waiting_in}", waiting_in
    # DDP all-reduces gradients from inside backward (its reducer, in C++: no collective frame in Python): stopped
    # ranks in backward wait there for a rank stopped elsewhere, which never reached it
    in_backward = [k for k in stopped if phases.get(k) is not None and phases[k].kind == BACKWARD]
    elsewhere = [k for k in stopped if phases.get(k) is not None and phases[k].kind not in (BACKWARD, UNKNOWN)]
    if in_backward and elsewhere:
        waiting_in = "backward's gradient all-reduce"
        return elsewhere, (f"{_names(in_backward)} {'waits' if len(in_backward) == 1 else 'wait'} inside backward "
                           f"(DDP's gradient all-reduce); {_names(elsewhere)} never reached it"), waiting_in
    going = [k for k in ranks if k not in stopped]
    if going:
        return list(stopped), f"{_names(going)} {'goes' if len(going) == 1 else 'go'} on", ""
    last = {k: ranks[k].last_step for k in stopped}
    if sampled or any(n is None for n in last.values()) or len(set(last.values())) < 2:
        return [], "", ""
    earliest = min(n for n in last.values() if n is not None)
    behind = sorted(k for k, n in last.items() if n == earliest)
    return behind, f"{_names(behind)} stopped after an earlier step ({earliest:,}) than the others", ""


def _names(keys: list[str]) -> str:
    ranks = [k.rpartition("/")[2] for k in keys]
    if len({k.rpartition("/")[0] for k in keys}) > 1:
        ranks = keys
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {', '.join(ranks[:-1]) + ' and ' + ranks[-1] if len(ranks) > 1 else ranks[0]}"


def _title(ranks: dict[str, RankProgress], stopped: list[str], behind: list[str], waiting_in: str,
           stalls: list[Stall], *, ended: bool) -> str | None:
    hangs = "hung" if ended else "hangs"
    if stopped:
        idle = format_duration(max(ranks[k].idle_s for k in stopped))
        if behind and waiting_in:
            waiting = [k for k in stopped if k not in behind]
            return (f"The job {hangs}: {_names(behind)} never reached {waiting_in}, where {_names(waiting)} "
                    f"{'waits' if len(waiting) == 1 else 'wait'} (no progress for {idle})")
        if behind and len(behind) == len(stopped):
            return f"{_names(stopped)[0].upper()}{_names(stopped)[1:]} made no progress for {idle}; the others go on"
        if behind:
            return f"The job {hangs}: {_names(stopped)} made no progress for {idle}; {_names(behind)} is behind"
        what = ranks[stopped[0]].phase_text if len({ranks[k].phase_text for k in stopped}) == 1 else ""
        return f"The job {hangs}: {_names(stopped)} made no progress for {idle}" + (f", {what}" if what else "")
    if stalls:
        worst = max(stalls, key=lambda s: s.seconds)
        return (f"Training stood still for {format_duration(worst.seconds)} on {_names([f'{worst.node}/{worst.rank}'])}, "
                "then went on")
    return None


def findings_of(result: RuleResult, summary: Any) -> list[Any]:
    """The rule's own translation into findings (analyze.findings): one per run that hung or stood still, with
    the stopped ranks, the culprit, each stopped rank's phase and where its stacks are."""
    from stallwatch.analyze.finding import HIGH, LISTED_WINDOWS, MEDIUM, Where, finding

    if not result.fired:
        return []
    d = HangDetails.from_json(result.details)
    keys = d.stopped or sorted({f"{s.node}/{s.rank}" for s in d.stalls})
    evidence: dict[str, Any] = {
        "stopped": d.stopped, "behind": d.behind, "behind_reason": d.behind_reason, "waiting_in": d.waiting_in,
        "ranks": {k: {"phase": d.ranks[k].phase, "phase_text": d.ranks[k].phase_text, "where": d.ranks[k].where,
                      "idle_s": d.ranks[k].idle_s, "limit_s": d.ranks[k].limit_s, "last_step": d.ranks[k].last_step,
                      "stacks": d.ranks[k].stacks} for k in keys if k in d.ranks},
        "stalls": d.stalls_total}
    windows = sorted((s.since_us, s.until_us if s.until_us is not None else (d.now_us or s.since_us))
                     for s in d.stalls)[:LISTED_WINDOWS]
    title = d.title or "The job stopped making progress"
    found = finding(result, summary, "ranks", title, d.time_at_stake_s,
                    Where(sorted({k.rpartition("/")[0] for k in keys}), keys, [], windows), evidence,
                    severity=HIGH if d.stopped else MEDIUM)
    job_s = getattr(summary, "duration_s", None) or 0.0
    if d.stopped and job_s > 0 and d.time_at_stake_s is not None:  # stopped after its last step: the job's time
        found = replace(found, share_of_loop=d.time_at_stake_s / job_s, share_of="job")
    return [found]
