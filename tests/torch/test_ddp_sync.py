"""DDP's exposed all-reduce timed per step (torch/ddp_sync.py) in one process (a gloo group of one): an event per
backward that reduces, none under no_sync, the user's own communication hook still registered and run, and the
model's settings recorded once."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from stallwatch.records import COLLECTIVE
from stallwatch.torch.ddp_sync import CONFIG_KIND, SYNC_EVENT, GradientSyncTimer


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory):
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _now() -> int:
    return time.time_ns() // 1000


def _timer(model: DDP) -> tuple[GradientSyncTimer, list[tuple]]:
    emitted: list[tuple] = []
    timer = GradientSyncTimer(emitted.append, os.getpid(), _now)
    timer.found(model)
    return timer, emitted


def _step(timer: GradientSyncTimer, model: DDP, recorded: list[tuple]) -> None:
    loss = model(torch.randn(4, 8)).sum()
    t0 = _now()
    timer.begin((loss,), {})
    torch.autograd.backward(loss)
    t1 = _now()
    timer.end(t1, lambda *e: recorded.append((t0, t1, *e)))


def test_each_reducing_backward_records_its_exposed_all_reduce_and_no_sync_none(group):
    model = DDP(torch.nn.Linear(8, 8))
    timer, emitted = _timer(model)
    (config,) = emitted
    assert config[0] == CONFIG_KIND and json.loads(config[7])["bytes"] == (64 + 8) * 4
    assert json.loads(config[7])["device_type"] == "cpu" and json.loads(config[7])["world_size"] == 1
    recorded: list[tuple] = []
    for _ in range(4):  # the first one tells which parameter's gradient is ready last (DDP's own timing)
        _step(timer, model, recorded)
    with model.no_sync():
        _step(timer, model, recorded)
    assert len(recorded) == 3
    for t0, t1, kind, name, start, end, args in recorded:
        assert (kind, name, json.loads(args)) == (COLLECTIVE, SYNC_EVENT, {"bytes": 288})
        assert t0 <= start <= end == t1  # from the end of backward's computation to backward's return


def test_the_users_communication_hook_still_runs(group):
    model = DDP(torch.nn.Linear(8, 8))
    calls = []

    def hook(state, bucket):  # the user's own: counts, then DDP's default all-reduce
        calls.append(bucket.buffer().numel())
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return default_hooks.allreduce_hook(state, bucket)

    timer, _ = _timer(model)
    model.register_comm_hook(None, hook)  # after stallwatch found the model: nothing of ours is in the way
    recorded: list[tuple] = []
    for _ in range(3):
        _step(timer, model, recorded)
    assert calls == [72, 72, 72] and len(recorded) == 2


def test_uninstall_takes_the_parameters_hook_off(group):
    model = DDP(torch.nn.Linear(8, 8))
    timer, _ = _timer(model)
    recorded: list[tuple] = []
    for _ in range(2):
        _step(timer, model, recorded)
    timer.close()
    _step(timer, model, recorded)
    assert len(recorded) == 1 and not any(p._post_accumulate_grad_hooks for p in model.parameters())


def test_a_model_on_another_device_is_not_timed_per_step(group):
    model = DDP(torch.nn.Linear(8, 8))
    model.device_type = "cuda"  # as a CUDA model reports itself: the host does not wait for NCCL
    timer, emitted = _timer(model)
    recorded: list[tuple] = []
    for _ in range(2):
        _step(timer, model, recorded)
    assert recorded == [] and json.loads(emitted[0][7])["device_type"] == "cuda"
