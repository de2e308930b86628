"""``probe``: growth statistics of a Keras 3 model with ``tf.GradientTape`` per-sample gradients."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import tensorflow as tf

from satcore.adapters.base import ProbeOptions, probe_meta, refusing_bad_batch, resolve_options, warn_if_training_split
from satcore.adapters.batches import LABELS, split_batch
from satcore.adapters.options import per_candidate
from satcore import DepthStatistics
from satcore import BatchMoments
from satcore import ProbeResult
from satcore import CandidateStatistics
from satcore import InputError, ProbeError

from .capture import recording, taps
from .features import feature_map, positions
from .locate import locate_candidates
from .moments import replica_moments

# what Keras and TensorFlow raise for inputs or targets of a shape or dtype the model or loss cannot take
BATCH_ERRORS = (ValueError, TypeError, tf.errors.InvalidArgumentError)


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
        raise ProbeError(f"loss_fn must return a tensor, got {type(values).__name__}")
    if values.shape.rank == 0:
        return values * tf.cast(batch_size * replicas, values.dtype)
    if values.shape[0] != batch_size:
        raise ProbeError(
            f"loss_fn returned shape {tuple(values.shape)}; expected per-sample losses ({batch_size}, ...) "
            "(reduction=None) or a scalar batch mean"
        )
    return tf.reduce_sum(tf.reduce_mean(values, axis=list(range(1, values.shape.rank))))


def _unpack(batch):
    """``(x, y)`` of a batch (:mod:`satcore.adapters.batches`); ``{"x": ..., "y": ...}`` is the older spelling."""
    if isinstance(batch, Mapping) and set(batch) == {"x", "y"}:
        return batch["x"], batch["y"]
    x, y = split_batch(batch)
    if y is None:
        raise ProbeError(f"batch: a mapping needs the targets under {LABELS!r} (the rest are the model's inputs)")
    return x, y


@dataclass(frozen=True)
class ProbeConfig(ProbeOptions):
    """How a TensorFlow :class:`Probe` runs: the options every adapter takes
    (:class:`satcore.adapters.base.ProbeOptions`) and ``strategy``.

    ``candidates``: layer names (the layer's input) or, for functional models,
    ``None`` for the skip inputs of residual ``Add`` layers (:mod:`.locate`).
    ``family``: ``"auto"``, a kind, a :class:`~satcore.Family`, a Keras layer
    (user feature map), or a mapping candidate -> one of those; built-in kinds
    use ``make_family(kind, width, seed=seed)`` (a mapping may leave candidates
    out: they get ``"auto"``; ``init_std``: the ``mlp``
    weight scale).  ``variance`` adds ``sum_i X_i^T X_i`` (the debiased value).
    ``strategy``: the ``tf.distribute`` strategy (default: the one in scope).
    ``split``: the name of the probe data (a training split warns).
    ``n_features``: the built-in families' ``r`` (an int or a mapping candidate -> int).
    """

    strategy: object = None


class Probe:
    """Incremental growth statistics of a Keras 3 model: :meth:`update` per batch, :meth:`result` any time.

    ``loss_fn(y_true, y_pred)`` returns per-sample losses ``(B,)`` (a Keras
    loss with ``reduction=None``), or ``(B, T)`` for sequences, whose
    ``loss_i`` is the mean over tokens, or a scalar batch mean (a Keras loss with
    its default reduction): its gradients ``q_i / B`` are rescaled by ``B`` (and
    by the number of replicas, which Keras divides by), see :func:`total_loss`;
    a Keras loss with ``reduction="sum"`` is refused (a scalar that is not a mean).
    The gradient of ``sum_i loss_i`` at a zero ``delta`` added at the
    candidate is ``q_i = d loss_i / d z_i``.  Each replica sums its moments;
    ``strategy.reduce(SUM)`` adds them.  The sums give
    ``C = (1/M) sum_i Q_i^T Psi_i`` and ``K = (1/M) sum_i Psi_i^T Psi_i``,
    whence the growth value ``sqrt(tr(C K^+ C^T)) = ||Pi_S q_S||_S`` (Theorem 2,
    Lemma 4).  The model runs with ``training=False`` and must not mix samples.

    A batch is ``(x, y)`` or a mapping of the model's inputs with the targets under
    ``"labels"`` (the adapters' one convention, :mod:`satcore.adapters.batches`; the
    model is called on the mapping without ``"labels"``; the older ``{"x", "y"}``
    is still read); under a
    multi-replica strategy, a distributed batch (:func:`probe` distributes a
    ``tf.data.Dataset``).  ``config`` is a :class:`ProbeConfig`; keyword
    ``options`` build one (or replace its fields).

    The result's ``meta`` records per candidate the tap (``taps``) and the family drawn
    (``family``, with ``init_std`` for ``mlp``), its statistics the stream sums behind
    ``||z||_S``: what :func:`.grow` needs to redraw ``psi`` and scale ``rho``.
    """

    def __init__(self, model, loss_fn, config: ProbeConfig | None = None, **options):
        config = resolve_options(ProbeConfig, config, **options)
        if getattr(loss_fn, "reduction", None) == "sum":
            # its scalar is sum_i loss_i, which total_loss would read as a mean and multiply by B
            raise ProbeError("loss_fn sums over the batch (reduction='sum'); use reduction=None or the default mean")
        self.model, self.loss_fn, self.config = model, loss_fn, config
        self.cands = locate_candidates(model, config.candidates)
        self.names = [c.name for c in self.cands]
        self.specs = per_candidate(config.family, self.names, "family", default="auto")
        self.n_features = per_candidate(config.n_features, self.names, "n_features")
        self.strategy = config.strategy or tf.distribute.get_strategy()
        self.maps: dict = {}
        self.n_positions: dict = {}
        self.stats = DepthStatistics()
        self.batches_done = 0
        self.model_inputs = [c for c in self.cands if c.position == "model_input"]
        self._warned_scalar = False
        warn_if_training_split(config.split)

    def _step(self, x, y):
        names, config = self.names, self.config
        with tf.GradientTape() as tape, recording(tape) as rec:
            if self.model_inputs:
                x = _tap_inputs(rec, x, self.model_inputs)
            with refusing_bad_batch(self.batches_done, BATCH_ERRORS):
                y_pred = self.model(x, training=False)
                missing = [n for n in names if n not in rec.z]
                if missing:
                    raise ProbeError(f"candidates {missing} were not reached in the forward pass")
                batch_size = int(rec.z[names[0]].shape[0])
                values = self.loss_fn(y, y_pred)
            if tf.is_tensor(values) and values.shape.rank == 0 and not self._warned_scalar:
                self._warned_scalar = True
                warnings.warn("loss_fn returned a 0-d loss: read as the batch mean and multiplied by the batch size "
                              "(and replicas); pass reduction=None for per-sample losses", UserWarning, stacklevel=2)
            total = total_loss(values, batch_size, self.strategy.num_replicas_in_sync)
        grads = tape.gradient(total, [rec.delta[n] for n in names])
        out = {}
        for n, g in zip(names, grads):
            if g is None:
                raise ProbeError(f"loss_fn: the loss does not depend on candidate {n!r}")
            z = rec.z[n]
            if n not in self.maps:  # same seeded weights on every replica and batch
                self.maps[n] = feature_map(self.specs[n], z, seed=config.seed, init_std=config.init_std,
                                           n_features=self.n_features[n])
            q = positions(g)
            self.n_positions[n] = int(q.shape[1])
            moments = replica_moments(q, self.maps[n](z), variance=config.variance)
            # a dict crosses the all-reduce
            out[n] = replace(moments, sum_z_sq=tf.reduce_sum(tf.square(tf.cast(z, tf.float64)))).as_dict()
        return out

    def update(self, batch) -> int:
        """Add one batch (see the class docstring); returns its number of samples (over every replica)."""
        strategy = self.strategy
        x, y = _unpack(batch)
        with taps(self.model, self.cands):
            per_replica = strategy.run(self._step, args=(x, y))
        summed = tf.nest.map_structure(
            lambda v: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None), per_replica
        )
        samples = 0
        for n in self.names:
            moments = BatchMoments(**summed[n]).to_numpy()
            samples = moments.n_samples
            if moments.n_samples == 0:
                continue
            if n not in self.stats:
                N, r = moments.sum_cross.shape
                self.stats[n] = CandidateStatistics(N, r, self.n_positions[n], self.config.variance, stream=True)
            # every position of a Keras stream is in the sums: the stream's vectors are the statistics'
            self.stats[n].add_moments(replace(moments.as_one_batch(), n_stream_vectors=moments.n_vectors))
        self.batches_done += 1
        return samples

    def result(self) -> ProbeResult:
        """The statistics of every batch so far (a copy: the probe can go on)."""
        if not self.stats:
            raise ProbeError("data: the probe has held no samples yet")
        meta = probe_meta(
            "tensorflow", self.model.name, self.loss_fn, self.config,
            replicas=self.strategy.num_replicas_in_sync,
            family={n: self.maps[n].describe() for n in self.names},
            taps={c.name: {"layer": c.layer, "position": c.position,
                           **({"input_index": c.input_index} if c.position == "model_input" else {})}
                  for c in self.cands},
        )
        return ProbeResult(copy.deepcopy(self.stats), meta)


def probe(model, data, loss_fn, *, config: ProbeConfig | None = None, progress=None, **options) -> ProbeResult:
    """Per-candidate growth statistics of a Keras 3 model over ``data``: :class:`Probe` over every batch.

    ``data``: an iterable of ``(x, y)`` batches, or a ``tf.data.Dataset`` of them
    (required under a multi-replica strategy: it is distributed with
    ``strategy.experimental_distribute_dataset``); ``x`` may be NumPy or any array
    Keras accepts.  ``loss_fn`` is :class:`Probe`'s; ``options`` are the fields
    of :class:`ProbeConfig`.  ``progress``: called with each batch's sample count once the batch is probed
    (``None``: silent), as the torch probe calls its own.
    """
    state = Probe(model, loss_fn, config, **options)
    if isinstance(data, tf.data.Dataset):
        data = state.strategy.experimental_distribute_dataset(data)
    elif state.strategy.num_replicas_in_sync > 1:
        raise InputError("data: under a multi-replica strategy, pass data as a tf.data.Dataset")
    for batch in data:
        samples = state.update(batch)
        if progress is not None:
            progress(samples)
    return state.result()


def _tap_inputs(rec, x, model_inputs):
    """Tap candidates that are model inputs (``x`` one tensor or a list of them)."""
    if not isinstance(x, (list, tuple)):
        return rec.tap(model_inputs[0].name, x)
    xs = list(x)
    for c in model_inputs:
        xs[c.input_index] = rec.tap(c.name, xs[c.input_index])
    return xs
