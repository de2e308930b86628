"""Checkpoint and resume of a probe's running sums (a ``satcore-dump/1`` file, no pickle).

A checkpoint is an ordinary dump written by :func:`satcore.dump.write_dump`:
the statistics so far as ``stats/<name>/<field>``, and in ``meta`` the
candidates in order, their feature-map specs and ``checkpoint`` =
``{batches_done, streams}`` plus the probe's settings (candidates, family,
seed, init_std, position_subsample, variance, mask; of a callable mask only
that there was one) with ``streams`` the stream diagnostic sums as JSON
numbers, which round-trip float64 exactly.  So
``satcore score CHECKPOINT`` reads a partial probe.  ``write_dump`` writes a
file whole or not at all: an interruption never leaves a torn checkpoint.
It is read back by :func:`satcore.dump.read_dump`, the bounded reader every
dump goes through (nothing unpickled, sizes checked before allocating, the
statistics validated).
"""

from __future__ import annotations

from satcore.depth import DepthStatistics
from satcore.dump import read_dump, read_dump_meta, write_dump

from .diagnostics import StreamAccumulator


def save_checkpoint(path, statistics, streams, specs, batches_done: int, config: dict) -> None:
    state = {
        "batches_done": int(batches_done),
        **config,
        "streams": {name: {f: float(v) for f, v in acc.to_arrays().items()} for name, acc in streams.items()},
    }
    meta = {"candidates": list(statistics), "family": specs, "framework": "torch", "checkpoint": state}
    write_dump(path, statistics, meta=meta)


def load_checkpoint(path, config: dict):
    """``(statistics, streams, specs, batches_done)``; refuses a checkpoint of another probe setup."""
    # a DumpError (a ValueError) names the file and the key; the settings are compared before the sums are read
    schema, meta = read_dump_meta(path)
    state = dict(meta.get("checkpoint", {})) if isinstance(meta.get("checkpoint"), dict) else {}
    if schema is None or "family" not in meta:
        raise ValueError(f"{path}: not a satcore probe checkpoint")
    batches_done, saved_streams = state.pop("batches_done", None), state.pop("streams", None)
    if batches_done is None or saved_streams is None or state != config:
        raise ValueError(f"{path}: checkpoint was written by a probe with settings {state}, not {config}")
    dump = read_dump(path)
    if dump.raw:
        raise ValueError(f"{path}: not a satcore probe checkpoint (holds raw arrays)")
    order = list(dump.candidates)
    stats = DepthStatistics()
    for name in order:
        stats[name] = dump.stored[name]
    streams = {name: StreamAccumulator.from_arrays(saved_streams[name]) for name in order}
    return stats, streams, meta["family"], int(batches_done)
