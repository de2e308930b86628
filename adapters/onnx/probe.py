"""``probe``: growth statistics of an ONNX model from its backward graph on ONNX Runtime, and NumPy features."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from satcore.adapters.base import ProbeOptions, probe_meta, resolve_options, warn_if_training_split
from satcore.adapters.batches import LABELS
from satcore.adapters.batches import split_batch as shared_split_batch
from satcore.adapter_api import check_feature_count
from satcore.adapters.options import per_candidate
from satcore import DepthStatistics, InputError
from satcore.adapter_api import positions
from satcore import ProbeResult
from satcore import CandidateStatistics

from .capture import IGNORE_INDEX, LOSS_SCALE, LOSSES, TARGETS, GradientRunner, probe_graph
from .errors import OnnxBatchError, OnnxProbeError
from .features import feature_map
from .loading import load_model
from .locate import resolve_candidates

TARGET_KEYS = (LABELS, "targets", "target", "y")


def _numpy_dtype(elem_type: int):
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(elem_type)


def split_batch(batch, input_names: list[str]) -> tuple[dict, np.ndarray | None]:
    """``(inputs by name, targets)`` of a batch.

    The adapters' convention (:func:`satcore.adapters.batches.split_batch`): ``(x, y)``
    or a mapping of input names holding the targets under ``labels``; ONNX also reads
    the targets under ``targets``, ``target`` or ``y`` (a model input of that name is
    an input), and ``x`` or ``(x,)`` alone (no targets: a loss output of the graph).
    ``x`` is an array (single-input models) or a mapping of input names.
    """
    if isinstance(batch, (tuple, list)) and len(batch) == 1:
        batch = batch[0]
    if not isinstance(batch, (Mapping, tuple, list)):
        batch = (batch, None)
    try:
        inputs, targets = shared_split_batch(batch, target_keys=TARGET_KEYS, input_names=input_names)
    except ValueError as exc:
        raise OnnxProbeError(str(exc)) from None
    if not isinstance(inputs, Mapping):
        if len(input_names) != 1:
            raise OnnxProbeError(f"the model has inputs {input_names}: pass a mapping name -> array")
        inputs = {input_names[0]: inputs}
    missing = [n for n in input_names if n not in inputs]
    extra = [n for n in inputs if n not in input_names]
    if missing or extra:
        raise OnnxProbeError(f"batch inputs {sorted(inputs)} do not match the model inputs {input_names}")
    return {k: np.asarray(v) for k, v in inputs.items()}, None if targets is None else np.asarray(targets)


def _loss_feeds(loss: str, targets, info, inputs: dict, batch: int, scale_dtype) -> dict:
    """Targets and the ``LOSS_SCALE`` weights turning the loss terms into ``sum_i loss_i``."""
    if loss in LOSSES and targets is None:
        raise OnnxProbeError(f"loss {loss!r} needs targets in every batch")
    if loss == "cross_entropy":
        return _cross_entropy_feeds(targets, info.shape[-1], batch, scale_dtype)
    feeds = {LOSS_SCALE: np.array(1.0 / _output_elements(info, inputs), dtype=scale_dtype)}
    if loss == "mse":
        if targets.dtype.kind != "f":
            raise OnnxProbeError(f"mse targets must be floating point, got dtype {targets.dtype}")
        feeds[TARGETS] = targets.astype(scale_dtype)
    return feeds


def _cross_entropy_feeds(targets, classes: int, batch: int, scale_dtype) -> dict:
    """Class indices checked against ``[0, classes)``, and one weight per target.

    ``loss_i`` is the mean over sample ``i``'s targets other than
    ``IGNORE_INDEX`` (the torch adapter's ``sequence_loss``): each weighs
    ``1 / count``, an ignored one 0, and a sample with nothing counted adds 0.
    """
    if targets.dtype.kind not in "iu":
        raise OnnxProbeError(f"cross_entropy targets must be integer class indices, got dtype {targets.dtype}")
    if targets.ndim < 1 or len(targets) != batch:
        raise OnnxProbeError(f"targets have shape {targets.shape}; expected ({batch}, ...)")
    counted = targets != IGNORE_INDEX
    # ONNX Runtime reads the log-probability at each index unchecked: out of range is a crash or garbage
    outside = counted & ((targets < 0) | (targets >= classes))
    if outside.any():
        raise OnnxProbeError(
            f"cross_entropy target {targets[outside][0]} is outside the class range [0, {classes}) "
            f"(the only other label allowed is the ignore index {IGNORE_INDEX})"
        )
    per_sample = counted.reshape(batch, -1).sum(1).reshape((batch,) + (1,) * (targets.ndim - 1))
    weights = counted / np.maximum(per_sample, 1)
    # an ignored target weighs 0; it is fed as class 0 so that the one-hot row is a real one
    classes_fed = np.where(counted, targets, 0).astype(np.int64)
    return {TARGETS: classes_fed, LOSS_SCALE: weights.astype(scale_dtype)}


@dataclass(frozen=True)
class GradientSession:
    """A model prepared for per-sample gradients: call it on a batch.

    ``session(batch)`` gives ``(activations, gradients)``: ``{name: z}`` and
    ``{name: d (sum_i loss_i) / d z}`` in the graph's layout (``(B, C, H, W)``
    stays channels-first); row ``i`` of a gradient is ``q_i = d loss_i / d z_i``.
    """

    candidates: tuple
    output: str
    route: str
    runner: object = field(repr=False)
    input_names: tuple = ()
    input_dtypes: dict = field(default_factory=dict, repr=False)
    output_info: object = field(default=None, repr=False)
    loss: str = "cross_entropy"
    tensors: tuple = ()  # the graph tensor each candidate name stands for

    def __call__(self, batch):
        inputs, targets = split_batch(batch, list(self.input_names))
        feeds = {k: v.astype(self.input_dtypes[k], copy=False) for k, v in inputs.items()}
        b = len(next(iter(feeds.values())))
        if b == 0:
            return None
        info = self.output_info
        scale_dtype = _numpy_dtype(info.elem_type) if info is not None and info.elem_type else np.float32
        feeds.update(_loss_feeds(self.loss, targets, info, feeds, b, scale_dtype))
        acts, grads = self.runner(feeds)
        pairs = list(zip(self.candidates, self.tensors))
        return {n: acts[t] for n, t in pairs}, {n: grads[t] for n, t in pairs}


def per_sample_gradients(
    model,
    *,
    loss: str = "cross_entropy",
    candidates=None,
    output: str | None = None,
    providers=None,
    head: bool = True,
) -> GradientSession:
    """Prepare ``model`` (path or ``ModelProto``) for per-sample gradients; arguments as :func:`probe`."""
    proto = load_model(model)
    chosen = resolve_candidates(proto, candidates, head=head)
    tensors = list(chosen.values())
    graph_probe, output, infos = probe_graph(proto, tensors, loss=loss, output=output)
    initializers = {i.name for i in proto.graph.initializer}
    input_names = tuple(i.name for i in proto.graph.input if i.name not in initializers)
    runner = GradientRunner(graph_probe, tensors, input_names, providers)
    return GradientSession(
        candidates=tuple(chosen),
        tensors=tuple(tensors),
        output=output,
        route=runner.name,
        runner=runner,
        input_names=input_names,
        input_dtypes={i.name: _numpy_dtype(i.type.tensor_type.elem_type) for i in proto.graph.input},
        output_info=infos.get(output),
        loss=loss,
    )


@dataclass(frozen=True)
class ProbeConfig(ProbeOptions):
    """How an ONNX :class:`Probe` runs: the options every adapter takes
    (:class:`satcore.adapters.base.ProbeOptions`; ``family`` may also be a callable ``z -> psi``)
    and ``loss``, ``output``, ``providers`` (:func:`probe`)."""

    loss: str = "cross_entropy"
    output: str | None = None
    providers: tuple[str, ...] | None = None
    head: bool = True  # also the last block's output, as the torch adapter's head candidate


def probe(model, data, *, config: ProbeConfig | None = None, **options) -> ProbeResult:
    """Per-candidate growth statistics of an ONNX model over ``data``.

    ``model``: a ``.onnx`` path (external data must lie inside its folder) or
    a ``ModelProto``.  ``data``: an iterable of batches (see
    :func:`split_batch`); every batch runs once through ONNX Runtime.
    ``loss``: ``"cross_entropy"`` (logits ``(B, [T,] classes)`` with a fixed
    class count, integer targets in ``[0, classes)`` or ``-100`` for a token
    left out; for sequences ``loss_i`` is the mean over the counted tokens),
    ``"mse"`` (mean over a sample's elements), or the name of a graph output
    holding per-sample (per-token) losses.  ``T`` may differ between batches
    (the statistics record the first batch's).  ``candidates``: block names
    (``blocks.0``: the input of a residual ``Add``'s block, named after its
    scope), ``"head"`` (the last block's output) or tensor names; default every
    residual block, and ``head`` unless ``head=False``
    (:func:`~satcore.adapters.onnx.locate.resolve_candidates`).
    ``family``: ``"auto"``, a kind, a :class:`~satcore.Family`, a callable
    ``z -> psi``, or a mapping candidate -> one of those (candidates it leaves
    out get ``"auto"``); built-in kinds use ``make_family(kind, width,
    seed=seed)``, ``n_features`` (an int or a mapping candidate -> int) their
    ``r``.  ``split``: the name of the probe data (a training split warns).  For candidate ``z``, ``q_i = d
    loss_i / d z_i`` comes from our backward graph of the model run by ONNX
    Runtime (:mod:`.autodiff`; ``providers``: its execution providers,
    default ``["CPUExecutionProvider"]``), ``psi`` from
    :mod:`satcore._formulas.families`, and both enter :class:`~satcore.CandidateStatistics`
    (``C = (1/M) sum_i Q_i^T Psi_i``, ``K = (1/M) sum_i Psi_i^T Psi_i``; the growth
    value ``sqrt(tr(C K^+ C^T))`` is ``||Pi_S q_S||_S`` of Theorem 2 / Lemma 4).
    ``variance`` also accumulates ``sum_i X_i^T X_i`` (debiased growth value,
    :mod:`satcore._statistics.candidate`).  The model must not mix samples (inference
    graph: no training-mode BatchNormalization); inference BatchNormalization
    is rewritten as an affine map.  ``options`` are the fields of :class:`ProbeConfig` (or ``config``).
    """
    state = Probe(model, config, **options)
    for batch in data:
        state.update(batch)
    return state.result()


class Probe:
    """Incremental growth statistics of an ONNX model: :meth:`update` per batch, :meth:`result` any time.

    The same probe as :func:`probe` (its options, its statistics), fed one batch
    at a time, e.g. from a loop that produces them, as the torch and TensorFlow ``Probe`` are.
    ``config`` is a :class:`ProbeConfig`; keyword ``options`` build one (or replace its fields).
    """

    def __init__(self, model, config: ProbeConfig | None = None, **options):
        self.config = config = resolve_options(ProbeConfig, config, **options)
        for r in (config.n_features.values() if isinstance(config.n_features, Mapping) else [config.n_features]):
            if r is not None:  # before ONNX Runtime starts: the r x r Gram alone may be over the budget
                check_feature_count(r)
        self.session = per_sample_gradients(model, loss=config.loss, candidates=config.candidates,
                                            output=config.output, providers=config.providers,
                                            head=config.head)
        self.names = list(self.session.candidates)
        try:
            self.specs = per_candidate(config.family, self.names, "family", default="auto")
            self.widths = per_candidate(config.n_features, self.names, "n_features")
        except ValueError as exc:
            raise OnnxProbeError(str(exc)) from None
        warn_if_training_split(config.split)
        self.stats = DepthStatistics()
        self.maps: dict = {}
        self.batches_done = 0
        model_name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "ModelProto"
        self.meta = probe_meta("onnx", model_name, config.loss, config, output=self.session.output,
                               gradient_route=self.session.route,
                               tensors=dict(zip(self.names, self.session.tensors)))

    def update(self, batch) -> int:
        """Add one batch (:func:`split_batch`); returns its number of samples (0: an empty batch)."""
        index = self.batches_done
        try:
            captured = self.session(batch)
        except OnnxProbeError as exc:
            raise OnnxBatchError(f"batch {index}: {exc}") from None
        if captured is None:
            self.batches_done += 1
            return 0
        acts, grads = captured
        for name in self.names:
            z, g = acts[name], grads[name]
            if name not in self.maps:  # a family or feature count its stream cannot take: the candidate's refusal
                try:
                    self.maps[name] = feature_map(self.specs[name], z, seed=self.config.seed,
                                                  init_std=self.config.init_std, n_features=self.widths[name])
                except InputError as exc:
                    raise OnnxProbeError(f"candidate {name!r}: {exc}") from None
            try:
                q, psi = positions(g), self.maps[name](z)
                if name not in self.stats:
                    self.stats[name] = CandidateStatistics(q.shape[2], psi.shape[2], q.shape[1],
                                                           self.config.variance, stream=True)
                # T may change from batch to batch (the first batch's is kept)
                self.stats[name].update(q, psi, z=positions(z))
            except ValueError as exc:
                raise OnnxBatchError(f"batch {index}: candidate {name!r}: {exc}") from None
        self.batches_done += 1
        return len(next(iter(acts.values())))

    def result(self) -> ProbeResult:
        """The statistics of every batch so far (a copy: the probe can go on)."""
        if not self.stats:
            raise OnnxProbeError("the data held no samples")
        meta = {**self.meta, "family": {n: self.maps[n].describe() for n in self.names}}
        return ProbeResult(copy.deepcopy(self.stats), meta)


def _output_elements(out_info, feeds) -> int:
    """Elements per sample of the loss's output (for mse and per-token loss outputs)."""
    shape = out_info.shape if out_info is not None else None
    if shape is not None and all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return int(np.prod(shape[1:], dtype=np.int64))
    # symbolic non-batch dims (e.g. sequence length): assume they follow the first input's
    first = next(iter(feeds.values()))
    if shape is not None and len(shape) == first.ndim:
        dims = [d if isinstance(d, int) and d > 0 else first.shape[k] for k, d in enumerate(shape)]
        return int(np.prod(dims[1:], dtype=np.int64))
    raise OnnxProbeError("cannot tell the number of elements per sample of the loss output; give it a static shape")
