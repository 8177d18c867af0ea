"""The Hugging Face Trainer callback on real (tiny, built-in-code, never downloaded) Trainer runs: one TRAIN
step per optimizer step, gradient accumulation included, and one EVAL step per evaluation batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from ..collect._support import stallwatch as run_cli  # noqa: E402
from . import JOB_ENV, assert_steps, job_env  # noqa: E402

MAX_STEPS, EVAL_STEPS, EVAL_BATCHES = 6, 3, 3
# A 1-layer BERT from a config, 4 optimizer steps an epoch (so the 6 steps cross an epoch end), an
# evaluation of 3 batches every 3 steps. It writes what the Trainer ran to the JSON file named by argv[3].
SCRIPT = '''
import json, sys
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

how, accumulate, ran_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)

class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(n)
        self.ids, self.labels = torch.randint(0, 100, (n, 8), generator=g), torch.randint(0, 2, (n,), generator=g)
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {{"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.labels[i]}}

class Count(TrainerCallback):
    eval_batches = 0
    def on_prediction_step(self, *args, **kwargs):
        self.eval_batches += 1

model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    num_attention_heads=2, intermediate_size=37, max_position_embeddings=16))
args = TrainingArguments(output_dir=ran_path + "-trainer", max_steps={max_steps}, per_device_train_batch_size=4,
    per_device_eval_batch_size=4, gradient_accumulation_steps=accumulate, eval_strategy="steps",
    eval_steps={eval_steps}, report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
    dataloader_num_workers=0, disable_tqdm=True)
count = Count()
callbacks = [count]
if how != "zero":  # "zero" never imports stallwatch
    from stallwatch.integrations.transformers import StallwatchCallback
    callbacks.append(StallwatchCallback(out=sys.argv[4]) if how == "own" else StallwatchCallback())
trainer = Trainer(model=model, args=args, train_dataset=Data(16 * accumulate), eval_dataset=Data(4 * {eval_batches} - 2),
                  callbacks=callbacks)
trainer.train()
if how == "explicit":
    trainer.evaluate()
json.dump({{"train": trainer.state.global_step, "eval": count.eval_batches,
           "ours": [type(c).__module__ for c in trainer.callback_handler.callbacks
                    if type(c).__name__ == "StallwatchCallback"]}}, open(ran_path, "w"))
'''


def _script(tmp: Path) -> Path:
    path = tmp / "train_bert.py"
    path.write_text(SCRIPT.format(max_steps=MAX_STEPS, eval_steps=EVAL_STEPS, eval_batches=EVAL_BATCHES))
    return path


def _under_run(tmp: Path, how: str, accumulate: int) -> tuple[Path, dict]:
    out, ran = tmp / f"run-{how}", tmp / f"ran-{how}.json"
    p = run_cli(tmp, "run", "--out", str(out), "--interval", "200ms", "--",
                sys.executable, str(_script(tmp)), how, str(accumulate), str(ran), env=JOB_ENV, timeout=120)
    assert p.returncode == 0, p.stderr
    return out, json.loads(ran.read_text())


def _without_wait(seen: dict, mode: str) -> set[int]:
    return {s["step"] for s in seen["steps"][mode]
            if "data_wait" not in [e["kind"] for e in seen["inside"][(mode, s["step"])]]}


@pytest.mark.timeout(120)
def test_zero_code_one_step_per_optimizer_step_and_per_eval_batch(tmp_path):
    out, ran = _under_run(tmp_path, "zero", accumulate=1)
    assert ran == {"train": MAX_STEPS, "eval": 2 * EVAL_BATCHES, "ours": ["stallwatch.integrations.transformers"]}
    seen = assert_steps(out, train=MAX_STEPS, evals=2 * EVAL_BATCHES)
    # accelerate fetches one batch ahead: an evaluation's last batch was fetched during the one before, and
    # the request that found the loader empty is no data wait of an EVAL step; every other step has one
    assert _without_wait(seen, "EVAL") <= {EVAL_BATCHES - 1, 2 * EVAL_BATCHES - 1}
    assert _without_wait(seen, "TRAIN") == set()


@pytest.mark.timeout(120)
def test_gradient_accumulation_steps_are_optimizer_steps_with_each_micro_batch(tmp_path):
    """The user's own callback, under `stallwatch run`: zero-code adds no second one; a standalone
    evaluate() after train() is recorded too."""
    out, ran = _under_run(tmp_path, "explicit", accumulate=2)
    assert ran == {"train": MAX_STEPS, "eval": 3 * EVAL_BATCHES, "ours": ["stallwatch.integrations.transformers"]}
    seen = assert_steps(out, train=MAX_STEPS, evals=3 * EVAL_BATCHES, forwards_per_train_step=2)
    for step in seen["steps"]["TRAIN"]:  # both micro-batches' fetches are the step's data wait
        assert [e["kind"] for e in seen["inside"][("TRAIN", step["step"])]].count("data_wait") >= 2


@pytest.mark.timeout(120)
def test_the_callback_records_a_run_itself_outside_stallwatch_run(tmp_path):
    out, ran_path = tmp_path / "own", tmp_path / "ran.json"
    p = subprocess.run([sys.executable, str(_script(tmp_path)), "own", "1", str(ran_path), str(out)],
                       env=job_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(ran_path.read_text())["train"] == MAX_STEPS
    assert_steps(out, train=MAX_STEPS, evals=2 * EVAL_BATCHES)
    node = json.loads(next((out / "nodes").glob("*.json")).read_text())
    assert node["status"] == "finished"


def test_import_transformers_stays_cheap_under_stallwatch_run(tmp_path):
    """The hook waits for `transformers.trainer`: `import transformers` alone loads no trainer and none of ours."""
    code = ("import sys, transformers\n"
            "assert 'transformers.trainer' not in sys.modules\n"
            "assert not [m for m in sys.modules if m.startswith('stallwatch.integrations')]\n"
            "from transformers import Trainer\n"
            "assert 'stallwatch.integrations.transformers' in sys.modules\n"
            "assert Trainer.__init__.__stallwatch_original__\n")
    p = run_cli(tmp_path, "run", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", code, env=JOB_ENV)
    assert p.returncode == 0, p.stderr


class _Exploding:
    def __getattr__(self, name):
        raise RuntimeError(f"tracker.{name} broke")


class _FakeTrainer:
    is_in_train = True

    def get_batch_samples(self, iterator, n, device):
        return ["batch"] * n, None

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        return "loss", "logits", "labels"


def test_no_event_or_wrapper_raises_into_training(monkeypatch):
    """A recording that cannot start and a tracker that fails: the Trainer's methods still return what they
    return, no event raises, and it is said once."""
    from stallwatch import log
    from stallwatch.integrations import Recorder
    from stallwatch.integrations.transformers import StallwatchCallback

    said: list[str] = []
    monkeypatch.setattr(log, "_said", set())
    monkeypatch.setattr(log.logger, "log", lambda level, msg, *args: said.append(msg % args))
    monkeypatch.setattr(Recorder, "start", lambda self: (_ for _ in ()).throw(OSError("disk full")))
    monkeypatch.setattr(Recorder, "tracker", lambda self: _Exploding())
    trainer, callback = _FakeTrainer(), StallwatchCallback()
    callback.attach(trainer)
    callback.on_train_begin(None, None, None)
    for _ in range(3):
        assert trainer.get_batch_samples(iter([]), 2, "cpu") == (["batch", "batch"], None)
        callback.on_step_begin(None, None, None)
        callback.on_step_end(None, None, None)
        assert trainer.prediction_step(None, {}, False) == ("loss", "logits", "labels")
        callback.on_prediction_step(None, None, None)
    callback.on_evaluate(None, None, None, metrics={})
    callback.on_train_end(None, None, None)
    assert len([m for m in said if "disk full" in m]) == 1
    assert len([m for m in said if "broke" in m]) == 1, said


class _Marks:
    def __init__(self):
        self.calls: list[str] = []

    def begin_step(self, mode):
        self.calls.append(f"begin {mode}")

    def end_step(self):
        self.calls.append("end")


def test_a_second_callback_of_ours_on_the_same_trainer_marks_nothing(monkeypatch):
    """Two of ours on one Trainer (the user added one late): steps are marked once, not twice."""
    from stallwatch.integrations import Recorder
    from stallwatch.integrations.transformers import StallwatchCallback

    marks = _Marks()
    monkeypatch.setattr(Recorder, "start", lambda self: None)
    monkeypatch.setattr(Recorder, "tracker", lambda self: marks)
    trainer, callbacks = _FakeTrainer(), [StallwatchCallback(), StallwatchCallback()]
    for cb in callbacks:
        cb.attach(trainer)
    for _ in range(2):
        trainer.get_batch_samples(iter([]), 1, "cpu")
        for cb in callbacks:
            cb.on_step_begin(None, None, None)
        for cb in callbacks:
            cb.on_step_end(None, None, None)
    trainer.prediction_step(None, {}, False)
    for cb in callbacks:
        cb.on_prediction_step(None, None, None)
    assert marks.calls == ["begin TRAIN", "end", "begin TRAIN", "end", "begin EVAL", "end"]
