"""What a report section is made of: plain typed blocks that sections build from analysis results and
the HTML renderer turns into markup. Sections never write HTML; every text here is escaped when rendered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

GOOD, INFO, WARN, ISSUE = "good", "info", "warn", "issue"  # how a verdict is coloured


@dataclass(frozen=True)
class Paragraph:
    """Explanatory text (the seeds' texts), one paragraph."""
    text: str


@dataclass(frozen=True)
class Verdict:
    """The sentence a reader acts on ("Your GPUs wait for data: add data-loader workers"), with a level."""
    text: str
    level: str = INFO


@dataclass(frozen=True)
class Table:
    """A table of plain values (numbers are formatted by the renderer); `caption` above it."""
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""


@dataclass(frozen=True)
class Chart:
    """One chart spec (`present.charts`: drawn in the browser by draw.js); `caption` above it."""
    model: Any
    caption: str = ""


@dataclass(frozen=True)
class NotApplicable:
    """The plain statement a section makes when it does not apply to this run (e.g. no GPU)."""
    reason: str


Block = Union[Paragraph, Verdict, Table, Chart, NotApplicable]


@dataclass
class Section:
    """One heading of the report. `id` is the HTML anchor (stable: tests and links use it); `level` 2 for
    the report's main sections, 3 for the subsections of "Analyzing the training loop"."""
    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    level: int = 2
