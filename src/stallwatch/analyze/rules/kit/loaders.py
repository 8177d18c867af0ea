"""Each DataLoader on its own: its settings (from its `dataloader` events), which data waits were its (their args
name the loader's `key`), and what the input rules may advise it. InputBound and Dataloader both read loaders
through here, so they judge the same loader by the same numbers and never advise two worker counts.

Runs recorded before data waits named their loader have no `key`: their waits are the rank's, unattributed."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from stallwatch.analyze.framework_frame import FrameworkColumns

UNKNOWN = -1  # a wait whose loader is not recorded (an older run, a Keras input)
# A batch that arrives faster than this from the main process is not worth a worker: handing it over from a worker
# process (pickling it, a pipe, a queue) costs about as much. The Dataloader rule's `min_wait_ms` default.
CHEAP_FETCH_MS = 1.0
# Fewer cores than this idle on the node, with the workers busy (BUSY_SHARE of them, median): the input pipeline
# is CPU-bound and more workers cannot help.
MIN_FREE_CORES = 0.5
BUSY_SHARE = 0.75
SETTINGS = ("key", "created_at", "dataset", "batch_size", "num_workers", "pin_memory", "prefetch_factor",
            "persistent_workers", "sampler")


def wait_loaders(cols: FrameworkColumns, rows: np.ndarray) -> np.ndarray:
    """Each data wait's loader key (UNKNOWN where its args do not name one), for the table rows `rows`."""
    if not len(rows):
        return np.empty(0, np.int64)
    args = cols.table["args"].take(pa.array(rows)).combine_chunks()
    if not isinstance(args.type, pa.DictionaryType):
        args = args.dictionary_encode()
    keys = np.array([_key(v) for v in args.dictionary.to_pylist()] or [UNKNOWN], np.int64)
    return keys[args.indices.fill_null(0).to_numpy(zero_copy_only=False)]


def _key(text: Any) -> int:
    if not text or not isinstance(text, str) or '"loader"' not in text:
        return UNKNOWN
    try:
        value = json.loads(text).get("loader")
    except (ValueError, AttributeError):
        return UNKNOWN
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else UNKNOWN


def settings(text: str) -> dict[str, Any] | None:
    """A PyTorch loader's settings from its `dataloader` event (None for another framework's or a bad one)."""
    try:
        args = json.loads(text) if text else {}
    except ValueError:
        return None
    if not isinstance(args, dict) or args.get("framework") is not None:
        return None
    return {k: args.get(k) for k in SETTINGS if k in args}


def add_waits(waits: dict[tuple[str, int, str], dict[int, list[int]]], cols: FrameworkColumns,
              mask: np.ndarray) -> None:
    """Sum the data waits under `mask` per (node, rank, mode) and loader: [µs waited, waits]."""
    for key, rows in cols.groups(mask):
        loaders = wait_loaders(cols, rows)
        dur = np.maximum(cols.end[rows] - cols.start[rows], 0)
        per = waits.setdefault(key, {})
        for loader in np.unique(loaders).tolist():
            mine = loaders == loader
            acc = per.setdefault(int(loader), [0, 0])
            acc[0] += int(dur[mine].sum())
            acc[1] += int(mine.sum())


def merge_waits(mine: dict[tuple, dict[int, list[int]]], theirs: dict[tuple, dict[int, list[int]]],
                node: str | None = None) -> None:
    for key, per in theirs.items():
        if node is not None and key[0] != node:
            continue
        into = mine.setdefault(key, {})
        for loader, (us, n) in per.items():
            acc = into.setdefault(loader, [0, 0])
            acc[0] += us
            acc[1] += n


def loader_modes(waits: dict[tuple[str, int, str], dict[int, list[int]]]) -> dict[tuple[str, int, int], str]:
    """Each known loader's mode: the mode of most of its waits (an evaluation loader is not the training one)."""
    best: dict[tuple[str, int, int], tuple[int, str]] = {}
    for (node, rank, mode), per in waits.items():
        for loader, (_, n) in per.items():
            if loader == UNKNOWN:
                continue
            k = (node, rank, loader)
            if k not in best or n > best[k][0]:
                best[k] = (n, mode)
    return {k: mode for k, (_, mode) in best.items()}


def suggested_workers(cores: int | None, ranks_on_node: int) -> int | None:
    """The worker count to advise a rank's loader (InputBound and Dataloader alike): its share of the node's cores
    (a training process that waits for data leaves its core to the workers)."""
    if not cores:
        return None
    return max(cores // max(ranks_on_node, 1), 1)


def label(entry: dict[str, Any], mode: str | None = None) -> str:
    """How a loader is named in advice: its role, data set and where it was built."""
    role = {"TRAIN": "training loader", "EVAL": "evaluation loader"}.get(str(mode), "loader")
    parts = [str(entry["dataset"])] if entry.get("dataset") else []
    if entry.get("created_at"):
        parts.append(_short(str(entry["created_at"])))
    return f"the {role} ({', '.join(parts)})" if parts else f"the {role}"


def _short(site: str) -> str:
    """`/a/b/train.py:42` as `train.py:42`."""
    path, _, line = site.rpartition(":")
    return f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}" if path else site
