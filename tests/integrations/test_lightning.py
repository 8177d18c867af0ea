"""The Lightning callback on real Lightning trainings: exact TRAIN and EVAL steps under `stallwatch run`
(added without code, or given by the user) and in a run the callback records itself."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch")

from stallwatch.integrations import Recorder  # noqa: E402
from stallwatch.store.reader import open_run  # noqa: E402

from ..collect._support import STALLWATCH  # noqa: E402
from . import JOB_ENV, assert_steps, job_env  # noqa: E402

# 2 epochs of 7 training batches, a validation loop of 3 batches after each (and Lightning's sanity check
# of 2 validation batches before training); "explicit" and "own" then test on 2 batches. It writes what
# the trainer ran, counted by a plain callback of its own, to the JSON file named by its second argument.
SCRIPT = '''
import json, sys
import torch
import {package} as pl
from torch.utils.data import DataLoader, TensorDataset

how, ran_path = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(1)

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)
    def forward(self, x):
        return self.layer(x)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)
    def validation_step(self, batch, batch_idx):
        self(batch[0])
    def test_step(self, batch, batch_idx):
        self(batch[0])
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

class Count(pl.Callback):
    def __init__(self):
        self.ran = {{"train": 0, "eval": 0, "sanity": 0}}
    def on_train_batch_end(self, *args):
        self.ran["train"] += 1
    def on_validation_batch_end(self, trainer, *args):
        self.ran["sanity" if trainer.sanity_checking else "eval"] += 1
    def on_test_batch_end(self, *args):
        self.ran["eval"] += 1

def loader(batches):
    g = torch.Generator().manual_seed(batches)
    return DataLoader(TensorDataset(torch.randn(4 * batches, 8, generator=g), torch.randint(0, 2, (4 * batches,),
                      generator=g)), batch_size=4)

count = Count()
callbacks = [count]
if how != "zero":  # "zero" never imports stallwatch
    from stallwatch.integrations.lightning import StallwatchCallback
    callbacks.append(StallwatchCallback(out=sys.argv[3]) if how == "own" else StallwatchCallback())
trainer = pl.Trainer(max_epochs=2, callbacks=callbacks, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
model = Model()
trainer.fit(model, loader(7), loader(3))
if how != "zero":
    trainer.test(model, loader(2), verbose=False)
count.ran["ours"] = [type(c).__module__ for c in trainer.callbacks if type(c).__name__ == "StallwatchCallback"]
json.dump(count.ran, open(ran_path, "w"))
'''


def _script(tmp: Path, package: str = "lightning.pytorch") -> Path:
    path = tmp / f"train_{package.replace('.', '_')}.py"
    path.write_text(SCRIPT.format(package=package))
    return path


IMPORTS_CHECK = ("import sys, stallwatch.integrations.lightning as m\n"
                 "assert not {'lightning', 'pytorch_lightning', 'torch'} & set(sys.modules), sorted(sys.modules)\n"
                 "import pytorch_lightning\n"
                 "assert m.StallwatchCallback.__mro__[-2].__module__.startswith('pytorch_lightning')\n"
                 "assert 'lightning.pytorch' not in sys.modules\n")


class _Job:
    """A command started in the background in `tmp`, its output going to files there."""

    def __init__(self, tmp: Path, cmd: list[str], env: dict[str, str]) -> None:
        self.tmp, self.err_path = tmp, tmp / "job.stderr"
        with open(tmp / "job.stdout", "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=tmp)

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        """Its exit code and stderr, once it ended."""
        code = self.proc.wait(timeout=timeout)
        return code, self.err_path.read_text(errors="replace")


def _start_under_run(tmp: Path, *args: str) -> _Job:
    """`stallwatch run ARGS` as `run_cli` runs it (in `tmp`, JOB_ENV over this environment), in the background."""
    return _Job(tmp, [*STALLWATCH, "run", *args], {**os.environ, **JOB_ENV})


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The module's Lightning trainings, each a job of its own in a folder of its own, started together: each one
    is mostly a single-threaded `import lightning`, so they run side by side. Each test waits for its own."""
    started: dict[str, _Job] = {}
    for key, how, package in (("zero", "zero", "lightning.pytorch"), ("explicit", "explicit", "lightning.pytorch"),
                              ("old-package", "zero", "pytorch_lightning")):
        if package == "pytorch_lightning" and importlib.util.find_spec("pytorch_lightning") is None:
            continue
        tmp = tmp_path_factory.mktemp(key)
        started[key] = _start_under_run(tmp, "--report", "off", "--out", str(tmp / f"run-{how}"), "--interval",
                                        "200ms", "--", sys.executable, str(_script(tmp, package)), how,
                                        str(tmp / f"ran-{how}.json"))
    tmp = tmp_path_factory.mktemp("own")
    started["own"] = _Job(tmp, [sys.executable, str(_script(tmp)), "own", str(tmp / "ran.json"), str(tmp / "own")],
                          job_env())
    tmp = tmp_path_factory.mktemp("closure")
    (tmp / "job.py").write_text(CLOSURE_SCRIPT)
    started["closure"] = _start_under_run(tmp, "--report", "off", "--out", str(tmp / "run"), "--", sys.executable,
                                          str(tmp / "job.py"), str(tmp / "spans.json"))
    tmp = tmp_path_factory.mktemp("imports")
    started["imports"] = _Job(tmp, [sys.executable, "-c", IMPORTS_CHECK], job_env())
    yield started
    for job in started.values():
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait(30)


def _under_run(jobs: dict[str, _Job], key: str, how: str) -> tuple[Path, dict]:
    job = jobs[key]
    code, stderr = job.finish()
    assert code == 0, stderr
    return job.tmp / f"run-{how}", json.loads((job.tmp / f"ran-{how}.json").read_text())


@pytest.mark.timeout(120)
def test_zero_code_under_stallwatch_run_gives_each_batch_as_one_step(jobs):
    """A script that never imports stallwatch: the callback is added, sanity-check batches are no steps."""
    out, ran = _under_run(jobs, "zero", "zero")
    assert ran == {"train": 14, "eval": 6, "sanity": 2, "ours": ["stallwatch.integrations.lightning"]}
    seen = assert_steps(out, train=14, evals=6)
    for step in seen["steps"]["EVAL"]:
        assert [e["kind"] for e in seen["inside"][("EVAL", step["step"])]].count("data_wait") == 1


@pytest.mark.timeout(120)
def test_the_users_callback_under_stallwatch_run_is_the_only_one(jobs):
    out, ran = _under_run(jobs, "explicit", "explicit")
    assert ran["ours"] == ["stallwatch.integrations.lightning"]  # zero-code added no second one
    assert_steps(out, train=14, evals=ran["eval"])
    assert ran["eval"] == 6 + 2  # validation, then trainer.test


@pytest.mark.timeout(120)
def test_the_callback_records_a_run_itself_outside_stallwatch_run(jobs):
    out = jobs["own"].tmp / "own"
    code, stderr = jobs["own"].finish()
    assert code == 0, stderr
    # fit is recorded into `out`; trainer.test, a second recording into the same `out`, is its own node there
    # (the default name is taken: said, never refused, so the job always runs)
    assert "is taken" in stderr
    nodes = sorted(json.loads(f.read_text())["node"] for f in (out / "nodes").glob("*.json"))
    assert len(nodes) == 2
    events = open_run(str(out)).framework().to_pylist()
    per_node = {n: Counter(e["mode"] for e in events if e["kind"] == "step" and e["node"] == n) for n in nodes}
    assert sorted(per_node.values(), key=len) == [Counter({"EVAL": 2}), Counter({"TRAIN": 14, "EVAL": 6})]
    for f in (out / "nodes").glob("*.json"):
        assert json.loads(f.read_text())["status"] == "finished"
    assert open_run(str(out)).framework().num_rows > 0


@pytest.mark.timeout(120)
def test_pytorch_lightning_the_old_package_name(jobs):
    pytest.importorskip("pytorch_lightning")
    out, ran = _under_run(jobs, "old-package", "zero")
    assert ran["ours"] == ["stallwatch.integrations.lightning"] and ran["train"] == 14
    assert_steps(out, train=14, evals=6)


def test_importing_the_module_imports_no_lightning(jobs):
    code, stderr = jobs["imports"].finish()  # IMPORTS_CHECK, run in a fresh interpreter
    if "No module named 'pytorch_lightning'" in stderr:
        pytest.skip("pytorch_lightning is not installed")
    assert code == 0, stderr


class _Exploding:
    def __getattr__(self, name):
        raise RuntimeError(f"tracker.{name} broke")


def test_no_hook_raises_into_training(monkeypatch):
    """A recording that cannot start, a tracker that fails, hooks called with whatever: training never sees
    it, and it is said once."""
    from stallwatch import log
    from stallwatch.integrations.lightning import callback_class

    said: list[str] = []
    monkeypatch.setattr(log, "_said", set())
    monkeypatch.setattr(log.logger, "log", lambda level, msg, *args: said.append(msg % args))
    monkeypatch.setattr(Recorder, "start", lambda self: (_ for _ in ()).throw(OSError("disk full")))
    monkeypatch.setattr(Recorder, "tracker", lambda self: _Exploding())
    callback = callback_class("lightning.pytorch")()
    callback.setup(None, None, "fit")
    for i in range(3):
        callback.on_train_batch_start(None, None, None, i)
        callback.on_train_batch_end(None, None, None, None, i)
        callback.on_validation_batch_start(object(), None, None, i, 0)
        callback.on_validation_batch_end(None, None, None, None, i)
    callback.on_sanity_check_start(None, None)
    callback.on_sanity_check_end(None, None)
    callback.teardown(None, None, "fit")
    callback.on_exception(None, None, ValueError())
    assert len([m for m in said if "disk full" in m]) == 1
    assert len([m for m in said if "broke" in m]) == 1, said


def test_a_bad_setting_is_refused_when_the_callback_is_made():
    from stallwatch.integrations.lightning import callback_class

    with pytest.raises((ValueError, TypeError)):
        callback_class("lightning.pytorch")(sample_interval_ms=-5)


# Lightning's automatic optimization runs `training_step` inside `optimizer.step(closure)`. This one logs and
# does 3 ms of its own CPU work there, and writes when each `training_step` ran (µs, the events' clock).
CLOSURE_SCRIPT = '''
import json, sys, time
import torch
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
spans = []

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)
    def forward(self, x):
        return self.layer(x)
    def training_step(self, batch, batch_idx):
        t0 = time.time_ns() // 1000
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        end = time.perf_counter() + 0.003
        while time.perf_counter() < end:
            pass
        spans.append((t0, time.time_ns() // 1000))
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

g = torch.Generator().manual_seed(1)
data = DataLoader(TensorDataset(torch.randn(40, 8, generator=g), torch.randint(0, 2, (40,), generator=g)), batch_size=4)
trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu", devices=1)
trainer.fit(Model(), data)
json.dump(spans, open(sys.argv[1], "w"))
'''


@pytest.mark.timeout(120)
def test_a_closures_own_code_is_not_optimizer_time(jobs):
    """The optimizer's phases are the update around the closure, never inside `training_step` (its logging and
    CPU work are the loop's own code): the bug-report model read "optimizer 85 %" for a 0.25 ms SGD update."""
    out, spans_path = jobs["closure"].tmp / "run", jobs["closure"].tmp / "spans.json"
    code, stderr = jobs["closure"].finish()
    assert code == 0, stderr
    spans = json.loads(spans_path.read_text())
    seen = assert_steps(out, train=20, evals=0)
    assert len(spans) == 20
    for step, (t0, t1) in zip(seen["steps"]["TRAIN"], spans):
        assert step["start_us"] <= t0 <= t1 <= step["end_us"]
        inside = seen["inside"][("TRAIN", step["step"])]
        optimizer = [e for e in inside if e["kind"] == "optimizer"]
        assert len(optimizer) == 2  # before the closure and after it
        for e in optimizer:
            assert e["end_us"] <= t0 or e["start_us"] >= t1, (e, (t0, t1))
