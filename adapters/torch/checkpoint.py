"""Checkpoint and resume of a probe's running sums (a ``satcore-dump/1`` file, no pickle).

A checkpoint is an ordinary dump written by :func:`satcore.dump.write_dump`:
the statistics so far as ``stats/<name>/<field>`` (the stream sums among
them), and in ``meta`` the candidates in order, their feature-map specs and
``checkpoint`` = ``{batches_done}`` plus the probe's settings (candidates,
family, seed, init_std, position_subsample, variance, mask; of a callable mask
only that there was one).  Checkpoints written before the statistics kept the
stream sums hold them as ``checkpoint.streams`` (JSON numbers, which
round-trip float64 exactly); they still resume.  So
``satcore score CHECKPOINT`` reads a partial probe.  ``write_dump`` writes a
file whole or not at all: an interruption never leaves a torn checkpoint.
It is read back by :func:`satcore.dump.read_dump`, the bounded reader every
dump goes through (nothing unpickled, sizes checked before allocating, the
statistics validated).
"""

from __future__ import annotations

from satcore.depth import DepthStatistics
from satcore.dump import read_dump, read_dump_meta, write_dump
from satcore.statistics import CandidateStatistics


def save_checkpoint(path, statistics, specs, batches_done: int, config: dict) -> None:
    state = {"batches_done": int(batches_done), **config}
    meta = {"candidates": list(statistics), "family": specs, "framework": "torch", "checkpoint": state}
    write_dump(path, statistics, meta=meta)


def load_checkpoint(path, config: dict):
    """``(statistics, specs, batches_done)``; refuses a checkpoint of another probe setup."""
    # a DumpError (a ValueError) names the file and the key; the settings are compared before the sums are read
    schema, meta = read_dump_meta(path)
    state = dict(meta.get("checkpoint", {})) if isinstance(meta.get("checkpoint"), dict) else {}
    if schema is None or "family" not in meta:
        raise ValueError(f"{path}: not a satcore probe checkpoint")
    batches_done, saved_streams = state.pop("batches_done", None), state.pop("streams", None)
    if batches_done is None or state != config:
        raise ValueError(f"{path}: checkpoint was written by a probe with settings {state}, not {config}")
    dump = read_dump(path)
    if dump.raw:
        raise ValueError(f"{path}: not a satcore probe checkpoint (holds raw arrays)")
    order = list(dump.candidates)
    stats = DepthStatistics()
    for name in order:
        stats[name] = dump.stored[name]
        if saved_streams is not None:
            stats[name] = _with_stream_sums(stats[name], saved_streams.get(name), path)
    return stats, meta["family"], int(batches_done)


def _with_stream_sums(statistics: CandidateStatistics, saved, path) -> CandidateStatistics:
    """``statistics`` with the stream sums an older checkpoint kept in ``checkpoint.streams``
    (``{n_samples, n_vectors, sum_z_sq, sum_update_sq, has_update}``)."""
    try:
        arrays = {**statistics.to_arrays(), "sum_z_sq": float(saved["sum_z_sq"]),
                  "n_stream_vectors": float(saved["n_vectors"])}
        if saved["has_update"]:
            arrays["sum_update_sq"] = float(saved["sum_update_sq"])
        return CandidateStatistics.from_arrays(arrays)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: checkpoint streams: {exc}") from None
