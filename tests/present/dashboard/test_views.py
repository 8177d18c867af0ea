"""The dashboard's per-rank views in real Chromium over a real job: a 2-rank DDP straggler (gloo, CPU, the
guide's example) trained under `stallwatch run`. Nodes draws one track of phase blocks per rank (DDP's exposed
all-reduce among them) aligned with the system charts, the job's memory per rank, and one line instead of empty
GPU charts on this CPU-only node; Ranks stacks compute against exposed communication per rank (the waiting rank
is the one with the long communication part); Stacks shows the newest dump per rank as text; Overview has the job's
parts and readable evidence; Runs has each run's top severity and a running job's duration going on."""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.store.location import RunLocation
from stallwatch.store.stacks import write_dump
from tests.collect._support import stallwatch as run_cli
from tests.present.dashboard.conftest import Dashboard, start_dashboard
from tests.run_builder import make_run, node_record, write_node_json

EXAMPLE = Path(__file__).parents[3] / "examples" / "problems" / "straggler.py"
pytestmark = pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is installed with torch")


@pytest.fixture(scope="module")
def ddp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ddp-runs")
    p = run_cli(root, "run", "-q", "--report", "off", "--out", str(root / "ddp"), "--", sys.executable, "-m",
                "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(EXAMPLE), "--steps", "80",
                timeout=300)
    assert p.returncode == 0, p.stderr
    start = RunAnalysis(str(root / "ddp")).summary.start_us
    for rank in (0, 1):  # what the Hang rule's request makes each rank write (the store's own writer)
        write_dump(RunLocation(str(root / "ddp")), _node(root / "ddp"), {"rank": rank, "pid": 7000 + rank},
                   {"request": 1, "at_us": start + 1_000_000, "threads_left_out": 0, "threads": [
                       {"name": "MainThread", "main": True, "daemon": False, "frames_left_out": 0, "frames": [
                           {"file": "/job/train.py", "line": 60, "function": "main", "code": "loss.backward()"},
                           {"file": "/torch/c10d.py", "line": 3252, "function": "all_reduce",
                            "code": "work.wait()  # <img src=x onerror=alert(1)>"}]}]})
    running = root / "live"  # a job still running: its node has not ended
    make_run(running, nodes=("algo-1",), seconds=20, t0=int((time.time() - 3600) * 1e6))
    rec = node_record("algo-1", int((time.time() - 3600) * 1e6), None, samples=20, finished=False)
    write_node_json(RunLocation(str(running)), rec)
    return root


def _node(run: Path) -> str:
    return RunAnalysis(str(run)).nodes[0]


@pytest.fixture(scope="module")
def ddp_dashboard(ddp_root: Path) -> Iterator[Dashboard]:
    d = start_dashboard(ddp_root)
    yield d
    d.stop()


@pytest.fixture
def page(browser: Any, ddp_dashboard: Dashboard) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900}, bypass_csp=True)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("dialog", lambda d: errors.append("a dialog opened: " + d.message))
    yield pg
    assert errors == []
    context.close()


def test_nodes_draws_a_track_per_rank_the_jobs_memory_and_no_empty_gpu_chart(page: Any, ddp_dashboard: Dashboard) -> None:
    page.goto(ddp_dashboard.link("#run=ddp&view=nodes"))
    page.wait_for_function("document.querySelector('#chart-tracks').dataset.ranks == '2'")
    tracks = page.locator("#chart-tracks")
    assert tracks.get_attribute("data-mode") == "blocks" and int(tracks.get_attribute("data-blocks")) > 4 * 80
    assert "ddp_gradient_sync" in tracks.get_attribute("data-kinds").split(",")
    assert tracks.get_attribute("data-x0") == page.get_attribute("#chart-cpu", "data-x0")  # one time axis
    assert tracks.get_attribute("data-x1") == page.get_attribute("#chart-cpu", "data-x1")
    page.wait_for_function("document.querySelector('#chart-jobmem').dataset.points > 0")
    assert page.get_attribute("#chart-jobmem", "data-x0") == page.get_attribute("#chart-cpu", "data-x0")
    assert page.locator("#gpu-na").is_visible() and "No GPU" in page.text_content("#gpu-na")
    assert not page.locator("#chart-gpu").is_visible() and not page.locator("#chart-gpumem").is_visible()
    # zoom with the wheel on the tracks: every chart follows
    page.locator("#chart-tracks").scroll_into_view_if_needed()
    box = page.locator("#chart-tracks").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    x0 = int(tracks.get_attribute("data-x0"))
    page.mouse.wheel(0, -300)
    page.wait_for_function(f"document.querySelector('#chart-cpu').dataset.x0 > {x0}")
    assert page.get_attribute("#chart-cpu", "data-x0") == tracks.get_attribute("data-x0")
    page.wait_for_function("location.hash.includes('from=')")  # the zoom settled: that range asked of the server
    zoomed = page.get_attribute("#chart-cpu", "data-x0")
    page.check("#core-pick input[data-device=cpu0]")  # a new series: the chart is drawn again, on the same range
    page.wait_for_function("JSON.parse(document.querySelector('#chart-cpu').dataset.series || '{}').cpu0 !== undefined")
    assert page.get_attribute("#chart-cpu", "data-x0") == zoomed
    box = page.locator("#chart-cpu").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -300)  # the redrawn chart still leads the others
    page.wait_for_function(f"document.querySelector('#chart-tracks').dataset.x0 > {zoomed}")
    # the last steps, one mode at a time
    page.wait_for_function("document.querySelector('#chart-steps').dataset.bars > 0")
    assert page.get_attribute("#chart-steps", "data-step-mode") == "TRAIN"


def test_ranks_stack_compute_against_exposed_communication(page: Any, ddp_dashboard: Dashboard) -> None:
    parts = {p["rank"]: p for p in ddp_dashboard.json("/api/run/ddp/ranks?mode=TRAIN")["parts"]}
    assert len(parts) == 2 and all(p["communication_from"] == "timed" for p in parts.values())
    for p in parts.values():
        assert abs(sum(p["parts_ms"].values()) - p["mean_ms"]) < 0.01
    fast, slow = sorted(parts, key=lambda r: parts[r]["parts_ms"]["compute"])
    # the uneven shard: the slow rank computes, the other waits for it inside the all-reduce
    assert parts[fast]["parts_ms"]["collective"] > parts[slow]["parts_ms"]["collective"]
    page.goto(ddp_dashboard.link("#run=ddp&view=ranks"))
    page.wait_for_function("document.querySelector('#chart-rank-parts').dataset.bars == '2'")
    assert page.locator("#rank-parts tr[data-rank]").count() == 2
    assert re.search(r"\d ms", page.text_content("#rank-parts"))


def test_stacks_show_each_ranks_newest_dump_as_text(page: Any, ddp_dashboard: Dashboard) -> None:
    page.goto(ddp_dashboard.link("#run=ddp&view=stacks"))
    page.wait_for_selector("#stacks .stack-dump >> nth=1")
    text = page.text_content("#stacks")
    assert "all_reduce" in text and "<img src=x onerror=alert(1)>" in text  # the run's text, as text
    assert page.locator("#stacks img").count() == 0


def test_overview_job_parts_and_readable_evidence(page: Any, ddp_dashboard: Dashboard) -> None:
    page.goto(ddp_dashboard.link("#run=ddp&view=overview"))
    page.wait_for_selector("#job-details tr[data-part]")
    assert page.locator("#job-details tr[data-part]").count() == 3
    shares = [float(page.text_content(f"#job-details tr[data-part] >> nth={i} >> td >> nth=2").split()[0])
              for i in range(3)]
    assert abs(sum(shares) - 100) < 1
    page.wait_for_selector(".finding .kv-data tr", state="attached")
    evidence = page.text_content("#findings") + page.text_content("#rules")
    assert not re.search(r"\d\.\d{8,}", evidence) and "{\"" not in evidence  # no raw JSON, no 15-digit floats


def test_runs_page_severity_and_a_running_jobs_duration(page: Any, ddp_dashboard: Dashboard) -> None:
    page.goto(ddp_dashboard.link("#view=runs"))
    page.wait_for_selector("#runs-table tr[data-run=ddp]")
    assert page.text_content("#runs-table tr[data-run=ddp] .severity") in ("high", "medium", "low")
    live = page.locator("#runs-table tr[data-run=live] td.live-duration")
    assert live.count() == 1
    first = live.text_content()
    assert re.fullmatch(r"1h 0\dm \d\ds", first), first  # about an hour, as the report says durations
    page.wait_for_function(f"document.querySelector('#runs-table tr[data-run=live] td.live-duration').textContent != {first!r}",
                           timeout=15_000)
