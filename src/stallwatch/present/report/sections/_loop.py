"""What the "Analyzing the training loop" subsections share: one rule's result read as typed values, the
plain statement when a rule does not apply (or failed), and the formatting of numbers in their sentences."""

from __future__ import annotations

import datetime as _dt
import math

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.results import RuleResult
from stallwatch.analyze.rules.kit.details import Coverage
from stallwatch.present.report.model import GOOD, WARN, NotApplicable, Verdict

US = 1_000_000
HOW_TO_RECORD = ("Run the training under `stallwatch run -- python train.py` (PyTorch) to record its steps, their "
                 "phases and its data loading.")


def rule_view(analysis: RunAnalysis, name: str, what: str) -> tuple[RuleResult | None, NotApplicable | None]:
    """The rule's result when it applies, else the statement why `what` (the subsection's analysis, as a phrase:
    "the batch size analysis") does not apply."""
    view = analysis.rule(name)
    if view is None:
        return None, NotApplicable(f"{_cap(what)} was not analyzed: the {name} rule was not evaluated for this run.")
    if view.status == "error":
        return view, NotApplicable(f"{_cap(what)} could not be analyzed: the {name} rule failed ({view.message}).")
    if view.status == "not_applicable":
        return view, NotApplicable(not_applicable_reason(view, what, analysis.summary.ended_before_first_step))
    patience = view.parameters.get("patience")
    if view.datapoints == 0 and patience is not None and not Coverage.from_json(view.details).nothing_to_compare:
        return view, NotApplicable(f"The run is too short for {what}: the {name} rule skips the first {patience} "
                                   "snapshots of each node (initialization), and no node had enough snapshots after "
                                   "them, so nothing was analyzed.")
    return view, None


def not_applicable_reason(view: RuleResult, what: str, failed: str | None = None) -> str:
    """A rule's "not applicable" as a plain sentence: no GPU, no framework data (and how to get it, unless the
    job ended before its first step: `failed` says how), or the rule's own message."""
    skipped = Coverage.from_json(view.details).not_applicable
    if skipped:
        nodes = ("node " if len(skipped) == 1 else "nodes ") + ", ".join(sorted(skipped))
        return f"No GPU on this run ({nodes} recorded no GPU data): {what} does not apply."
    message = view.message.rstrip(".")
    if message.startswith("no framework data") and failed:
        return f"No step was recorded: {failed}, so {what} does not apply."
    if message.startswith("no framework data"):
        return f"No framework data on this run: {what} does not apply. {HOW_TO_RECORD}"
    return f"{_cap(what)} does not apply: {message}."


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def skipped_nodes(view: RuleResult) -> str:
    """The nodes a GPU rule skipped for lack of GPU data, as a sentence ("" when none)."""
    skipped = Coverage.from_json(view.details).not_applicable
    if not skipped:
        return ""
    return f"Nodes without GPU data, left out here: {', '.join(sorted(skipped))}."


def rule_verdict(view: RuleResult, fired: str, fine: str, *, fires: bool | None = None) -> Verdict:
    """The rule's verdict: `fired` followed by its recommendation when it fired, else `fine`."""
    if (view.triggered > 0) if fires is None else fires:
        return Verdict(f"{fired} {_cap(view.recommendation)}".strip(), WARN)
    return Verdict(fine, GOOD)


def when(us: int | None) -> str:
    """µs since the epoch as UTC text."""
    if us is None:
        return "-"
    return _dt.datetime.fromtimestamp(us / US, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float | None) -> str:
    """A duration for sentences: "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min"."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(float(seconds), 0.0)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def num(x: float | None, digits: int = 2) -> str:
    """A number for sentences, `digits` after the point, without trailing zeros ("-" for missing)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    text = f"{float(x):.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def plural(n: int, word: str) -> str:
    """ "1 window", "3 windows" (the last word takes the s)."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def percent(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0
