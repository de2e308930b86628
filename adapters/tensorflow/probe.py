"""``probe``: growth statistics of a Keras 3 model with ``tf.GradientTape`` per-sample gradients."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from satcore.depth import DepthStatistics
from satcore.probe_result import ProbeResult
from satcore.statistics import CandidateStatistics

from .capture import recording, taps
from .families import feature_map, positions
from .locate import named_candidates, residual_candidates
from .moments import replica_moments


def total_loss(values, batch_size: int, replicas: int = 1):
    """``sum_i loss_i`` over a replica's ``batch_size`` samples, from what ``loss_fn`` returned.

    ``values`` of shape ``(B,)`` are the per-sample losses; ``(B, ...)`` (tokens) are averaged
    over the non-batch axes, so ``loss_i`` is a sequence's mean.  A 0-d value is read as the
    batch MEAN as a Keras loss with its default reduction (``"sum_over_batch_size"``) returns
    it: under ``tf.distribute`` Keras divides the replica's mean by ``replicas`` so that replica
    gradients sum to the global mean's.  Its gradient at ``z_i`` is then ``q_i / (B * replicas)``
    (docs/core.md, Conventions: adapters undo a batch mean), so it is multiplied back.
    """
    if not tf.is_tensor(values):
        raise TypeError(f"loss_fn must return a tensor, got {type(values).__name__}")
    if values.shape.rank == 0:
        return values * tf.cast(batch_size * replicas, values.dtype)
    if values.shape[0] != batch_size:
        raise ValueError(
            f"loss_fn returned shape {tuple(values.shape)}; expected per-sample losses ({batch_size}, ...) "
            "(reduction=None) or a scalar batch mean"
        )
    return tf.reduce_sum(tf.reduce_mean(values, axis=list(range(1, values.shape.rank))))


def _unpack(batch):
    if isinstance(batch, Mapping):
        return batch["x"], batch["y"]
    x, y = batch
    return x, y


def probe(
    model,
    data,
    loss_fn,
    *,
    candidates=None,
    family="auto",
    seed: int = 0,
    init_std: float | None = None,
    variance: bool = False,
    strategy=None,
    split: str | None = None,
) -> ProbeResult:
    """Per-candidate growth statistics of a Keras 3 model over ``data`` (docs/core.md, Adapters).

    ``data``: an iterable of ``(x, y)`` batches, or a ``tf.data.Dataset`` of them
    (required under a multi-replica strategy: it is distributed with
    ``strategy.experimental_distribute_dataset``); ``x`` may be NumPy or any array
    Keras accepts.  ``loss_fn(y_true, y_pred)`` returns per-sample losses ``(B,)``
    (a Keras loss with ``reduction=None``), or ``(B, T)`` for sequences, whose
    ``loss_i`` is the mean over tokens, or a scalar batch mean (a Keras loss with
    its default reduction): its gradients ``q_i / B`` are rescaled by ``B`` (and
    by the number of replicas, which Keras divides by), see :func:`total_loss`;
    a Keras loss with ``reduction="sum"`` is refused (a scalar that is not a mean).
    ``candidates``: layer names (the layer's input) or, for functional models,
    ``None`` for the skip inputs of residual ``Add`` layers (:mod:`.locate`).  ``family``: ``"auto"``, a kind,
    a :class:`~satcore.Family`, a Keras layer (user feature map), or a mapping
    candidate -> one of those; built-in kinds use ``make_family(kind, width,
    seed=seed)``.  The gradient of ``sum_i loss_i`` at a zero ``delta`` added at
    the candidate is ``q_i = d loss_i / d z_i``.  Each replica sums its moments;
    ``strategy.reduce(SUM)`` adds them (``strategy`` defaults to the one in scope).
    The sums give ``C = (1/M) sum_i Q_i^T Psi_i`` and ``K = (1/M) sum_i Psi_i^T Psi_i``,
    whence the growth value ``sqrt(tr(C K^+ C^T)) = ||Pi_S q_S||_S`` (Theorem 2,
    Lemma 4); ``variance`` adds ``sum_i X_i^T X_i`` (debiased value, docs/core.md, Certification).
    The model runs with ``training=False`` and must not mix samples.
    """
    if getattr(loss_fn, "reduction", None) == "sum":
        # its scalar is sum_i loss_i, which total_loss would read as a mean and multiply by B
        raise ValueError("loss_fn sums over the batch (reduction='sum'); use reduction=None or the default mean")
    cands = residual_candidates(model) if candidates is None else named_candidates(model, candidates)
    names = [c.name for c in cands]
    specs = family if isinstance(family, Mapping) else {n: family for n in names}
    if sorted(specs) != sorted(names):
        raise ValueError(f"family mapping keys {sorted(specs)} must be exactly the candidates {names}")
    strategy = strategy or tf.distribute.get_strategy()
    if isinstance(data, tf.data.Dataset):
        data = strategy.experimental_distribute_dataset(data)
    elif strategy.num_replicas_in_sync > 1:
        raise ValueError("under a multi-replica strategy, pass data as a tf.data.Dataset")
    maps: dict = {}
    n_positions: dict = {}
    model_inputs = [c for c in cands if c.position == "model_input"]

    def step(x, y):
        with tf.GradientTape() as tape, recording(tape) as rec:
            if model_inputs:
                x = _tap_inputs(rec, x, model_inputs)
            y_pred = model(x, training=False)
            missing = [n for n in names if n not in rec.z]
            if missing:
                raise ValueError(f"candidate(s) {missing} were not reached in the forward pass")
            batch_size = int(rec.z[names[0]].shape[0])
            total = total_loss(loss_fn(y, y_pred), batch_size, strategy.num_replicas_in_sync)
        grads = tape.gradient(total, [rec.delta[n] for n in names])
        out = {}
        for n, g in zip(names, grads):
            if g is None:
                raise ValueError(f"the loss does not depend on candidate {n!r}")
            z = rec.z[n]
            if n not in maps:  # same seeded weights on every replica and batch
                maps[n] = feature_map(specs[n], z, seed=seed, init_std=init_std)
            q = positions(g)
            n_positions[n] = int(q.shape[1])
            out[n] = replica_moments(q, maps[n](z), variance=variance)
        return out

    stats = DepthStatistics()
    with taps(model, cands):
        for batch in data:
            x, y = _unpack(batch)
            per_replica = strategy.run(step, args=(x, y))
            summed = tf.nest.map_structure(
                lambda v: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None), per_replica
            )
            for n in names:
                m = {k: np.asarray(v) for k, v in summed[n].items()}
                n_samples = int(round(float(m.pop("n_samples"))))
                if n_samples == 0:
                    continue
                if n not in stats:
                    N, r = m["sum_cross"].shape
                    stats[n] = CandidateStatistics(N, r, n_positions[n], variance)
                m["batch_grad_norm"] = float(np.sqrt(m["sum_q_sq"])) / n_samples
                stats[n].add_moments(n_samples, **m)
    if not stats:
        raise ValueError("the data held no samples")
    meta = {
        "candidates": names,
        "framework": "tensorflow",
        "model": model.name,
        "loss": getattr(loss_fn, "name", getattr(loss_fn, "__name__", type(loss_fn).__name__)),
        "split": split,
        "seed": seed,
        "replicas": strategy.num_replicas_in_sync,
        "family": {n: maps[n].describe() for n in names},
        "taps": {c.name: {"layer": c.layer, "position": c.position} for c in cands},
    }
    return ProbeResult(stats, meta)


def _tap_inputs(rec, x, model_inputs):
    """Tap candidates that are model inputs (``x`` one tensor or a list of them)."""
    if not isinstance(x, (list, tuple)):
        return rec.tap(model_inputs[0].name, x)
    xs = list(x)
    for c in model_inputs:
        xs[c.input_index] = rec.tap(c.name, xs[c.input_index])
    return xs
