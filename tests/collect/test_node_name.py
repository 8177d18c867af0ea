"""A machine's default node name, from the launcher's environment where it has one (Slurm, Kubernetes, a node
rank from torchrun, PyTorchJob or Lightning), else the host name; and the names tried when it is taken."""

from __future__ import annotations

import pytest

from stallwatch.collect.node_name import clean, default_node_name, fallback_names


@pytest.mark.parametrize("env, command, expected", [
    ({}, [], "vm"),
    ({"SLURMD_NODENAME": "gpu-a017", "SLURM_NODEID": "3"}, [], "gpu-a017"),
    ({"SLURM_NODEID": "3", "SLURM_NNODES": "4"}, [], "vm-node3"),
    ({"POD_NAME": "trainer-worker-2"}, [], "trainer-worker-2"),
    ({"NODE_RANK": "1"}, [], "vm-node1"),
    ({"PET_NODE_RANK": "0", "PET_NNODES": "4"}, [], "vm-node0"),
    ({"NODE_RANK": "0"}, [], "vm"),  # one node's rank 0 says nothing
    ({}, ["torchrun", "--nnodes", "2", "--node-rank", "1", "train.py"], "vm-node1"),
    ({}, ["torchrun", "--nnodes=2", "--node_rank=0", "train.py"], "vm-node0"),
    ({}, ["python", "-m", "torch.distributed.run", "--nnodes", "1:4", "--node-rank", "0", "t.py"], "vm-node0"),
    ({}, ["python", "train.py", "--node-rank", "1"], "vm"),  # a script's own flag, not torchrun's
    ({}, ["torchrun", "--nproc-per-node", "2", "train.py"], "vm"),
])
def test_default_names(env, command, expected):
    assert default_node_name(command, env, hostname="vm.cluster.local") == expected


def test_names_are_always_valid():
    assert clean("..bad name/with:stuff") == "bad-name-with-stuff"
    assert clean("") == "node" and len(clean("x" * 500)) == 128
    assert default_node_name([], {"POD_NAME": "../../etc"}, hostname="h") == "etc"
    assert default_node_name([], {}, hostname="10.0.0.7") == "10.0.0.7"  # an address keeps its dots


def test_fallbacks():
    assert fallback_names("vm")[:3] == ["vm-2", "vm-3", "vm-4"]
    assert all(len(n) <= 128 for n in fallback_names("x" * 128))
