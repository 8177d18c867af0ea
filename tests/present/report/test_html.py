"""The renderer on its own: sections in, one HTML document out — every text escaped, numbers formatted, the
contents list, verdict levels, BokehJS and draw.js inline with the charts' data as JSON a run's strings cannot
close, and nothing that points at the network."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from stallwatch.present import charts
from stallwatch.present.report.html import format_number, render
from stallwatch.present.report.model import (
    GOOD,
    INFO,
    ISSUE,
    WARN,
    Chart,
    NotApplicable,
    Paragraph,
    Section,
    Table,
    Verdict,
)

SCRIPT = "<script>alert(1)</script>"
EVIL_ATTR = '" onmouseover="alert(1)'


class _Refs(HTMLParser):
    """Every element, and every URL the document would load or link to (attributes and CSS url())."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        for name in ("src", "href", "action", "poster", "data", "srcset"):
            if a.get(name):
                self.urls.append(str(a[name]))
        self.urls += re.findall(r"url\(\s*['\"]?([^'\")]+)", a.get("style") or "")
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls += re.findall(r"url\(\s*['\"]?([^'\")]+)", data)


def _parse(doc: str) -> _Refs:
    p = _Refs()
    p.feed(doc)
    return p


def _pie_with(name: str) -> charts.PieSpec:
    return charts.PieSpec(title=name, slices=[charts.Slice(name, 2.0), charts.Slice("rest", 1.0)])


def _sections() -> list[Section]:
    return [
        Section("summary", f"Summary {SCRIPT}", [
            Paragraph(f"Run `stallwatch report RUN` for {SCRIPT}\nsecond line"),
            Verdict(f"good {SCRIPT}", GOOD), Verdict("a note", INFO), Verdict("careful", WARN),
            Verdict("broken", ISSUE),
            Table(["name", "count", "share"], [[SCRIPT, 1234567, 62.5], ["b", 3, 50.0], ["c", None, float("nan")]],
                  caption=f"Table of {SCRIPT}"),
            Chart(_pie_with(SCRIPT), caption=f"Chart {SCRIPT}"),
            NotApplicable(f"does not apply: {SCRIPT}"),
        ]),
        Section("cpu-operators", "CPU operators", [Paragraph("sub")], level=3),
        Section(EVIL_ATTR, "Attribute", [Paragraph("x")]),
    ]


def test_every_text_is_escaped_and_chart_data_too():
    doc = render(_sections(), title=f"Report {SCRIPT}", subtitle=SCRIPT)
    assert SCRIPT not in doc  # not in the page, not in the charts' embedded JSON either
    assert "<!--" not in doc[doc.index("<main>"):]  # nor anything that changes how a script is parsed
    data = doc[doc.index('id="stallwatch-charts">') + 23:]
    data = data[:data.index("</script>")]
    assert json.loads(data)["charts"][0]["title"] == SCRIPT  # carried whole, as data: draw.js draws it as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in doc
    assert 'onmouseover="alert(1)' not in doc  # an id cannot leave its attribute
    main = doc[doc.index("<main>"):doc.index("</main>")]
    assert "<script" not in main and "<img" not in main  # the only scripts are the charts', after <main>
    assert all(a.get("src") is None for t, a in _parse(doc).tags if t == "script")


def test_nothing_points_at_the_network():
    doc = render(_sections(), title="Report", subtitle="")
    urls = _parse(doc).urls
    assert urls and all(u.startswith("#") for u in urls), urls  # only the contents' links to anchors
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", doc.split("<script", 1)[0])
    assert "<link" not in doc  # styles are inline


def test_contents_list_links_every_section_and_nests_subsections():
    doc = render(_sections(), title="Report", subtitle="")
    nav = doc[doc.index("<nav>"):doc.index("</nav>")]
    assert nav.index('href="#summary"') < nav.index("<ul>") < nav.index('href="#cpu-operators"') < nav.index("</ul>")
    for sid in ("summary", "cpu-operators"):
        assert f'<section id="{sid}">' in doc
    assert "<h3>CPU operators</h3>" in doc and "<h2>Summary &lt;script&gt;" in doc


def test_verdicts_carry_their_level_and_prose_its_code_spans():
    doc = render(_sections(), title="Report", subtitle="")
    for level in ("good", "info", "warn", "issue"):
        assert f'<div class="verdict {level}">' in doc
    assert "<code>stallwatch report RUN</code>" in doc and "&lt;script&gt;alert(1)&lt;/script&gt;<br>second line" in doc
    assert '<p class="na">does not apply: &lt;script&gt;' in doc


def test_numbers_are_formatted_and_right_aligned():
    doc = render(_sections(), title="Report", subtitle="")
    assert '<td class="num">1,234,567</td>' in doc
    assert '<td class="num">62.50</td>' in doc and '<td class="num">50.00</td>' in doc  # one column, one precision
    assert '<td class="num">–</td>' in doc and "<td></td>" in doc  # NaN and None
    assert '<th class="num">count</th>' in doc and "<th>name</th>" in doc


@pytest.mark.parametrize("value, text", [(0, "0"), (7, "7"), (1234567, "1,234,567"), (0.5, "0.50"), (62.5, "62.50"),
                                         (123.456, "123.5"), (12345.6, "12,346"), (3.0, "3"), (0.000123, "0.00012"),
                                         (float("nan"), "–"), (float("inf"), "∞"), (True, "yes")])
def test_format_number(value, text):
    assert format_number(value) == text


def test_a_chart_that_cannot_be_carried_is_left_out_and_the_others_are_drawn():
    sections = [Section("a", "A", [Chart(_pie_with("fine"), "first"), Chart("not a chart spec", "broken"),
                                   Chart(_pie_with("also fine"), "third")])]
    doc = render(sections, title="Report", subtitle="")
    assert doc.count("data-chart=") == 2
    assert "This chart could not be drawn" in doc


def test_no_chart_no_bokeh():
    doc = render([Section("a", "A", [Paragraph("text only")])], title="Report", subtitle="")
    assert "<script" not in doc and "Bokeh" not in doc
