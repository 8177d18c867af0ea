"""The report's sections as one self-contained HTML file: BokehJS, draw.js, the styles and every chart's
data inline, so the file opens from disk with no network. Every text is escaped here, and only here."""

from __future__ import annotations

import html
import math
import numbers
import re
from collections.abc import Sequence
from typing import Any

from stallwatch import catalogue
from stallwatch.log import logger
from stallwatch.present.report.model import (
    GOOD,
    INFO,
    ISSUE,
    WARN,
    Block,
    Chart,
    NotApplicable,
    Paragraph,
    Section,
    Table,
    Verdict,
)

LEVEL_LABELS = {GOOD: "Good", INFO: "Note", WARN: "Warning", ISSUE: "Issue"}
_CODE = re.compile(r"`([^`\n]+)`")
LONG_CELL = 80  # characters: a cell of prose this long gets room to stay readable (min-width below)

STYLE = """
:root { --fg: #1d2430; --muted: #5b6472; --line: #d9dee6; --bg-alt: #f5f7fa; --accent: #2b5fab; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: var(--fg); background: #fff; }
header { padding: 28px 40px 18px; border-bottom: 1px solid var(--line); background: var(--bg-alt); }
header h1 { margin: 0 0 4px; font-size: 26px; }
header p { margin: 0; color: var(--muted); }
.page { display: flex; align-items: flex-start; }
nav { position: sticky; top: 0; flex: 0 0 220px; max-height: 100vh; overflow-y: auto; padding: 20px 12px 20px 20px;
      border-right: 1px solid var(--line); font-size: 14px; }
nav h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .05em; color: var(--muted); margin: 0 0 8px;
         padding: 0; border: 0; }
nav ol, nav ul { margin: 0; padding-left: 18px; }
nav li { margin: 3px 0; }
nav a { color: var(--accent); text-decoration: none; }
nav a:hover { text-decoration: underline; }
main { flex: 1 1 auto; min-width: 0; padding: 8px 28px 60px; max-width: 1600px; }
section { margin: 0 0 8px; }
h2 { font-size: 22px; margin: 32px 0 10px; padding-top: 8px; border-top: 1px solid var(--line); }
h3 { font-size: 18px; margin: 24px 0 8px; }
p { margin: 8px 0; max-width: 110ch; }
code { font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: var(--bg-alt);
       padding: 1px 4px; border-radius: 3px; }
.verdict { margin: 10px 0; padding: 10px 14px; border-left: 5px solid; border-radius: 4px; max-width: 110ch; }
.verdict .label { font-weight: 600; margin-right: 6px; }
.na { color: var(--muted); font-style: italic; }
.caption { font-weight: 600; margin: 16px 0 6px; }
.table-wrap { overflow-x: auto; margin: 6px 0 14px; }
table { border-collapse: collapse; font-size: 14px; }
th, td { padding: 5px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: var(--bg-alt); font-weight: 600; }
td.long { min-width: 22ch; }
td { overflow-wrap: break-word; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }  /* a number never breaks; its header may wrap */
/* narrower windows: the contents above the page, so the sections get the whole width */
@media (max-width: 1200px) {
  .page { display: block; }
  nav { position: static; max-height: none; border-right: 0; border-bottom: 1px solid var(--line);
        padding: 12px 20px; columns: 2 220px; column-gap: 32px; }
  nav li { break-inside: avoid; }  /* a section and its subsections in one column */
  main { padding: 8px 20px 60px; }
  header { padding: 20px 20px 14px; }
}
tbody tr:nth-child(even) td { background: #fafbfc; }
.chart { margin: 6px 0 16px; max-width: 100%; overflow-x: auto; }  /* a wide figure scrolls in its box */
footer { color: var(--muted); font-size: 13px; margin-top: 40px; }
""" + "".join(f".verdict.{level} {{ border-color: {colour}; background: {tint}; }}\n"  # the dashboard's too
              for level, (colour, tint) in catalogue.LEVELS.items())


def escape(text: Any) -> str:
    """Any value as HTML text (quotes too, so it is safe in attributes)."""
    return html.escape(str(text), quote=True)


def rich(text: str) -> str:
    """Escaped prose: `code` spans and line breaks are the only markup a section's text can carry."""
    out = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escape(text))
    return out.replace("\n", "<br>")


def format_number(value: Any, places: int | None = None) -> str:
    """Numbers as a reader takes them in: thousands separated, decimals only where they say something. With
    `places` (a table column's), every value below 100 shows that many decimals, so the column lines up."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    v = float(value)
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v == 0:
        return "0"
    a = abs(v)
    if places is not None:
        return f"{v:,.0f}" if a >= 1000 else f"{v:.{min(places, 1) if a >= 100 else places}f}"
    if v.is_integer() and a < 1e15:
        return f"{int(v):,}"
    if a >= 0.01:
        return f"{v:,.{_places(v)}f}"
    return f"{v:.2g}"


def _places(v: float) -> int:
    """Decimals worth showing for a value of this size (when it has any)."""
    a = abs(v)
    return 0 if a >= 1000 else 1 if a >= 100 else 2


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


def _column_places(values: list[Any]) -> int | None:
    """A numeric column's decimals: those of its most precise non-whole float (None: no float at all)."""
    floats = [float(v) for v in values if _is_number(v) and not isinstance(v, (bool, numbers.Integral))]
    floats = [v for v in floats if math.isfinite(v)]
    if not floats:
        return None
    return max((_places(v) for v in floats if not v.is_integer()), default=0)


def _cell(value: Any, places: int | None = None) -> str:
    if value is None:
        return "<td></td>"
    if _is_number(value):
        return f'<td class="num">{escape(format_number(value, places))}</td>'
    text = escape(value).replace(chr(10), "<br>")
    return f'<td class="long">{text}</td>' if len(str(value)) > LONG_CELL else f"<td>{text}</td>"


def _table(block: Table) -> str:
    columns = [[r[i] if i < len(r) else None for r in block.rows] for i in range(len(block.columns))]
    numeric = [bool(col) and all(v is None or _is_number(v) for v in col) for col in columns]
    places = [_column_places(col) for col in columns]
    head = "".join(f'<th class="num">{escape(c)}</th>' if n else f"<th>{escape(c)}</th>"
                   for c, n in zip(block.columns, numeric))
    body = "\n".join("<tr>" + "".join(_cell(v, p) for v, p in zip(row, places)) + "</tr>" for row in block.rows)
    caption = f'<p class="caption">{rich(block.caption)}</p>' if block.caption else ""
    return (f'{caption}<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>\n{body}\n</tbody></table></div>")


def _block(block: Block, chart_divs: dict[int, str]) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{rich(block.text)}</p>"
    if isinstance(block, Verdict):
        level = block.level if block.level in LEVEL_LABELS else INFO
        return (f'<div class="verdict {level}"><span class="label">{LEVEL_LABELS[level]}:</span>'
                f"{rich(block.text)}</div>")
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Chart):
        caption = f'<p class="caption">{rich(block.caption)}</p>' if block.caption else ""
        return f'{caption}<div class="chart">{chart_divs.get(id(block), "")}</div>'
    if isinstance(block, NotApplicable):
        return f'<p class="na">{rich(block.reason)}</p>'
    return f'<p class="na">{escape(f"(a block of unknown type {type(block).__name__} was left out)")}</p>'


def _contents(sections: Sequence[Section]) -> str:
    """Nested list: main sections (level 2) with their subsections (level 3) under them."""
    out, open_sub = ["<ol>"], False
    for s in sections:
        link = f'<a href="#{escape(s.id)}">{escape(s.title)}</a>'
        if s.level > 2:
            if not open_sub:
                out.append("<ul>")
                open_sub = True
            out.append(f"<li>{link}</li>")
            continue
        if open_sub:
            out.append("</ul>")
            open_sub = False
        if len(out) > 1:
            out.append("</li>")
        out.append(f"<li>{link}")
    if open_sub:
        out.append("</ul>")
    if len(out) > 1:
        out.append("</li>")
    out.append("</ol>")
    return "".join(out)


def _charts(sections: Sequence[Section]) -> tuple[str, dict[int, str]]:
    """The scripts that draw every chart in the browser (BokehJS, draw.js, the catalogue and the specs as one
    JSON script) and one <div> per chart. Names travel as JSON data and are drawn as text, never markup; a
    spec that cannot be serialized costs only its own chart."""
    from stallwatch.present import drawpage

    specs: list[dict[str, Any]] = []
    placed: dict[int, str] = {}
    for c in (b for s in sections for b in s.blocks if isinstance(b, Chart)):
        try:
            spec = c.model.to_json()
        except Exception as exc:  # noqa: BLE001 — one chart that cannot be carried must not cost the others
            logger.warning("report: a chart (%s) could not be drawn: %s: %s", c.caption or "untitled",
                           type(exc).__name__, exc)
            placed[id(c)] = f'<p class="na">This chart could not be drawn ({escape(type(exc).__name__)}).</p>'
            continue
        placed[id(c)] = drawpage.chart_div(len(specs))
        specs.append(spec)
    return drawpage.page_scripts(specs), placed


def render(sections: Sequence[Section], *, title: str, subtitle: str = "") -> str:
    """One HTML document holding `sections` in order, a contents list linking to their anchors, and every
    chart interactive (hover, zoom, legends that hide series), with nothing loaded from the network."""
    script, divs = _charts(sections)
    body = []
    for s in sections:
        tag = "h3" if s.level > 2 else "h2"
        blocks = "\n".join(_block(b, divs) for b in s.blocks)
        body.append(f'<section id="{escape(s.id)}"><{tag}>{escape(s.title)}</{tag}>\n{blocks}\n</section>')
    sub = f"<p>{rich(subtitle)}</p>" if subtitle else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<header><h1>{escape(title)}</h1>{sub}</header>
<div class="page">
<nav><h2>Contents</h2>{_contents(sections)}</nav>
<main>
{chr(10).join(body)}
<footer>Generated by stallwatch. The charts are interactive: hover for values, drag to pan, scroll to zoom,
click a legend entry to hide its series.</footer>
</main>
</div>
{script}
</body>
</html>
"""
