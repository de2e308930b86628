"""Checkpoint and resume of a probe's running sums (a ``satcore-dump/1`` file, no pickle).

A checkpoint is an ordinary dump written by :func:`satcore._io.dump.write_dump`:
the statistics so far as ``stats/<name>/<field>`` (the stream sums among
them), and in ``meta`` the candidates in order, their feature-map specs and
``checkpoint`` = ``{batches_done}`` plus the probe's settings (candidates,
family, seed, init_std, position_subsample, variance, mask; of a callable mask
only that there was one).  Checkpoints written before the statistics kept the
stream sums hold them as ``checkpoint.streams`` (JSON numbers, which
round-trip float64 exactly); they still resume.  So
``satcore score CHECKPOINT`` reads a partial probe.  ``write_dump`` writes a
file whole or not at all: an interruption never leaves a torn checkpoint.
It is read back by :func:`satcore._io.dump.read_dump`, the bounded reader every
dump goes through (nothing unpickled, sizes checked before allocating, the
statistics validated).

A checkpoint resumes only the probe that wrote it.  Every setting is compared
key by key (a missing, extra or different one is refused by its key), and the
settings include ``model``, the fingerprint of :func:`model_fingerprint`: the
names, shapes and dtypes of the model's parameters and buffers and, of each,
its first and last four values.  So a checkpoint of another architecture, of
other candidates or of the same architecture with other weights is refused;
two models that agree in every name, shape, dtype and sampled value are not
told apart.  ``batches_done`` must be a whole number >= 0 equal to the
batches each candidate's statistics hold (a tampered count would skip batches
or count them twice).
"""

from __future__ import annotations

from satcore.adapter_api import display_name
from satcore import DepthStatistics
from satcore import read_dump, write_dump
from satcore.adapter_api import read_dump_meta
from satcore import ProbeError
from satcore import CandidateStatistics
from satcore.adapters.base import weights_fingerprint


def save_checkpoint(path, statistics, specs, batches_done: int, config: dict) -> None:
    state = {"batches_done": int(batches_done), **config}
    meta = {"candidates": list(statistics), "family": specs, "framework": "torch", "checkpoint": state}
    write_dump(path, statistics, meta=meta)


def load_checkpoint(path, config: dict):
    """``(statistics, specs, batches_done)``; refuses a checkpoint of another probe setup."""
    # a DumpError (a ValueError) names the file and the key; the settings are compared before the sums are read
    schema, meta = read_dump_meta(path)
    batches_done, saved_streams = _checked_state(path, schema, meta, config)
    dump = read_dump(path)
    if dump.raw:
        raise ProbeError(f"{_shown(path)}: not a satcore probe checkpoint (holds raw arrays)")
    order = list(dump.candidates)
    stats = DepthStatistics()
    for name in order:
        stats[name] = dump.stored[name]
        if stats[name].n_batches != batches_done:
            raise ProbeError(f"{_shown(path)}: checkpoint.batches_done = {batches_done} but candidate {name!r} "
                             f"holds {stats[name].n_batches} batches")
        if saved_streams is not None:  # an older checkpoint kept the stream sums in its meta
            stats[name] = _with_stream_sums(stats[name], saved_streams.get(name), path, name)
    return stats, meta["family"], int(batches_done)


def _shown(path) -> str:
    return display_name(str(path))


def _checked_state(path, schema, meta: dict, config: dict):
    """``(batches_done, streams or None)`` of a checkpoint's meta, its settings equal to ``config`` key by key."""
    state = meta.get("checkpoint")
    if schema is None or "family" not in meta or not isinstance(state, dict):
        raise ProbeError(f"{_shown(path)}: not a satcore probe checkpoint (meta has no 'checkpoint' mapping)")
    state = dict(state)
    batches_done, saved_streams = state.pop("batches_done", None), state.pop("streams", None)
    if type(batches_done) is not int or batches_done < 0:
        raise ProbeError(f"{_shown(path)}: checkpoint.batches_done must be a whole number >= 0, got {batches_done!r}")
    for key in list(config) + [k for k in state if k not in config]:
        if key not in state:
            raise ProbeError(f"{_shown(path)}: checkpoint was written by a probe with settings that differ: "
                             f"checkpoint.{key} is missing (this probe: {config[key]!r})")
        if key not in config or state[key] != config[key]:
            theirs = "not a setting of this probe" if key not in config else f"this probe: {config[key]!r}"
            what = " (another model: names, shapes, dtypes or values of its parameters differ)" if key == "model" else ""
            raise ProbeError(f"{_shown(path)}: checkpoint was written by a probe with settings that differ: "
                             f"checkpoint.{key} = {state[key]!r} ({theirs}){what}")
    if saved_streams is not None and not isinstance(saved_streams, dict):
        raise ProbeError(f"{_shown(path)}: checkpoint.streams must be a mapping of candidate names")
    return batches_done, saved_streams


def model_fingerprint(model) -> str:
    """A hash of ``model``'s architecture and weights, cheap to compute (module docstring).

    Hashed: for every entry of ``state_dict`` (parameters and persistent buffers) in order, its
    name, shape and dtype, and its first and last four values as float64.  Not hashed: the other
    values (reading them all would cost a pass over the weights at every resume).  A tensor
    without data (the ``meta`` device) or sharded across processes (a tensor subclass such as FSDP's
    ``DTensor``) contributes its name, shape and dtype only.
    """
    import torch

    def entries():
        with torch.no_grad():
            for name, tensor in model.state_dict(keep_vars=True).items():
                if not isinstance(tensor, torch.Tensor):
                    continue
                values = tensor.detach()
                if values.is_meta or values.numel() == 0 or type(values) is not torch.Tensor:
                    # no data here, or a sharded subclass (an FSDP DTensor) whose values this rank cannot read alone
                    yield name, tuple(tensor.shape), tensor.dtype, None
                    continue
                flat = values.reshape(-1)
                ends = torch.cat([flat[:4], flat[-4:]]) if flat.numel() > 8 else flat
                if ends.is_complex():
                    ends = torch.view_as_real(ends)
                yield name, tuple(tensor.shape), tensor.dtype, ends.to(device="cpu", dtype=torch.float64).numpy()

    return weights_fingerprint(entries())


def _with_stream_sums(statistics: CandidateStatistics, saved, path, statistics_name: str) -> CandidateStatistics:
    """``statistics`` with the stream sums an older checkpoint kept in ``checkpoint.streams``
    (``{n_samples, n_vectors, sum_z_sq, sum_update_sq, has_update}``)."""
    if not isinstance(saved, dict):
        raise ProbeError(f"{_shown(path)}: checkpoint.streams: no stream sums for candidate "
                         f"{display_name(repr(statistics_name), 120)} (a mapping of its sums is expected)")
    try:
        arrays = {**statistics.to_arrays(), "sum_z_sq": float(saved["sum_z_sq"]),
                  "n_stream_vectors": float(saved["n_vectors"])}
        if saved["has_update"]:
            arrays["sum_update_sq"] = float(saved["sum_update_sq"])
        return CandidateStatistics.from_arrays(arrays)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ProbeError(f"{_shown(path)}: checkpoint.streams.{display_name(statistics_name, 120)}: missing or not a "
                         f"number: {display_name(str(exc), 120)}") from None
