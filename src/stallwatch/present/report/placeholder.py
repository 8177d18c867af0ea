"""The page at report.html while `stallwatch run`'s detached process writes the report: a person who opens the
printed path at once sees it, and then the report, without doing anything."""

from __future__ import annotations

import shlex
import time

from stallwatch.present.report.html import STYLE, escape

RELOAD_S = 2


def placeholder_html(run_uri: str, *, started: float | None = None) -> str:
    """The page at report.html while the report is being written: it reloads itself until the report is there,
    and says what to run if the process writing it was stopped (a machine shut down, a container ended)."""
    when = time.strftime("%H:%M:%S", time.localtime(time.time() if started is None else started))
    command = escape(f"stallwatch report {shlex.quote(run_uri)}")  # as it is pasted into a shell
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{RELOAD_S}">
<title>stallwatch report — being written</title><style>{STYLE}</style></head>
<body><header><h1>The report is being written</h1>
<p>Run {escape(run_uri)}</p></header>
<main><div class="verdict info"><span class="label">Note</span>stallwatch started writing this run's report at
{escape(when)}, after the job ended. This page reloads itself every {RELOAD_S} s and shows the report once it is
there: a few seconds for a short run, a minute or more for a long one.</div>
<p>If it never comes (the process writing it failed, or was stopped with the machine or the container), this
command writes it, or says why it cannot: <code>{command}</code></p></main></body></html>
"""
