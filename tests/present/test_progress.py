"""Progress on stderr: a bar on a terminal, a plain line every few seconds otherwise, nothing when quiet."""

from __future__ import annotations

import io
import os
import pty
import select
import time

from stallwatch.present import progress
from stallwatch.present.progress import Progress


def test_plain_lines_when_not_a_terminal(monkeypatch):
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    out = io.StringIO()
    with Progress("report", unit="sections", stream=out) as bar:
        for i in range(3):
            bar.update(i + 1, 3)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("stallwatch: report: 1/3 sections, ") and lines[-1].startswith("stallwatch: report: 3/3")


def test_nothing_before_the_first_interval_and_nothing_when_quiet(monkeypatch):
    out = io.StringIO()
    with Progress("rules", stream=out) as bar:
        bar.update(1, 2)  # well within the first 5 s
    assert out.getvalue() == ""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    with Progress("rules", stream=out, quiet=True) as bar:
        bar.update(1, 2)
    assert out.getvalue() == ""


def test_a_bar_on_a_terminal_without_colour_under_no_color(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    main, child = pty.openpty()  # a terminal that reports no size: the bar takes 80 columns
    tty = os.fdopen(child, "w")
    try:
        with Progress("timeline", unit="events", stream=tty) as bar:
            bar.update(5, 10)
            tty.flush()
            # Read while it is open, until the update shows: a pty hands writes over asynchronously, so a first read
            # may hold only the bar's first drawing (0/10) on a loaded machine.
            shown, deadline = "", time.monotonic() + 5
            while "5/10" not in shown and select.select([main], [], [], max(0.0, deadline - time.monotonic()))[0]:
                shown += os.read(main, 4096).decode(errors="replace")
    finally:
        tty.close()
        os.close(main)
    assert "stallwatch: timeline" in shown and "5/10" in shown and "\x1b[32m" not in shown


def test_upload_timeline_and_import_report_progress(monkeypatch, tmp_path, capsys):
    """Every command that can take long says how far it is (plain lines here: stderr is not a terminal)."""
    from stallwatch.cli import main

    from ..run_builder import make_run

    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    monkeypatch.setattr(progress, "QUIET", False)  # restored after: `--quiet` below sets it for the process
    make_run(tmp_path / "run", nodes=("a", "b"), seconds=5)
    assert main(["upload", str(tmp_path / "run"), str(tmp_path / "copy")]) == 0
    assert main(["timeline", str(tmp_path / "run"), "-o", str(tmp_path / "t.json.gz")]) == 0
    err = capsys.readouterr().err
    assert "stallwatch: upload: " in err and " B, " in err
    assert "stallwatch: timeline: 1/2 nodes" in err
    import logging

    level = logging.getLogger("stallwatch").level
    try:
        assert main(["--quiet", "timeline", str(tmp_path / "run"), "-o", str(tmp_path / "u.json.gz")]) == 0
    finally:
        logging.getLogger("stallwatch").setLevel(level)
    assert "stallwatch: timeline:" not in capsys.readouterr().err
