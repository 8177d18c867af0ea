"""Every `stallwatch` command shown in the README and docs/ is checked so none can go stale: each parses with
the real command line's parser, and each one that reads a local run (info, summary, rules, report, timeline,
compare, config, ls) runs on a generated run with the example's own flags. Commands that need a training
script, a bucket or a file of the reader's are parsed only."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from stallwatch.cli import build_parser, main

from .present.report._full_runs import full_run

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNS_ON_A_RUN = {"info", "summary", "rules", "report", "timeline", "compare", "config", "ls"}
SEPARATORS = {"&&", ";", "||", "|", ">", ">>", "&"}


def _examples() -> list[tuple[str, list[str]]]:
    """(where, argv after `stallwatch`) for every stallwatch command in a shell block of the docs."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```(?:bash|sh|console|shell)\n(.*?)```", doc.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                lexer = shlex.shlex(line.strip().removeprefix("$ "), posix=True, punctuation_chars=True)
                lexer.whitespace_split, lexer.commenters = True, "#"
                tokens, command = list(lexer), []
                for tok in [*tokens, ";"]:
                    if tok in SEPARATORS:
                        if command[:1] == ["stallwatch"]:
                            out.append((f"{doc.name}: {line.strip()[:80]}", command[1:]))
                        command = [] if tok != ">" else ["redirect"]
                    elif command != ["redirect"]:
                        command.append(tok)
    return out


EXAMPLES = _examples()


def test_the_docs_show_the_commands():
    assert len(EXAMPLES) >= 30
    assert {argv[0] for _, argv in EXAMPLES if argv and not argv[0].startswith("-")} >= {
        "run", "rules", "report", "info", "summary", "compare", "timeline", "config", "ls", "dashboard", "upload",
        "import-sagemaker", "completion"}


@pytest.mark.parametrize("where, argv", EXAMPLES, ids=[f"{i}-{' '.join(a)[:40]}" for i, (_, a) in enumerate(EXAMPLES)])
def test_every_example_parses(where, argv):
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:  # --help and --version exit 0 on their own; a usage error exits 2
        assert exc.code == 0, f"{where}: `stallwatch {' '.join(argv)}` is not accepted by the parser"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("doc-runs")
    full_run(root / "stallwatch-runs" / "a-run", nodes=("algo-1", "algo-2"), gpus=2, ranks=2)
    full_run(root / "stallwatch-runs" / "after", nodes=("algo-1",), gpus=2)
    return root


def _on_a_run(argv: list[str], root: Path) -> list[str] | None:
    """The example with its runs and output files made real, or None when it needs what a test cannot have."""
    if argv[0] not in RUNS_ON_A_RUN or any(a.startswith("s3://") or ".py" in a for a in argv):
        return None
    run, after = root / "stallwatch-runs" / "a-run", root / "stallwatch-runs" / "after"
    out: list[str] = []
    positional = 0
    for i, a in enumerate(argv):
        if i > 0 and not a.startswith("-") and not argv[i - 1].startswith("-") or a in ("RUN", "BEFORE", "AFTER"):
            positional += 1
            a = str(after if positional == 2 and argv[0] == "compare" else run)
        elif i > 0 and argv[i - 1] in ("-o", "--out", "--baseline"):
            a = str(root / Path(a).name) if argv[i - 1] != "--baseline" else str(run)
        out.append(a)
    if argv[0] == "ls":
        return ["ls", str(root / "stallwatch-runs")]
    return out


@pytest.mark.parametrize("where, argv", EXAMPLES, ids=[f"{i}-{' '.join(a)[:40]}" for i, (_, a) in enumerate(EXAMPLES)])
def test_every_example_that_reads_a_local_run_runs(where, argv, runs, tmp_path, capsys):
    real = _on_a_run(argv, runs)
    if real is None:
        pytest.skip("needs a training script, a bucket or a file of the reader's: parsed only")
    work = tmp_path / "runs"
    shutil.copytree(runs, work)  # config edits and written reports stay in this test
    real = [a.replace(str(runs), str(work)) for a in real]
    code = main(real)
    assert code in (0, 1), f"{where}: `stallwatch {' '.join(real)}` exited {code}: {capsys.readouterr().err[-2000:]}"


def test_the_readmes_custom_rule_runs_as_shown(runs, tmp_path, capsys):
    """The rule a reader copies from the README, loaded with `--custom-rule` as the README says, is evaluated on a
    run without an error and counts its snapshots (a chunk may hold a node with no rows, and so no columns)."""
    import json

    block = next(b for b in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
                 if "class BusyCpu(Rule)" in b)
    (tmp_path / "my_rules.py").write_text(block)
    work = tmp_path / "runs"
    shutil.copytree(runs, work)
    run = work / "stallwatch-runs" / "a-run"
    code = main(["rules", str(run), "--custom-rule", f"{tmp_path / 'my_rules.py'}:BusyCpu"])
    assert code in (0, 1), capsys.readouterr().err[-2000:]
    result = json.loads((run / "rules" / "BusyCpu.json").read_text())
    assert "error" not in json.dumps(result).lower(), result
    assert result["Datapoints"] > 0 and "busy_snapshots" in result["Details"], result
