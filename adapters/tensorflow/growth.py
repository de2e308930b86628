"""Grow a functional Keras model until the evidence says stop: the core loop (:mod:`satcore._growth.loop`) on Keras.

The rounds, stop reasons, held-out guard and log are the core's (docs/growth.md).  Keras has no
native block kinds here: every block is the generic zero-output residual ``z + V psi(z)`` of the
probed feature family with ``V = 0`` (:func:`~.grow.grow` with ``zero=True``, an
:class:`~.grow.InsertedResidual` layer), drawn at the round's seed, whose first-order value the
round's probe measured.  ``train(model, round) -> model`` is the user's (``compile`` + ``fit``).

Weights.  With ``log_path`` each kept round's ``model.get_weights()`` goes beside the log as an
``.npz`` (``<log>.round<k>.npz``, arrays ``w0, w1, ...``) through satcore's atomic writer; on
resume it is read with satcore's checked ``.npz`` reader (sizes bounded, nothing unpickled) and
every array's shape and dtype are checked against the model before ``set_weights``.  Resuming
replays each kept insertion by probing one batch at the logged seed (the family's weights are
redrawn from it) and inserting its zero block.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from satcore.adapter_api import atomic_write
from satcore.adapter_api import display_name
from satcore.adapter_api import NpzArchive, NpzError
from dataclasses import replace

from satcore import GrowthLogError, InputError, ProbeError
from satcore import FirstOrderDecide, GrowthOptions, GrowthResult, GrowthRound, run_growth
from satcore.adapter_api import AdapterSteps, moved_keywords
from satcore.adapters.base import growth_decision, require_round_data, warn_if_heldout_is_probe

from .grow import InsertedResidual, grow, require_functional
from .locate import locate_candidates
from .probe import Probe, ProbeConfig, _unpack


def per_sample_losses(model, data, loss_fn) -> np.ndarray:
    """Per-sample losses ``loss_fn(y, model(x, training=False))`` over ``(x, y)`` batches (a ``(B, T)`` loss:
    the mean over ``T``)."""
    out = []
    for batch in data:
        x, y = _unpack(batch)
        values = tf.convert_to_tensor(loss_fn(y, model(x, training=False)))
        if values.shape.rank == 0:
            raise ProbeError("loss_fn returned a 0-d loss; the growth loop needs per-sample losses (reduction=None)")
        if values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        out.append(np.asarray(values, dtype=np.float64))
    return np.concatenate(out) if out else np.zeros(0)


def save_weights(model, path: str) -> None:
    """``model.get_weights()`` to ``path`` as ``w0, w1, ...`` of an ``.npz``, whole or not at all."""
    weights = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    atomic_write(path, lambda stream: np.savez(stream, **weights))


def load_weights(model, path: str):
    """Read ``path`` (written by :func:`save_weights`) into ``model`` after checking it (module docstring)."""
    shown = display_name(path)
    own = model.get_weights()
    try:
        with NpzArchive(path) as archive:
            keys = [f"w{i}" for i in range(len(own))]
            if sorted(archive.members) != sorted(keys):
                extra = sorted(set(archive.members) ^ set(keys))
                raise GrowthLogError(f"{shown}: array {display_name(extra[0])!r} does not match this model's "
                                     f"{len(own)} weights; not this run's weights")
            for key, mine in zip(keys, own):
                header = archive.header(key)
                if tuple(header.shape) != tuple(mine.shape) or header.dtype != mine.dtype:
                    raise GrowthLogError(f"{shown}: {key} is {header.dtype}{tuple(header.shape)}, the model's "
                                         f"{mine.dtype}{tuple(mine.shape)}")
            weights = [archive.read(key) for key in keys]
    except NpzError as exc:
        raise GrowthLogError(str(exc)) from None
    model.set_weights(weights)
    return model


def _inserted(model) -> int:
    return sum(isinstance(layer, InsertedResidual) for layer in model._flatten_layers(include_self=False))


class KerasGrowthSteps(AdapterSteps):
    """The Keras side of a round (:class:`satcore._growth.loop.GrowthSteps`)."""

    per_sample_losses = staticmethod(per_sample_losses)
    save_weights = staticmethod(save_weights)
    load_weights = staticmethod(load_weights)
    weights_suffix = ".npz"

    def __init__(self, train, loss_fn, data: dict, probe: ProbeConfig):
        self.train_fn, self.loss_fn, self.data = train, loss_fn, data
        self.probe, self.family = probe, probe.family

    def start_probe(self, model, seed: int) -> Probe:
        return Probe(model, self.loss_fn, replace(self.probe, seed=seed, split="probe"))

    def depth(self, model) -> int:
        return len(locate_candidates(model, self.probe.candidates)) + _inserted(model)

    def _zero_block(self, model, at: str, seed: int):
        state = self.start_probe(model, seed)
        state.update(next(iter(self.data["probe"])))
        result = state.result()
        return grow(model, result, at, zero=True).model, {"family": result.meta["family"][at]}

    def insert(self, model, at: str, seed: int):
        return self._zero_block(model, at, seed)

    def replay(self, model, entry: GrowthRound):
        return self._zero_block(model, entry.inserted_at, entry.seed)[0]

    def settings(self) -> dict:
        family = self.family if isinstance(self.family, str) else type(self.family).__name__
        candidates = self.probe.candidates
        return {"framework": "tensorflow", "family": family,
                "candidates": None if candidates is None else list(candidates)}


@moved_keywords("grow_until_saturated")
def grow_until_saturated(model, train, probe_data, loss_fn, *, heldout_data=None, train_data=None,
                         options: GrowthOptions | None = None, policy=None) -> GrowthResult:
    """Rounds of decide -> insert -> train -> guard on a functional Keras model (module docstring).

    The arguments are those of :func:`satcore.adapters.torch.grow_until_saturated` (``options.probe`` a Keras
    :class:`~.probe.ProbeConfig`, default ``family="auto"``; ``policy`` a :class:`satcore.DecisionPolicy`,
    decided by :func:`~.decide.decide`, or a callable), except ``options.zero`` (no native blocks) and
    ``options.progress``, which are not read.  ``loss_fn(y_true, y_pred)`` returns per-sample losses (a Keras
    loss with ``reduction=None``).  Weights go beside the log as ``<log>.round<k>.npz``.
    """
    options = (GrowthOptions() if options is None else options).deciding(first_order=policy is None)
    require_functional(model, "grow_until_saturated")  # before the first round's probe: every round rebuilds it
    probe = ProbeConfig() if options.probe is None else options.probe
    if not isinstance(probe, ProbeConfig):
        raise InputError(f"growth options: probe must be a satcore.adapters.tensorflow.ProbeConfig, got "
                         f"{type(probe).__name__}")
    require_round_data(probe_data, heldout_data, train_data)
    warn_if_heldout_is_probe(policy, probe_data, heldout_data)
    data = {"probe": probe_data, "train": train_data if train_data is not None else probe_data,
            "heldout": heldout_data}
    steps = KerasGrowthSteps(train, loss_fn, data, probe)
    from .decide import decide as decide_fn

    decide = growth_decision(policy, decide_fn, (train_data, probe_data), loss_fn, probe)
    if decide is None:
        decide = FirstOrderDecide(steps.start_probe, probe_data, options.criteria, options.first_look_batches)
    return run_growth(model, steps, decide, options, log_path=options.log_path)


__all__ = ["KerasGrowthSteps", "grow_until_saturated", "load_weights", "per_sample_losses", "save_weights"]
