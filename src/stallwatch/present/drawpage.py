"""The pieces a self-contained page needs to draw chart specs offline: BokehJS (read as files from the
installed bokeh package, found without importing it: importing bokeh costs half a second), draw.js, the
catalogue's colours, and the specs as one JSON script that a run's strings can never close."""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallwatch import catalogue

STATIC = Path(__file__).with_name("static")
BOKEH_FILES = ("bokeh.min.js", "bokeh-api.min.js")

# Draw every [data-chart] element from the JSON specs; one chart that fails shows one line, the rest draw.
BOOT = """
(function () {
  function start() {
    var doc = JSON.parse(document.getElementById("stallwatch-charts").textContent);
    Draw.setCatalogue(doc.catalogue);
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var spec = doc.charts[Number(el.dataset.chart)];
      try { if (spec) Draw.render(el, spec); }
      catch (err) { el.textContent = "This chart could not be drawn."; console.warn(err); }
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
"""


def bokeh_js_dir() -> Path:
    """bokeh/server/static/js of the installed bokeh package, located without importing it."""
    spec = importlib.util.find_spec("bokeh")
    folder = Path(spec.origin).parent / "server" / "static" / "js" if spec is not None and spec.origin else None
    if folder is None or not all((folder / name).is_file() for name in BOKEH_FILES):
        raise ModuleNotFoundError("No module named 'bokeh' (the charts need its BokehJS files)", name="bokeh")
    return folder


@functools.lru_cache(maxsize=1)
def scripts_text() -> str:
    """BokehJS and draw.js, in order, as one text (read once per process)."""
    folder = bokeh_js_dir()
    parts = [(folder / name).read_text(encoding="utf-8") for name in BOKEH_FILES]
    parts.append((STATIC / "draw.js").read_text(encoding="utf-8"))
    return "\n;\n".join(parts)


def script_safe(text: str) -> str:
    """Text that can sit inside <script>: no `</` (closes it) and no `<!--` (changes how it is parsed)."""
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def charts_json(specs: Sequence[dict[str, Any]]) -> str:
    """The catalogue and every spec as one JSON document, escaped for a <script type="application/json">
    (inside JSON strings `<\\/` still reads `</`)."""
    doc = {"catalogue": catalogue.to_json(), "charts": list(specs)}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c")


def page_scripts(specs: Sequence[dict[str, Any]]) -> str:
    """The <script> elements that draw `specs` (their to_json()) into the page's `<div data-chart="i">` elements on load."""
    if not specs:
        return ""
    return (f'<script type="application/json" id="stallwatch-charts">{charts_json(specs)}</script>\n'
            f"<script>{script_safe(scripts_text())}</script>\n<script>{BOOT}</script>")


def chart_div(index: int) -> str:
    return f'<div class="chart-draw" data-chart="{index}"></div>'
