"""A plain PyTorch script that never imports stallwatch, run under `stallwatch run`: every step recorded
exactly, with its phases, the data loader's settings and workers, and the requested profiling windows."""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
import time

import pytest

from stallwatch.records import BACKWARD, DATA_WAIT, EVAL, FORWARD, OPTIMIZER, STEP, TRAIN, UNTIMED
from stallwatch.store.reader import open_run

from ..collect._support import stallwatch as run_cli
from ._scripts import write_train_and_eval


def _rows(table, **where):
    rows = table.to_pylist()
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One real job under `stallwatch run --detailed-profiling 5:1 --python-profiling 9:3`."""
    tmp = tmp_path_factory.mktemp("zero-code")
    script = write_train_and_eval(tmp)
    out = tmp / "run"
    p = run_cli(tmp, "run", "--report", "off",
                "--out", str(out), "--flush-interval", "1", "--detailed-profiling", "5:1",
                "--python-profiling", "9:3", "--dataloader-profiling", "1:6",
                "--", sys.executable, str(script), str(tmp / "ran.json"))
    assert p.returncode == 0, p.stderr
    return tmp, out, json.loads((tmp / "ran.json").read_text()), p


def test_exactly_the_steps_it_ran_per_mode_with_a_data_wait_each(profiled):
    _, out, ran, _ = profiled
    events = open_run(str(out)).framework()
    train = _rows(events, kind=STEP, mode=TRAIN)
    evals = _rows(events, kind=STEP, mode=EVAL)
    assert len(train) == ran["train"] == 16 and len(evals) == ran["eval"] == 8
    assert [r["step"] for r in train] == list(range(16)) and [r["step"] for r in evals] == list(range(8))
    for mode, n in ((TRAIN, 16), (EVAL, 8)):
        waits = _rows(events, kind=DATA_WAIT, mode=mode)
        assert sorted(r["step"] for r in waits) == list(range(n))
    for kind in (FORWARD, BACKWARD, OPTIMIZER):
        assert {r["step"] for r in _rows(events, kind=kind, mode=TRAIN)} == set(range(16))
    assert not _rows(events, kind=BACKWARD, mode=EVAL)
    by_step = {r["step"]: r for r in train}
    for r in _rows(events, mode=TRAIN):
        if r["kind"] != STEP:
            s = by_step[r["step"]]
            assert s["start_us"] <= r["start_us"] <= r["end_us"] <= s["end_us"], r
    assert {r["rank"] for r in train} == {0} and len({r["pid"] for r in train}) == 1


def test_the_planted_slow_steps_stand_out(profiled):
    _, out, _, _ = profiled
    train = _rows(open_run(str(out)).framework(kinds=[STEP]), mode=TRAIN)
    durations = {r["step"]: r["end_us"] - r["start_us"] for r in train}
    typical = statistics.median(durations.values())
    assert durations[3] > 200_000 > typical * 4 and durations[7] > 200_000
    assert sorted(durations, key=durations.get)[-2:] in ([3, 7], [7, 3])


def test_data_loader_settings_and_worker_pids_are_recorded(profiled):
    _, out, _, _ = profiled
    loaders = [json.loads(r["args"]) for r in _rows(open_run(str(out)).framework(kinds=["dataloader"]))]
    train = next(a for a in loaders if a["num_workers"] == 2)
    assert train["batch_size"] == 8 and train["persistent_workers"] is True and train["prefetch_factor"] == 2
    assert train["pin_memory"] is False and len(train["worker_pids"]) == 2
    assert any(a["num_workers"] == 0 and a["worker_pids"] == [] for a in loaders)


def test_the_detailed_window_covers_step_5_with_aten_operators(profiled):
    _, out, _, _ = profiled
    run = open_run(str(out))
    (window,) = run.profiles("detailed")
    assert (window["first_step"], window["last_step"], window["status"]) == (5, 5, "complete")
    trace = json.loads(gzip.decompress((out / window["path"] / "trace.json.gz").read_bytes()))
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("aten::") for n in names)
    assert "ProfilerStep#5" in names  # Perfetto's and HTA's step markers, numbered as the job's steps
    step5 = _rows(run.framework(kinds=[STEP]), mode=TRAIN, step=5)[0]
    base_us = trace.get("baseTimeNanoseconds", 0) / 1000  # torch's traces count from this base
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    assert ops and all(step5["start_us"] - 1000 <= base_us + e["ts"] <= step5["end_us"] + 1000 for e in ops)
    operators = run.operators(window=window["window"]).to_pylist()
    addmm = next(r for r in operators if r["operator"] == "aten::addmm")
    assert addmm["calls"] == 2 and addmm["self_us"] <= addmm["total_us"]  # two Linear layers, one step


def test_python_profiles_cover_steps_9_to_11(profiled):
    _, out, _, _ = profiled
    run = open_run(str(out))
    (window,) = run.profiles("python")
    assert (window["first_step"], window["last_step"]) == (9, 11)
    assert (out / window["path"] / "profile.pstats").exists()
    functions = run.functions(window=window["window"]).to_pylist()
    assert any(r["function"] == "backward" for r in functions)


def test_training_results_are_unchanged_by_profiling(profiled, tmp_path):
    tmp, _, ran, _ = profiled
    plain = tmp_path / "plain.json"
    subprocess.run([sys.executable, str(tmp / "train_and_eval.py"), str(plain)], check=True, timeout=120)
    assert json.loads(plain.read_text()) == ran


def test_a_loop_without_a_data_loader_gets_coarser_steps_and_one_warning(tmp_path):
    script = tmp_path / "no_loader.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(5):\n"
        "    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()\n")
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(tmp_path / "run"), "--", sys.executable, str(script))
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("no DataLoader iteration seen") == 1
    steps = _rows(open_run(str(tmp_path / "run")).framework(kinds=[STEP]), mode=TRAIN)
    assert [r["step"] for r in steps] == list(range(5))


def test_a_script_that_fails_fails_the_same_way(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)\n"
        "for i, xb in enumerate(loader):\n"
        "    m(xb).sum().backward()\n"
        "    if i == 2:\n"
        "        raise RuntimeError('boom in step 2')\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(tmp_path / "run"), "--", sys.executable, str(script))
    assert p.returncode == plain.returncode == 1
    assert "RuntimeError: boom in step 2" in p.stderr
    steps = _rows(open_run(str(tmp_path / "run")).framework(kinds=[STEP]), mode=TRAIN)
    assert [r["step"] for r in steps] == [0, 1, 2]  # the failing step is kept, ended at its last phase


def test_dataloader_profiling_times_fetches_in_the_workers(profiled):
    _, out, _, _ = profiled
    run = open_run(str(out))
    events = run.framework(kinds=["fetch", "dataloader", "profiling"]).to_pylist()
    window = next(e for e in events if e["kind"] == "profiling" and e["name"] == "dataloader"
                  and json.loads(e["args"])["status"] != "started")
    assert json.loads(window["args"])["first_step"] == 1 and json.loads(window["args"])["last_step"] == 6
    workers = next(json.loads(e["args"])["worker_pids"] for e in events
                   if e["kind"] == "dataloader" and json.loads(e["args"])["num_workers"] == 2)
    fetches = [e for e in events if e["kind"] == "fetch"]
    assert fetches and {e["pid"] for e in fetches} <= set(workers)
    for e in fetches:
        info = json.loads(e["args"])
        assert e["name"] == f"worker{info['worker']}" and info["samples"] == 8 and e["end_us"] >= e["start_us"]
    assert not run.profiles("dataloader")  # timing only: nothing to store besides the events


def test_a_compiled_model_is_not_recompiled_or_warned_about(tmp_path):
    script = tmp_path / "compiled.py"
    script.write_text(
        "import torch\n"
        "import torch._dynamo.utils as u\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))\n"
        "compiled = torch.compile(model, backend='eager')\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for xb in torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=8):\n"
        "    opt.zero_grad(); compiled(xb).sum().backward(); opt.step()\n"
        "print('graphs', u.counters['stats']['unique_graphs'])\n")
    p = run_cli(tmp_path, "run", "--report", "off", "--out", str(tmp_path / "run"), "--", sys.executable, str(script))
    assert p.returncode == 0, p.stderr
    assert b"graphs 1" in p.stdout  # discovery's global hooks came off before dynamo guarded on them
    assert "global hooks" not in p.stderr
    events = open_run(str(tmp_path / "run")).framework()
    assert len(_rows(events, kind=STEP, mode=TRAIN)) == 8
    assert {r["name"] for r in _rows(events, kind=FORWARD)} == {"OptimizedModule"}


def test_a_job_terminated_by_sigterm_keeps_its_steps_and_dies_the_same_way(tmp_path):
    from ..collect._support import Background, wait_until

    script = tmp_path / "long.py"
    script.write_text(
        "import os, sys, time, torch\n"
        "m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "log = open(sys.argv[1], 'w')\n"
        "for i, xb in enumerate(torch.utils.data.DataLoader(torch.randn(400000, 4), batch_size=4)):\n"
        "    opt.zero_grad(); m(xb).sum().backward(); opt.step()\n"
        "    log.write(f'{i} {time.time()}\\n'); log.flush()\n")
    job = Background(tmp_path, "run", "--report", "off", "--out", str(tmp_path / "run"), "--flush-interval", "1", "--",
                     sys.executable, str(script), str(tmp_path / "done"))

    def finished() -> list[tuple[int, float]]:
        try:
            lines = (tmp_path / "done").read_text().splitlines()[:-1]  # the last line may be half written
        except OSError:
            return []
        return [(int(i), float(t)) for i, t in (line.split() for line in lines)]

    try:
        wait_until(lambda: len(finished()) > 300 and finished()[-1][1] - finished()[0][1] > 2.5, 60,
                   what="2.5 s of steps")
        killed_at = time.time()
        job.proc.terminate()  # forwarded to the job by `stallwatch run`
        assert job.wait(60) == 143, job.stderr
    finally:
        job.kill_all()
    # Steps this short are sampled: the timed ones and the counted ones (`untimed`) take each number once.
    rows = _rows(open_run(str(tmp_path / "run")).framework(kinds=[STEP, UNTIMED]), mode=TRAIN)
    steps = [r["step"] for r in rows if r["kind"] == STEP]
    for r in rows:
        if r["kind"] == UNTIMED:
            args = json.loads(r["args"])
            steps.extend(range(args["first"], args["first"] + args["steps"]))
    assert sorted(steps) == list(range(len(steps)))
    # No signal handler: what the job queued in its last send interval (0.2 s) may be lost, nothing before; while
    # steps are sampled, also the count of the stretch it was in (under a second).
    settled = [i for i, t in finished() if t < killed_at - 1.5]
    assert settled and len(steps) >= settled[-1] + 1, (len(steps), settled[-1])


NATIVE_WAIT = (
    "import ctypes, sys, torch\n"
    "m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
    "for xb in torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=4):\n"
    "    opt.zero_grad(); m(xb).sum().backward(); opt.step()\n"
    "lock = ctypes.create_string_buffer(64)  # a zeroed pthread mutex; locking it twice blocks in native code\n"
    "libc = ctypes.CDLL(None)\n"
    "libc.pthread_mutex_lock(lock)\n"
    "open(sys.argv[1], 'w').close()\n"
    "libc.pthread_mutex_lock(lock)\n")


def test_sigterm_inside_a_long_native_call_ends_the_job_as_without_stallwatch(tmp_path):
    """No Python SIGTERM handler in the job: one would wait for the native call to return (here: never)."""
    from ..collect._support import Background, wait_until

    script = tmp_path / "native.py"
    script.write_text(NATIVE_WAIT)
    bare = subprocess.Popen([sys.executable, str(script), str(tmp_path / "bare-ready")])
    try:
        wait_until(lambda: (tmp_path / "bare-ready").exists(), 60, what="the bare job to block")
        bare.terminate()
        assert bare.wait(30) == -15
    finally:
        bare.kill()
    job = Background(tmp_path, "run", "--report", "off",
                     "--out", str(tmp_path / "run"), "--", sys.executable, str(script),
                     str(tmp_path / "ready"))
    try:
        wait_until(lambda: (tmp_path / "ready").exists(), 60, what="the job to block")
        time.sleep(1.0)  # the events' thread runs on while the job is blocked: its steps are sent
        job.proc.terminate()
        assert job.wait(30) == 143, job.stderr  # was: never (the handler waited for the native call)
    finally:
        job.kill_all()
    steps = _rows(open_run(str(tmp_path / "run")).framework(kinds=[STEP]), mode=TRAIN)
    assert len(steps) == 16


def test_the_summary_and_info_show_steps_and_windows(profiled):
    tmp, out, _, p = profiled
    for text in (p.stderr, run_cli(tmp, "info", str(out)).stdout.decode()):
        assert "TRAIN     16" in text and "EVAL       8" in text
        assert "detailed" in text and "steps 5-5" in text and "steps 9-11" in text


def test_the_jobs_own_sitecustomize_still_runs_and_auto_can_be_turned_off(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['MY_SITECUSTOMIZE'] = 'ran'\n")
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys, torch\n"
        "print('site:', os.environ.get('MY_SITECUSTOMIZE'))\n"
        "m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for xb in torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4):\n"
        "    opt.zero_grad(); m(xb).sum().backward(); opt.step()\n")
    from ..collect._support import Background

    # the two runs are independent (a run folder each): run side by side
    jobs = {auto: Background(tmp_path, "run", "--report", "off", "--out", str(tmp_path / f"run-{auto}"), "--",
                             sys.executable, str(script), env={"PYTHONPATH": str(own), "STALLWATCH_AUTO": auto},
                             name=f"launcher-{auto}")
            for auto in ("1", "0")}
    try:
        codes = {auto: job.wait(90) for auto, job in jobs.items()}
    finally:
        for job in jobs.values():
            job.kill_all()
    for auto, expected in (("1", 4), ("0", 0)):
        assert codes[auto] == 0, jobs[auto].stderr
        assert b"site: ran" in jobs[auto].stdout
        assert len(_rows(open_run(str(tmp_path / f"run-{auto}")).framework(kinds=[STEP]), mode=TRAIN)) == expected
