"""This machine's name in a run, when `--node` is not given: from the launcher's environment where it has one
(a Slurm node, a Kubernetes pod, a node rank from torchrun, a PyTorchJob or Lightning), else the host name.
Two machines of one job may share a host name (containers, copied images): the name is only a first choice,
and the claim in the run (`nodes/<name>.json`, created atomically) picks the next free one."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
RANK_VARIABLES = ("NODE_RANK", "PET_NODE_RANK", "GROUP_RANK")  # Lightning/torchrun, PyTorchJob (elastic), torch
NODES_VARIABLES = ("PET_NNODES", "NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def clean(name: str) -> str:
    """A valid node name (1-128 of letters, digits, '.', '_', '-', starting with a letter or digit)."""
    text = _UNSAFE.sub("-", name).lstrip("._-")[:128]
    return text or "node"


def default_node_name(command: Sequence[str] = (), environ: Mapping[str, str] | None = None,
                      hostname: str | None = None) -> str:
    """The machine's own name (Slurm's node name, a pod's name, else the host name), with `-node<rank>` when
    the job is one of several nodes and says which (NODE_RANK, PET_NODE_RANK, GROUP_RANK, SLURM_NODEID, or
    torchrun's --node-rank with --nnodes > 1)."""
    env = os.environ if environ is None else environ
    base = env.get("SLURMD_NODENAME") or env.get("POD_NAME") or env.get("K8S_POD_NAME") \
        or (hostname if hostname is not None else socket.gethostname())
    base = clean(base)
    if "." in base and not base.replace(".", "").isdigit():  # a domain name: its host label (an address stays)
        base = clean(base.split(".")[0])
    rank, nodes = _node_rank(command, env)
    if rank is not None and (rank > 0 or (nodes or 0) > 1):
        return clean(f"{base}-node{rank}")
    return base


def fallback_names(name: str, limit: int = 256) -> list[str]:
    """The names tried after `name` when another machine holds it: name-2, name-3, …"""
    return [clean(f"{name[:120]}-{i}") for i in range(2, limit + 2)]


def _node_rank(command: Sequence[str], env: Mapping[str, str]) -> tuple[int | None, int | None]:
    rank = next((_int(env.get(v)) for v in RANK_VARIABLES if _int(env.get(v)) is not None), None)
    if rank is None and not env.get("SLURMD_NODENAME"):
        rank = _int(env.get("SLURM_NODEID"))
    nodes = next((_int(env.get(v)) for v in NODES_VARIABLES if _int(env.get(v)) is not None), None)
    if _is_torchrun(command):
        rank = _flag(command, "--node-rank", "--node_rank") if rank is None else rank
        nnodes = _flag_text(command, "--nnodes")
        if nnodes is not None:
            nodes = _int(nnodes.split(":")[-1])  # MIN:MAX elastic ranges: the most
    return rank, nodes


def _is_torchrun(command: Sequence[str]) -> bool:
    head = " ".join(command[:3])
    return any(t in head for t in _TORCHRUN)


def _flag(command: Sequence[str], *names: str) -> int | None:
    text = _flag_text(command, *names)
    return None if text is None else _int(text)


def _flag_text(command: Sequence[str], *names: str) -> str | None:
    for i, arg in enumerate(command):
        for name in names:
            if arg == name and i + 1 < len(command):
                return command[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None
