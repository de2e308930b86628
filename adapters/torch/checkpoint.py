"""Checkpoint and resume of a probe's running sums (``.npz``, no pickle).

A checkpoint is a ``satcore-dump/1``-shaped file: ``satcore_schema``, a JSON
``meta`` (candidates in order, their feature-map specs, and
``checkpoint.batches_done``), the statistics as ``stats/<name>/<field>`` and
the stream sums as ``stream/<name>/<field>``.  It is written to a temporary
file and renamed, so an interruption never leaves a torn checkpoint.  It is
read with ``allow_pickle=False``.
"""

from __future__ import annotations

import json
import os

import numpy as np

from satcore.depth import DepthStatistics

from .diagnostics import StreamAccumulator

SCHEMA = "satcore-dump/1"


def save_checkpoint(path, statistics, streams, specs, batches_done: int, config: dict) -> None:
    meta = {
        "candidates": list(statistics),
        "family": specs,
        "framework": "torch",
        "checkpoint": {"batches_done": int(batches_done), **config},
    }
    arrays = {"satcore_schema": np.asarray(SCHEMA), "meta": np.asarray(json.dumps(meta))}
    arrays.update({f"stats/{k}": v for k, v in statistics.to_arrays().items()})
    for name, acc in streams.items():
        arrays.update({f"stream/{name}/{f}": v for f, v in acc.to_arrays().items()})
    tmp = f"{os.fspath(path)}.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def load_checkpoint(path, config: dict):
    """``(statistics, streams, specs, batches_done)``; refuses a checkpoint of another probe setup."""
    with np.load(path, allow_pickle=False) as data:
        if "meta" not in data.files or str(data["satcore_schema"]) != SCHEMA:
            raise ValueError(f"{path}: not a satcore probe checkpoint")
        meta = json.loads(str(data["meta"]))
        saved = dict(meta.get("checkpoint", {}))
        batches_done = saved.pop("batches_done", None)
        if batches_done is None or saved != config:
            raise ValueError(f"{path}: checkpoint was written by a probe with settings {saved}, not {config}")
        order = meta["candidates"]
        stats = DepthStatistics.from_arrays(
            {k[len("stats/") :]: data[k] for k in data.files if k.startswith("stats/")}, order
        )
        streams = {
            name: StreamAccumulator.from_arrays(
                {k.rpartition("/")[2]: data[k] for k in data.files if k.startswith(f"stream/{name}/")}
            )
            for name in order
        }
    return stats, streams, meta["family"], int(batches_done)
