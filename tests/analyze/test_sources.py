"""The façade chooses its data source once: both sources answer every question of the `Source` protocol, and
`RunAnalysis` delegates without asking which source (or which engine) it has."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from stallwatch.analyze import analysis, sources
from stallwatch.analyze.analysis import RunAnalysis
from stallwatch.analyze.engine import LocalEngine, on_run
from tests.run_builder import make_run


def _protocol_methods(proto: type) -> set[str]:
    return {n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")}


def test_both_sources_answer_every_question_of_the_protocol():
    wanted = _protocol_methods(sources.Source)
    assert "markers" in wanted and "node_series" in wanted
    for impl in (sources.ExactSource, sources.RollupSource):
        assert wanted <= set(dir(impl)), (impl.__name__, wanted - set(dir(impl)))
        for name in wanted:  # same parameters as the protocol says
            assert list(inspect.signature(getattr(impl, name)).parameters) == \
                list(inspect.signature(getattr(sources.Source, name)).parameters), (impl.__name__, name)


def test_the_facade_never_branches_on_its_source_or_engine():
    tree = ast.parse(Path(analysis.__file__).read_text())
    tests = [ast.unparse(n.test) for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.While))]
    assert not [t for t in tests if "overview_from_rollups" in t or "engine.name" in t]


def test_the_source_is_chosen_once_and_figures_agree(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    make_run(run, seconds=120)
    exact, rolled = RunAnalysis(str(run)), RunAnalysis(str(run), overview_from_rollups=True)
    assert type(exact._source) is sources.ExactSource and type(rolled._source) is sources.RollupSource
    assert exact.sample_interval_ms == rolled.sample_interval_ms
    assert exact.last_sample_us("algo-1") == rolled.last_sample_us("algo-1") is not None
    assert exact.losses.gaps == rolled.losses.gaps
    assert exact.summary.steps == rolled.summary.steps == {}


def test_local_work_runs_on_the_open_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    make_run(run, nodes=("algo-1",), seconds=5)
    a = RunAnalysis(str(run))
    task = on_run(LocalEngine(), a.run, lambda r, node: (r, node), lambda uri, node: (uri, node))
    assert task("algo-1") == (a.run, "algo-1")
