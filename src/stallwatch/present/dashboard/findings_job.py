"""A run's findings for the dashboard, computed off the request path: evaluating the rules over a run whose results
were never stored takes minutes on a long multi-node run (8 nodes × 24 h: about three), so the page draws its
charts first and asks again while this says how far the evaluation got. One evaluation per run at a time,
whatever the number of clients; the last finished findings are shown (marked) while newer ones are computed.
A running job's own live evaluation (`rules/*.json`, rewritten every rules interval) is taken as it is."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from stallwatch.log import logger

WAIT_S = 1.5  # how long a request waits for findings that are nearly done before it is told to ask again


@dataclass
class _Evaluation:
    version: int
    started: float
    total: int | None = None
    done: int = 0
    error: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)


class FindingsJob:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._doc: tuple[int, dict[str, Any]] | None = None  # (version, findings document)
        self._eval: _Evaluation | None = None

    def answer(self, state: Any, *, wait_s: float = WAIT_S) -> dict[str, Any]:
        """The findings of the run's current version; else, within `wait_s`, those being computed; else the
        previous ones (or none) with `pending`: how far the evaluation is."""
        a = state.analysis()
        version = state.version
        with self._lock:
            if self._doc is not None and self._doc[0] == version:
                return self._doc[1]
            ev = self._eval
            if ev is None or (ev.version != version and ev.finished.is_set()):
                ev = self._eval = _Evaluation(version, time.monotonic())
                threading.Thread(target=self._run, args=(state, a, ev), name=f"findings-{state.id}",
                                 daemon=True).start()
        ev.finished.wait(wait_s)
        with self._lock:
            if self._doc is not None and self._doc[0] == version:
                return self._doc[1]
            previous = dict(self._doc[1]) if self._doc is not None else {"findings": [], "rules": [], "spans": [],
                                                                        "verdict": None}
            ev = self._eval
        if ev is not None and ev.error is not None and ev.version == version:
            previous["error"] = ev.error
            return previous
        previous["pending"] = {"done": ev.done if ev else 0, "total": ev.total if ev else None,
                               "elapsed_s": round(time.monotonic() - ev.started, 1) if ev else 0.0,
                               "stale": self._doc is not None}
        return previous

    def _run(self, state: Any, a: Any, ev: _Evaluation) -> None:
        from stallwatch.present.dashboard import documents

        try:
            _live_results(a)
            if "rule_results" not in a.__dict__:
                try:
                    from stallwatch.analyze.judge.feed import count_slices

                    ev.total = count_slices(a.run)
                except Exception:
                    ev.total = None
                a.rules_progress = lambda done: setattr(ev, "done", done)
            a.rule_results  # the long part: not under the run's lock, so the charts' questions go on
            with state.lock:
                doc = documents.findings_doc(a)
            with self._lock:
                if self._doc is None or self._doc[0] <= ev.version:
                    self._doc = (ev.version, doc)
        except Exception as exc:
            logger.warning("dashboard: the findings of %s failed (%s: %s)", state.id, type(exc).__name__, exc)
            ev.error = f"the rules could not be evaluated ({type(exc).__name__}: {str(exc)[:300]})"
        finally:
            ev.finished.set()


def _live_results(a: Any) -> None:
    """A running job's rule results as its live evaluation last stored them (every rule there): evaluating the
    whole run again for every new flush is what the live evaluation already does, once."""
    from stallwatch.analyze.results import RuleResult
    from stallwatch.analyze.rules.registry import builtin_rules
    from stallwatch.analyze.summary import RUNNING
    from stallwatch.store import run_files

    if "rule_results" in a.__dict__ or a.summary.fate.state != RUNNING:
        return
    stored = run_files.read_rule_results(a.run.location)
    names = [r.name for r in builtin_rules()]
    if not stored or not all(n in stored for n in names):
        return
    try:
        a.use_rule_results([RuleResult.from_json(stored[n], default_name=n) for n in names])
    except RuntimeError:  # read already
        pass
