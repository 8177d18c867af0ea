"""CommunicationBound on real DDP training (gloo on CPU, 2 ranks under torchrun): a wide model with tiny batches
waits for its gradient all-reduce — the top finding, with the same numbers in the report's DDP paragraph; a narrow
model with real work per step is compute-bound — silent. The exposed all-reduce is timed on every step."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.records import COLLECTIVE, STEP, TRAIN
from stallwatch.store.reader import open_run

from ..collect._support import stallwatch as run_cli
from ._teardown import assert_ranks_finished

JOB = Path(__file__).with_name("comm_job.py")
STEPS = 60

pytestmark = pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is installed with torch")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    # wide: 17 MB of gradients a step for a batch of 2; narrow: 17 kB, and 20 ms of CPU work a step
    for name, job in (("comm", ("2048", "2", str(STEPS))), ("compute", ("64", "2", str(STEPS), "20"))):
        tmp = tmp_path_factory.mktemp(name)
        run = tmp / "run"
        p = run_cli(tmp, "run", "--report", "off", "--out", str(run), "--rules-interval", "0", "--",
                    sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(JOB),
                    str(tmp), *job, timeout=300)
        assert_ranks_finished(p.returncode, p.stderr, tmp)
        out[name] = run
    return out


def _rule(run: Path) -> dict:
    return json.loads((run / "rules" / "CommunicationBound.json").read_text())


def test_every_step_records_its_exposed_all_reduce(runs):
    events = open_run(str(runs["comm"])).framework().to_pylist()
    for rank in (0, 1):
        mine = [e for e in events if e["rank"] == rank]
        steps = {e["step"] for e in mine if e["kind"] == STEP and e["mode"] == TRAIN}
        sync = [e for e in mine if e["kind"] == COLLECTIVE and e["name"] == "ddp_gradient_sync"]
        # one per step from the second on (DDP's timing of the first names the parameter ready last)
        assert len(steps) == STEPS and {e["step"] for e in sync} == steps - {0}
        assert all(json.loads(e["args"])["bytes"] > 16e6 and e["end_us"] >= e["start_us"] for e in sync)
        (config,) = [json.loads(e["args"]) for e in mine if e["kind"] == "ddp"]
        assert (config["world_size"], config["device_type"], config["bucket_cap_mb"]) == (2, "cpu", 25.0)


def test_a_communication_bound_job_has_it_as_its_top_finding(runs):
    r = _rule(runs["comm"])
    assert r["Status"] == "ok" and r["RuleTriggered"] >= 1
    analysis = RunAnalysis(str(runs["comm"]))
    # beside other work CPUContention may rank above it: the one finding a busy machine may add
    top = next(f for f in analysis.findings.findings if f.rule != "CPUContention")
    assert top.rule == "CommunicationBound", [f.rule for f in analysis.findings.findings]
    assert "gradient_as_bucket_view=True" in top.recommendation and "no_sync" in top.recommendation
    # the report's DDP paragraph says the same numbers as the finding (one source: the rule's details)
    from stallwatch.analyze.rules.communication import CommunicationDetails
    from stallwatch.present.report.sections import framework

    d = CommunicationDetails.from_json(r["Details"])
    best = d.top
    assert best is not None and best.key in top.where.ranks
    assert top.evidence[best.key]["exposed_ms_per_step"] == pytest.approx(best.exposed_ms)
    (main, *_) = framework.build(analysis)
    text = " ".join(getattr(b, "text", "") for b in main.blocks)
    assert f"typically waited {best.exposed_ms:,.1f} ms a step" in text
    assert f"{best.share:.0f} % of its step time" in text
    assert f"{best.bytes_per_step / 1e6:,.1f} MB a step" in text


def test_a_compute_bound_job_is_silent(runs):
    r = _rule(runs["compute"])
    assert r["Status"] == "ok" and r["RuleTriggered"] == 0 and r["Details"]["ranks"]
    assert all(e["share"] < 20 for e in r["Details"]["ranks"].values())
    assert not any(f.rule == "CommunicationBound" for f in RunAnalysis(str(runs["compute"])).findings.findings)
