"""``probe``: stream a model over data and accumulate every candidate's statistics.

Per batch: one forward with the stream taps of :mod:`.capture`, per-sample
losses ``loss_i`` from ``loss_fn``, ONE backward of ``sum_i loss_i`` to the
taps, which gives every sample's ``q_i = d loss_i / d z_i`` at once because
in eval mode samples do not interact (the model is switched to ``eval()`` for
the probe and restored after; a model that mixes samples in eval mode,
e.g. BatchNorm in training mode or batch-level attention across samples,
violates this).  Streams and gradients are read batch-first, also where
the model keeps them ``(T, B, d)`` (:mod:`.capture`).  Features
``psi(z_i)`` are computed without a graph; the batch sums are added up in
float64 on the model's device (:mod:`.running`) into the core's
:class:`satcore.CandidateStatistics` (on the CPU the first batches' tapped
tensors may wait for that while they are smaller than the totals:
:meth:`Probe._holds_tapped`; the sums and their bits are the same).  Positions a padding mask marks as
absent are left out of every sum (:mod:`.masks`).
Gradients go to the taps only (``torch.autograd.grad``), never into the
parameters' ``.grad``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch
from torch import nn

from satcore.adapters.base import ProbeOptions, probe_meta, refusing_bad_batch, resolve_options, warn_if_training_split
from satcore.adapters.batches import split_batch
from satcore.adapters.options import family_option_label, per_candidate
from satcore import DepthStatistics
from satcore import InputError, ModelOnDataError, ProbeError
from satcore import CandidateStatistics
from satcore.adapter_api import derived_seed, no_batches, split_words, statistics_bytes
from satcore.adapter_api import DEFAULT_FOLDS

from .capture import StreamTaps
from .checkpoint import load_checkpoint, model_fingerprint, save_checkpoint
from .distributed import reduce_probe
from .features import ConvFeatures, build_feature_map, positions, rebuild_feature_map, rebuildable
from .hf import model_loss, scalar_loss_problem
from .locate import HEAD, locate_candidates
from .masks import applies, batch_mask, check_samples, drop_absent, mask_label
from .moments import (
    batch_moments,
    conv_batch_moments,
    float64_device,
    packs_grams,
    position_index,
    squared_norm,
    subsample_positions,
)
from .result import ProbeResult
from .running import RunningSums


# what torch raises for inputs or targets of a shape, dtype or range the model or loss cannot take
BATCH_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)


def call_model(model: nn.Module, inputs):
    """``model(**inputs)`` for a mapping, ``model(*inputs)`` for a tuple/list, else ``model(inputs)``."""
    if isinstance(inputs, Mapping):  # a dict, or a tokenizer's BatchEncoding (a UserDict)
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def to_device(x, device):
    if torch.is_tensor(x):
        return x.to(device)
    if isinstance(x, Mapping):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(v, device) for v in x)
    return x


def per_sample_losses(losses: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``(B,)`` losses as given; a 0-d loss is read as the batch MEAN and rescaled by ``B``.

    Either way ``sum_i loss_i`` is returned, whose gradient at ``z_i`` is
    ``q_i`` (docs/core.md, Conventions: a batch-mean loss would give ``q_i / B``).
    """
    if not torch.is_tensor(losses):
        raise TypeError(f"loss_fn must return a tensor, got {type(losses).__name__}")
    if losses.dim() == 0:
        return losses * batch_size
    if losses.shape != (batch_size,):
        raise ValueError(
            f"loss_fn returned shape {tuple(losses.shape)}; expected per-sample losses ({batch_size},) or a scalar mean"
        )
    return losses.sum()


def _batch_size(losses, streams: dict, names) -> int:
    """``B``: the length of ``(B,)`` per-sample losses, else (a scalar mean) of the first
    candidate's batch; every candidate's batch-first stream must have ``B`` samples."""
    if torch.is_tensor(losses) and losses.dim() == 1:
        size, source = losses.shape[0], f"loss_fn returned {losses.shape[0]} per-sample losses"
    else:
        size = streams[names[0]].shape[0]
        source = f"candidate {names[0]!r} has {size}"
    for name in names:
        shape = tuple(streams[name].shape)
        if shape[0] != size:
            # a (T, B, d) stream read as batch-first shows up here, unless T == B
            raise ValueError(
                f"candidate {name!r} has a stream of batch-first shape {shape} ({shape[0]} samples) but {source}; "
                "a stream that is not batch-first is recognised only at a module with batch_first=False"
            )
    return size


def unwrap_data_parallel(model: nn.Module) -> nn.Module:
    """The module inside ``DistributedDataParallel`` / ``DataParallel``: the same weights, without the
    wrapper's gradient synchronisation, which the probe does not want (its gradients go to the stream
    taps, never to the parameters) and which it replaces by the all-reduce of its sums."""
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return model


def input_device(model: nn.Module, parameter) -> torch.device:
    """Where the batches go: for a model dispatched by ``accelerate`` (``hf_device_map``) the device of
    its first module, as accelerate itself does (offloaded ``"cpu"``/``"disk"`` modules compute on
    the CPU; their parameters sit on the meta device), else that of the first parameter."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        first = next(iter(device_map.values()))
        return torch.device("cpu") if first in ("cpu", "disk") else torch.device(first)
    return parameter.device if parameter is not None else torch.device("cpu")


def reads_without_sync(device: torch.device) -> bool:
    """Whether reading a value of a tensor on ``device`` on the host waits for no device queue: the CPU's."""
    return device.type == "cpu"


def model_init_std(model: nn.Module) -> float | None:
    """The model's init scale when it states one (Hugging Face ``config.initializer_range``)."""
    value = getattr(getattr(model, "config", None), "initializer_range", None)
    return float(value) if value is not None else None


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.train(training)


def _family_label(family):
    if isinstance(family, dict):
        return {name: _family_label(f) for name, f in family.items()}
    return family_option_label(family)


@dataclass(frozen=True)
class ProbeConfig(ProbeOptions):
    """How a :class:`Probe` runs: every setting in one frozen object (the options every adapter
    takes, :class:`satcore.adapters.base.ProbeOptions`, and the torch ones).

    Attributes
    ----------
    candidates : ``None`` (the blocks :func:`find_candidates` recognises) or a
        list of module names (the input of each).
    family : ``"auto"`` (``conv`` for ``(M, C, H, W)`` streams, else ``mlp``),
        ``"mlp"``/``"conv"``/``"linear"``/``"bias"``, ``"native"`` (the tangent
        space of the block ``insert_block(model, name, seed=seed)`` inserts:
        :mod:`.native`), an ``nn.Module`` feature map, or a dict candidate name ->
        one of those.  Built-in weights are
        ``satcore.make_family(kind, width, seed=seed, init_std=...)``.
    seed : seed of the built-in families' weights and of ``position_subsample``.
    init_std : ``mlp`` weight scale; default the model's own
        (``config.initializer_range``) when it has one, else ``width**-0.5``.
    variance : also accumulate ``sum X_i^T X_i`` (debiased growth value).
    curvature : also accumulate ``sum_qq = sum_i Q_i^T Q_i`` (``N x N``), the
        activation-gradient second moment ``F`` of the Kronecker-factored
        second-order predictions (:func:`satcore.predict_gains`).
    position_subsample : keep this many positions per batch (uniform, scaled
        by ``sqrt(T/T')``: unbiased sums; see :mod:`.moments`).
    mask : which positions are data, for padded batches.  ``"auto"``: the
        inputs' ``"attention_mask"`` when they are a mapping holding one (a
        ``(B, T)`` tensor, as Hugging Face tokenizers give with
        ``padding=True``), else none; ``None``: every position counts; or a
        callable ``mask(inputs) -> (B, T)`` tensor (inputs on the model's
        device), for models whose inputs are not a mapping.  Positions where
        the mask is 0 are absent: their rows of ``q`` and ``psi`` are zeroed
        before the batch sums (so ``K``, ``C``, ``sum ||Q_i||^2`` and the
        variance sums leave them out, and the statistics' ``n_vectors``, which
        ``tangent_complete`` compares the rank with, does not count them;
        under ``position_subsample`` the mask of the kept positions is
        applied), and the stream diagnostics (``sum ||z_i||^2``, the block
        update and the per-position RMS, hence ``grow``'s ``rho``) count only
        the others.  The mask concerns only candidates whose batch-first
        stream is ``(B, T, d)`` with its ``T``; the others (images
        ``(B, C, H, W)``, a stream of another length, ``(B, d)`` vectors)
        count every position.  A mask whose ``B`` is not the batch's is
        refused.
    batch_dtype : dtype of the per-batch sums (totals are float64, kept on the
        model's device; on Apple's MPS, which has no float64, float64 sums and
        totals are computed on the CPU).  With float64 and a float32 model on
        the CPU, ``sum_cross`` alone is one float32 product of the centred
        features plus a float64 rank-one term (:func:`.moments.centred_cross`:
        half the time of the float64 product, within the suite's float64
        exactness checks).
    head : add the ``"head"`` endpoint (output of the last block).
    split : name of the probe data, passed to the report (a training split
        warns: the finite-sample test assumes an independent probe).
    n_features : the built-in families' ``r`` (an int, or a dict candidate
        name -> int; default the family's own: ``4 d`` for ``mlp``, ``9 C`` for
        ``conv``).  A candidate's sums take ``8 (N r + r^2)`` bytes
        (``+ 8 r^2`` with ``variance``): a smaller ``r`` is what fits a wide
        model; :func:`plan` says how much.
    checkpoint, checkpoint_every : save the running sums to this ``.npz``
        every ``checkpoint_every`` batches; if the file exists the probe resumes
        from it (:attr:`Probe.batches_done` batches are held already:
        :func:`probe` skips them, so ``data`` must yield the same batches in the
        same order).  Under ``torch.distributed`` give each rank its own path.
    """

    curvature: bool = False
    position_subsample: int | None = None
    mask: object = "auto"
    batch_dtype: torch.dtype = torch.float64
    head: bool = True
    checkpoint: str | os.PathLike | None = None
    checkpoint_every: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        mask_label(self.mask)  # refuses what is not a mask


@dataclass(frozen=True)
class TappedBatch:
    """One batch's tapped tensors, per candidate name, until :meth:`Probe._add_tapped` adds its sums.

    ``index``: the batch's number in the probe (its position-subsampling seed); ``streams`` and ``grads``:
    ``z`` and ``q``, batch-first, without a graph; ``updates``: the block update's sums; ``calls``: the
    call's arguments where a feature map reads them; ``keep``: the batch's padding mask, or ``None``.
    """

    index: int
    streams: dict
    grads: dict
    updates: dict
    calls: dict
    keep: torch.Tensor | None


class Probe:
    """Incremental probe of ``model``: :meth:`update` one batch at a time, :meth:`result` at any point.

    Per batch: one forward with the stream taps of :mod:`.capture`, per-sample
    losses ``loss_i``, ONE backward of ``sum_i loss_i`` to the taps, and the
    batch's sums added in float64 on the model's device (module docstring).
    The model is in ``eval()`` mode and tapped only inside :meth:`update`:
    between updates it trains as usual, so a training loop (or a callback)
    can feed the probe as it goes.

    Parameters
    ----------
    model : the ``nn.Module``.
    loss_fn : ``loss_fn(outputs, targets) -> (B,)`` per-sample losses
        (:func:`sequence_loss` for causal LMs).  ``None`` for mapping batches
        holding ``labels`` (Hugging Face): the model's own loss per sample,
        -100 labels ignored (:func:`.hf.per_sample_loss`).  A 0-d loss is read
        as the batch MEAN and multiplied by ``B`` (with a warning); it is
        refused where that is not ``sum_i loss_i`` (a padding mask leaves
        positions out, or samples have different numbers of labels).
    config : a :class:`ProbeConfig`; keyword ``options`` build one (or
        replace fields of ``config``).

    A batch is ``(inputs, targets)`` (``inputs`` passed as :func:`call_model`
    says) or a mapping of model inputs, passed whole as ``model(**batch)``,
    whose ``"labels"`` are the targets (a ``DataCollator``'s output, a
    ``BatchEncoding``); either is moved to the model's device.
    """

    def __init__(self, model: nn.Module, loss_fn=None, config: ProbeConfig | None = None, **options):
        config = resolve_options(ProbeConfig, config, **options)
        model = unwrap_data_parallel(model)
        self.model, self.loss_fn, self.config = model, loss_fn, config
        self.found = locate_candidates(model, config.candidates, head=config.head)
        names = [c.name for c in self.found]
        self.family = per_candidate(config.family, names, "family", default="auto")
        self.n_features = per_candidate(config.n_features, names, "n_features")
        self.init_std = model_init_std(model) if config.init_std is None else config.init_std
        parameter = next(model.parameters(), None)
        self.dtype = parameter.dtype if parameter is not None else torch.float32
        self.device = input_device(model, parameter)
        self.settings = {  # what a checkpoint must agree on to be resumed
            "candidates": names,
            "family": _family_label(config.family),
            "seed": config.seed,
            "init_std": self.init_std,
            "position_subsample": config.position_subsample,
            "variance": config.variance,
            "mask": mask_label(config.mask),
        }
        if config.checkpoint is not None:  # a checkpoint resumes only on the model that wrote it
            self.settings["model"] = model_fingerprint(model)  # a pass over every tensor: only when it is used
        if config.n_features is not None:  # only then: checkpoints written before the option still resume
            self.settings["n_features"] = config.n_features
        self.statistics, self.families, self.specs = DepthStatistics(), {}, {}
        self.running: dict[str, RunningSums] = {}
        self.tapped: list[TappedBatch] = []  # batches not yet in the running sums (_holds_tapped)
        self.unread_losses: list[tuple[int, torch.Tensor, int]] = []  # (batch, non-finite count on its device, size)
        self.batches_done = 0
        self._warned_scalar = False
        if config.checkpoint is not None and os.path.exists(config.checkpoint):
            self.statistics, self.specs, self.batches_done = load_checkpoint(
                config.checkpoint, self.settings)
        warn_if_training_split(config.split)

    def feature_map(self, name: str, z: torch.Tensor, candidate):
        """The feature map of candidate ``name`` (the located ``candidate``) for streams like ``z``, built from the
        probe's options; a family or feature count its stream cannot take is refused naming the candidate."""
        try:
            return build_feature_map(self.family[name], z, seed=self.config.seed, init_std=self.init_std,
                                     n_features=self.n_features[name], model=self.model, candidate=candidate)
        except InputError as exc:
            raise ProbeError(f"candidate {name!r}: {exc}") from None

    def update(self, batch) -> int:
        """Add one batch (see the class docstring); returns its number of samples."""
        config, names = self.config, [c.name for c in self.found]
        inputs, targets = split_batch(batch, targets_to_model=True)
        loss_fn = self.loss_fn
        if loss_fn is None:
            if not isinstance(inputs, Mapping) or targets is None:
                raise InputError("loss_fn is needed unless every batch is a mapping of model inputs holding 'labels' "
                                 "(then the model's own per-sample loss is used)")
            loss_fn = model_loss(self.model)
        # gradients also where the caller runs without them (an evaluation hook under no_grad / inference_mode)
        with torch.inference_mode(False), torch.enable_grad(), eval_mode(self.model), \
                StreamTaps(self.model, self.found) as taps:
            inputs = to_device(inputs, self.device)
            keep = batch_mask(config.mask, inputs, self.device)
            taps.clear(keep)
            with refusing_bad_batch(self.batches_done, BATCH_ERRORS, passing=(torch.cuda.OutOfMemoryError,)):
                outputs = call_model(self.model, inputs)
                missing = [n for n in names if n not in taps.taps]
                if missing:
                    raise ProbeError(f"candidate(s) {missing} did not run in the forward pass")
                targets = to_device(targets, self.device)
                losses = loss_fn(outputs, targets)
            samples = _batch_size(losses, taps.streams, names)
            check_samples(keep, samples)
            if torch.is_tensor(losses):
                self._check_losses(losses.detach())
            if torch.is_tensor(losses) and losses.dim() == 0:
                self._check_scalar_loss(keep, targets)
            grads = taps.gradients(per_sample_losses(losses, samples), names)
            for name in names:  # built from the first batch's streams
                if name not in self.families:
                    self.families[name] = self.feature_map(name, taps.streams[name], taps.by_name[name]).eval()
            self.tapped.append(TappedBatch(
                self.batches_done, {n: taps.streams[n] for n in names}, dict(zip(names, grads)),
                dict(taps.updates), {n: taps.calls[n] for n in names if self.families[n].reads_context}, keep))
        self.batches_done += 1
        if not self._holds_tapped():
            self._add_tapped()
        if config.checkpoint is not None and self.batches_done % config.checkpoint_every == 0:
            self.save_checkpoint()
        return samples

    def _check_losses(self, losses: torch.Tensor) -> None:
        """Refuse a batch whose per-sample ``losses`` hold NaN or inf: they make every gradient, so every sum,
        NaN, and nothing after them could be scored.  On the CPU at once; on an accelerator the count of
        non-finite losses stays on the device (reading it per batch would stall the queue, as a sum's
        ``float()`` would) and :meth:`_refuse_non_finite_losses` reads it at the probe's next sync."""
        bad = (~torch.isfinite(losses)).sum()
        self.unread_losses.append((self.batches_done, bad, losses.numel()))
        if reads_without_sync(losses.device):
            self._refuse_non_finite_losses()

    def _refuse_non_finite_losses(self) -> None:
        """Raise :class:`satcore.ModelOnDataError` naming the first batch of :attr:`unread_losses` that held a NaN or
        infinite loss, if one did; one host read for all of them, where the probe syncs anyway (a result, a
        checkpoint), before anything of those batches' sums is handed out or written."""
        if not self.unread_losses:
            return
        counts = torch.stack([bad for _, bad, _ in self.unread_losses]).cpu().tolist()
        pending, self.unread_losses = self.unread_losses, []
        for (batch, _, size), bad in zip(pending, counts):
            if bad:
                raise ModelOnDataError(f"batch {batch}: the loss is NaN or infinite for {bad} of {size} sample(s) "
                                       "(the model's outputs or the data)")

    def _holds_tapped(self) -> bool:
        """Whether the batches in :attr:`tapped` wait for the running sums: on the CPU, up to the first batch
        added, while their streams and gradients take no more bytes than the Gram totals (packed where
        :func:`.moments.packs_grams`; with ``variance`` also ``sum_xtx``) that adding them would make.

        Those totals are the bulk of what a probe holds while the model's graph is (a GPT-2 of 8 blocks,
        ``r = 1024``: 33.6 MB packed, against 8.4 MB of streams and gradients a batch of 4 x 128), so
        waiting takes the totals off the first batches' forwards and backwards; a batch whose tensors
        outweigh them (a ResNet's image maps) is added at once.
        """
        if self.running or self.device.type != "cpu":
            return False
        held = sum(t.nbytes for batch in self.tapped for t in (*batch.streams.values(), *batch.grads.values()))
        per_gram = ((lambda r: r * (r + 1) // 2) if packs_grams(self.device) else (lambda r: r * r))
        grams = 2 if self.config.variance else 1
        return held <= sum(8 * grams * per_gram(f.n_features) for f in self.families.values())

    def _add_tapped(self) -> None:
        """Add the batches in :attr:`tapped` to the running sums, in their order: the sums, the same
        additions and the same bits as when each is added as it comes."""
        config, names = self.config, [c.name for c in self.found]
        with torch.inference_mode(False):  # the totals may be made here, under a caller's inference_mode
            while self.tapped:
                batch = self.tapped.pop(0)
                generator = torch.Generator().manual_seed(derived_seed(config.seed * 1_000_003 + batch.index))
                for name in names:
                    z, grad = batch.streams.pop(name), batch.grads.pop(name)  # let go of each once added
                    feature_map = self.families[name]
                    if feature_map.reads_context:  # the native family runs the fresh block with the call's context
                        feature_map.context = batch.calls[name]
                    if name not in self.running:
                        self.running[name] = _running_sums(name, z, feature_map, self.statistics, config,
                                                           has_update=batch.updates.get(name) is not None)
                    present = batch.keep if applies(batch.keep, z) else None
                    moments = _batch_sums(z, grad, feature_map, generator, config, self.running[name].matrices,
                                          present, batch.updates.get(name))
                    self.running[name].add(moments)

    def _check_scalar_loss(self, keep, targets) -> None:
        problem = scalar_loss_problem(keep, targets)
        if problem is not None:
            raise ValueError(
                f"loss_fn returned a 0-d loss (a batch mean) but {problem}: B times that mean is not the sum of "
                "per-sample losses; pass loss_fn=None with batches holding 'labels' (the model's own per-sample "
                "loss), sequence_loss for a causal LM, or a loss_fn returning (B,) per-sample losses"
            )
        if not self._warned_scalar:
            self._warned_scalar = True
            warnings.warn("loss_fn returned a 0-d loss: read as the batch mean and multiplied by the batch size; "
                          "return (B,) per-sample losses to avoid relying on that", UserWarning, stacklevel=3)

    def save_checkpoint(self) -> None:
        """Write the running sums to ``config.checkpoint`` (a ``satcore-dump/1`` file)."""
        self._refuse_non_finite_losses()
        self._add_tapped()
        _sync(self.running, self.statistics)
        save_checkpoint(self.config.checkpoint, self.statistics, _specs(self.families),
                        self.batches_done, self.settings)

    def result(self, *, copy_sums: bool = True) -> ProbeResult:
        """The statistics of every batch so far (summed over ranks under ``torch.distributed``).

        The probe can go on after it: the result holds copies of the sums
        (``copy_sums=False``: the probe's own, for a last call, without doubling the memory).
        """
        self._refuse_non_finite_losses()
        self._add_tapped()
        # without copies nor a checkpoint to write, no batch follows (probe's last call)
        _sync(self.running, self.statistics, last=not copy_sums and self.config.checkpoint is None)
        ordered = DepthStatistics(
            (c.name, self.statistics[c.name]) for c in self.found if c.name in self.statistics)
        if len(ordered) != len(self.found):
            raise ProbeError("data yielded no batches: nothing was probed")
        for name, spec in self.specs.items():  # resumed from a checkpoint that already held every batch
            if name not in self.families and rebuildable(spec):
                self.families[name] = rebuild_feature_map(spec, self.dtype, self.device)
        if self.config.checkpoint is not None:
            self.save_checkpoint()
        # copies: on the CPU the running totals are these very arrays, which later updates add to
        if copy_sums:
            ordered = copy.deepcopy(ordered)
        ordered = reduce_probe(ordered, self.device)
        return ProbeResult(
            statistics=ordered,
            families=dict(self.families),
            candidates=self.found,
            meta=probe_meta("torch", type(self.model).__name__, self.loss_fn, self.config),
        )


@dataclass(frozen=True)
class CandidatePlan:
    """Memory of one candidate's statistics, in bytes (float64 everywhere).

    ``sums_bytes = 8 (N r + r^2 + m N r + m)`` (``sum_cross``, ``sum_gram``,
    the ``m`` folds' ``fold_cross`` and counts; ``+ 8 r^2`` for ``sum_xtx`` with
    ``variance``, ``+ 8 N^2`` for ``sum_qq`` with ``curvature``:
    :func:`satcore._shared.arrays.statistics_bytes`): held on the model's device by the
    running totals and once more on the host (on a CPU model the two are the
    same memory).  ``batch_bytes``: one batch's transient sums and features in the
    batch dtype (``b`` bytes an entry), ``b (N r + 4 M T r + M min(N, T) r)``:
    ``sum_cross``, the features with their normalised input and activation,
    and the factor products behind ``sum ||X_i||^2``; the model's own
    activations and graph are not counted.  ``map_bytes``: the feature map's
    own weights (``W1`` of ``mlp``: ``r N`` entries of the model's dtype).  ``score_bytes = 8 (N r + 3 r^2 + 3 m N r)``:
    scoring forms ``C``, the unit-diagonal Gram and its eigenvectors (one
    ``r x r`` more for ``K^+`` with ``variance``, counted in the ``3``), and the
    fold Grams' transient copies of the fold sums (the fold means and their
    whitened form); a score keeps only ``k x k`` of them, so scoring holds one
    candidate's need at a time.
    """

    name: str
    n_hidden: int
    n_features: int
    sums_bytes: int
    batch_bytes: int
    score_bytes: int
    map_bytes: int = 0


@dataclass(frozen=True)
class MemoryPlan:
    """What a probe will hold (:func:`plan`): per candidate and in total, on device and host."""

    candidates: tuple[CandidatePlan, ...]
    device: str

    @property
    def device_bytes(self) -> int:
        return sum(c.sums_bytes for c in self.candidates)

    @property
    def host_bytes(self) -> int:
        """The host's copy of the sums (0 extra on a CPU model: they are the device totals)."""
        return 0 if self.device == "cpu" else self.device_bytes

    @property
    def peak_bytes(self) -> int:
        """The probe's peak on the device above the model's own forward + backward (which training
        needs anyway): every candidate's sums and feature map plus the largest batch transient
        (measured within 10% on a CPU GPT-2, ``bench/bench_memory_plan.py``)."""
        return (self.device_bytes + sum(c.map_bytes for c in self.candidates)
                + max(c.batch_bytes for c in self.candidates))

    @property
    def score_bytes(self) -> int:
        """Scoring goes candidate by candidate: the largest candidate's need."""
        return max(c.score_bytes for c in self.candidates)

    def least_max_bytes(self, *, splits: int = 1) -> int:
        """The smallest ``max_bytes`` :meth:`passes` accepts: the largest candidate's ``splits`` sums, or the head's
        together with the block before it (they share a pass), whichever is larger.

        Examples
        --------
        >>> rows = tuple(CandidatePlan(n, 4, 8, sums_bytes=b, batch_bytes=0, score_bytes=0)
        ...              for n, b in (("b0", 300), ("b1", 100), (HEAD, 150)))
        >>> MemoryPlan(rows, "cpu").least_max_bytes(splits=2)
        600
        """
        need = [splits * c.sums_bytes for c in self.candidates]
        pairs = [need[i - 1] + need[i] for i, c in enumerate(self.candidates) if c.name == HEAD and i]
        return max(need + pairs)

    def passes(self, max_bytes: int, *, splits: int = 1) -> list[tuple[str, ...]]:
        """The candidates in consecutive groups whose sums, ``splits`` probes of them held at once
        (two for a train / held-out pair), take at most ``max_bytes``: one probe pass per group
        instead of one for all, each candidate's statistics the same.

        Greedy in the candidates' order (the stream's), so a pass holds neighbouring blocks; the
        ``head`` stays with the block before it (its tap is that block's output; :func:`pass_options`
        probes a group), so the smallest budget that works holds the last block's and the head's
        sums together.  A candidate (or that pair) whose sums exceed ``max_bytes`` is refused
        (:class:`satcore.InputError`), naming the bytes it needs.

        Examples
        --------
        >>> rows = tuple(CandidatePlan(f"b{i}", 4, 8, sums_bytes=100, batch_bytes=0, score_bytes=0) for i in range(5))
        >>> MemoryPlan(rows, "cpu").passes(450, splits=2)
        [('b0', 'b1'), ('b2', 'b3'), ('b4',)]
        """
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, numbers.Integral) or max_bytes < 1:
            raise InputError(f"max_statistics_bytes must be a positive integer (bytes), got {max_bytes!r}")
        groups, held = [], 0
        for c in self.candidates:
            need = splits * c.sums_bytes
            if need > max_bytes:
                raise InputError(f"candidate {c.name!r} alone holds {_needed(need)} of statistics "
                                 f"({splits} split(s) of N={c.n_hidden}, r={c.n_features}); the statistics budget is "
                                 f"{max_bytes:,} bytes, the least that works "
                                 f"{_needed(self.least_max_bytes(splits=splits))}")
            if c.name == HEAD and groups and held + need > max_bytes:  # its block moves to the head's group
                block = groups[-1].pop()
                groups = [g for g in groups if g]
                groups.append([block])
                held = splits * next(b.sums_bytes for b in self.candidates if b.name == block)
                if held + need > max_bytes:
                    raise InputError(f"the head and {block!r} (whose output it reads) hold {_needed(held + need)} "
                                     f"of statistics together ({splits} split(s)); the statistics budget is "
                                     f"{max_bytes:,} bytes, the least that works "
                                     f"{_needed(self.least_max_bytes(splits=splits))}")
            if groups and held + need <= max_bytes:
                groups[-1].append(c.name)
                held += need
            else:
                groups.append([c.name])
                held = need
        return [tuple(g) for g in groups]


def gib_up(n_bytes: int) -> str:
    """``n_bytes`` in GiB rounded UP to 3 significant digits (a budget of that many GiB holds it)."""
    gib = n_bytes / 2**30
    step = 10.0 ** (math.floor(math.log10(gib)) - 2)
    return f"{math.ceil(gib / step) * step:.3g}"


def _needed(n_bytes: int) -> str:
    """``n_bytes`` exactly and in GiB rounded up (:func:`gib_up`)."""
    return f"{n_bytes:,} bytes ({gib_up(n_bytes)} GiB)"


def pass_options(group) -> dict:
    """The probe options that probe exactly the candidates ``group`` names (a :meth:`MemoryPlan.passes`
    group): its blocks by name, and the head where the group holds it (after the block it reads)."""
    return {"candidates": [n for n in group if n != HEAD], "head": HEAD in group}


def plan(model: nn.Module, batch, loss_fn=None, *, config: ProbeConfig | None = None, **options) -> MemoryPlan:
    """The memory a probe with these settings will hold, from one forward pass of ``batch`` (no backward).

    The forward gives each candidate's width ``N``; the feature maps the probe
    would build give ``r`` (see :class:`CandidatePlan` for the formulas).
    """
    state = Probe(model, loss_fn, config, **options)
    inputs, _ = split_batch(batch, targets_to_model=True)
    names = [c.name for c in state.found]
    with torch.no_grad(), eval_mode(state.model), StreamTaps(state.model, state.found) as taps:
        call_model(state.model, to_device(inputs, state.device))
        missing = [n for n in names if n not in taps.streams]
        if missing:
            raise ProbeError(f"candidate(s) {missing} did not run in the forward pass")
        rows = []
        for name in names:
            z = taps.streams[name]
            feature_map = state.feature_map(name, z, taps.by_name[name])
            M, T, N = positions(z).shape
            r = feature_map.n_features
            entry = torch.empty(0, dtype=state.config.batch_dtype).element_size()
            m = DEFAULT_FOLDS  # the folds every probe keeps (_running_sums)
            rows.append(CandidatePlan(name, N, r, statistics_bytes(N, r, variance=state.config.variance, n_folds=m,
                                                                   curvature=state.config.curvature),
                                      entry * (N * r + 4 * M * T * r + M * min(N, T) * r),
                                      8 * (N * r + 3 * r * r + 3 * m * N * r),
                                      sum(t.numel() * t.element_size() for t in
                                          list(feature_map.parameters()) + list(feature_map.buffers()))))
    return MemoryPlan(tuple(rows), state.device.type)


def probe(model: nn.Module, data, loss_fn=None, *, progress: bool | Callable[[int], None] = False,
          config: ProbeConfig | None = None, plan_only: bool = False, **options) -> ProbeResult | MemoryPlan:
    """Probe ``model`` on every batch of ``data``: a loop of :meth:`Probe.update`, then :meth:`Probe.result`.

    ``loss_fn`` and the batch convention are :class:`Probe`'s; ``options`` are
    the fields of :class:`ProbeConfig` (or ``config``); ``progress`` True shows a
    tqdm bar counting samples (samples/s); a callable is called instead with
    each batch's sample count once the batch is probed (a caller's own bar, as
    ``satcore expand``'s).  A probe resumed from a checkpoint
    skips the batches it already holds.  ``plan_only``: return the
    :class:`MemoryPlan` of the probe from ``data``'s first batch (:func:`plan`)
    instead of probing.
    """
    if plan_only:
        return plan(model, next(iter(data)), loss_fn, config=config, **options)
    state = Probe(model, loss_fn, config, **options)
    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(unit="sample", desc="probe")
        progress = bar.update
    skip = state.batches_done
    batches_left = _batches_left(data, skip) if bar is not None else None
    index = -1
    try:
        for index, batch in enumerate(data):
            if index >= skip:
                samples = state.update(batch)
                if batches_left and bar.total is None:  # the sample total, once a batch's size is known
                    bar.total = samples * batches_left
                if progress:
                    progress(samples)
    finally:
        if bar is not None:
            if bar.total is not None:  # the estimate (a shorter last batch) ends at what was read
                bar.total = bar.n
            bar.close()
    if index < 0 and not skip:  # named here, where data is at hand: an exhausted iterator reads as empty
        split = state.config.split
        raise ProbeError(no_batches(data, f"the {split_words(split)} data" if split else "data") + ": nothing was probed")
    return state.result(copy_sums=False)  # the probe ends here: no second set of sums


def _batches_left(data, skip: int) -> int | None:
    """How many batches of ``data`` a probe that skips ``skip`` reads, where ``data`` has a length (a list, a
    ``DataLoader``); None for a generator or an iterable dataset's loader (whose ``len`` raises)."""
    try:
        return max(0, len(data) - skip)
    except TypeError:
        return None


def _specs(families):
    return {name: fm.spec for name, fm in families.items()}


def _sync(running, statistics, *, last: bool = False):
    """Each candidate's ``statistics`` made those of every batch so far (:meth:`RunningSums.sync`; ``last``:
    no batch follows)."""
    for name, sums in running.items():
        statistics[name] = sums.sync(last=last)


def _running_sums(name, z, feature_map, statistics, config, *, has_update: bool) -> RunningSums:
    """Device totals of candidate ``name``, seeded from its resumed statistics if any; they keep the
    stream sums, and the block update's where the block keeps the shape (``has_update``)."""
    if name not in statistics:
        _, T, N = positions(z).shape
        keep = config.position_subsample
        kept = T if keep is None else min(keep, T)  # the statistics see the subsampled positions
        statistics[name] = CandidateStatistics(N, feature_map.n_features, kept, config.variance,
                                               curvature=config.curvature, stream=True, block_update=has_update)
    return RunningSums(statistics[name], float64_device(z.device))


def _batch_sums(z, grad, feature_map, generator, config: ProbeConfig, totals, present, sum_update_sq=None):
    """The :class:`satcore.BatchMoments` of one batch of one candidate, its stream sums (and the block
    update's ``sum_update_sq``, as given) included, on its device, over the positions ``present``
    (``(B, T)`` bool, or ``None``: all) marks as data, as ``config`` says (its ``position_subsample``,
    ``variance``, ``batch_dtype``, ``curvature``); its Grams may go straight into ``totals``
    (``batch_moments(grams_into=...)``); with ``curvature`` also ``sum_qq = sum_i Q_i^T Q_i`` of the
    same positions."""
    keep, variance, dtype, curvature = config.position_subsample, config.variance, config.batch_dtype, config.curvature
    extra = {"sum_update_sq": sum_update_sq}  # what the probe adds to the sums' record, in one copy of it
    with torch.no_grad():
        zp = positions(z)
        T = zp.shape[1]
        index = position_index(T, keep, generator)
        if curvature:
            q_kept = subsample_positions(positions(grad), index)
            if present is not None:
                q_kept = drop_absent(q_kept, present if index is None else present[:, index.to(present.device)])
            q_flat = q_kept.reshape(-1, q_kept.shape[-1]).to(float64_device(z.device), torch.float64)
            extra["sum_qq"] = q_flat.T @ q_flat
        if isinstance(feature_map, ConvFeatures) and index is None:
            # the same sums from the hidden map, without the 9x larger patches
            moments = conv_batch_moments(grad, feature_map.hidden(z), variance=variance, dtype=dtype)
        else:
            q = subsample_positions(positions(grad), index)
            if feature_map.positionwise and index is not None:
                # features of the kept positions only, then the same sqrt(T/T') scale as q
                psi = feature_map(zp[:, index.to(z.device)]) * math.sqrt(T / index.numel())
            else:
                psi = subsample_positions(feature_map(z), index)
            if present is not None:
                kept = present if index is None else present[:, index.to(present.device)]
                q, psi = drop_absent(q, kept), drop_absent(psi, kept)
            moments = batch_moments(q, psi, variance=variance, dtype=dtype, grams_into=totals,
                                    cross_formed=False)
            if present is not None:
                extra["n_vectors"] = kept.sum()  # the zeroed rows are no position vectors
        if present is not None:
            extra.update(sum_z_sq=squared_norm(drop_absent(z, present)), n_stream_vectors=present.sum())
        else:
            # of z, not positions(z): that is a transposed view of a channels-first map, 10x slower to square
            extra.update(sum_z_sq=squared_norm(z), n_stream_vectors=z.shape[0] * T)
        return replace(moments, **extra)


def probe_in_groups(model: nn.Module, data, loss_fn=None, *, group_size: int, config: ProbeConfig | None = None,
                    **options) -> ProbeResult:
    """:func:`probe` of ``group_size`` candidates at a time, one pass over ``data`` (re-iterable) per group.

    The device then holds the running sums of one group only (:func:`plan`
    gives each candidate's bytes); each candidate's sums are those of a
    probe of all candidates at once, since a candidate's ``q_i`` and
    ``psi(z_i)`` do not depend on which other candidates are tapped.  The
    groups' statistics are joined (:meth:`satcore.DepthStatistics.join`) in
    the model's order.  A checkpoint per group is not supported.
    """
    config = resolve_options(ProbeConfig, config, **options)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if config.checkpoint is not None:
        raise ValueError("probe_in_groups does not checkpoint; probe each group with its own checkpoint instead")
    found = Probe(model, loss_fn, config).found
    blocks = [c.module for c in found if c.position == "input"]
    groups = [blocks[i : i + group_size] for i in range(0, len(blocks), group_size)]
    parts = [probe(model, data, loss_fn, config=replace(config, candidates=group,
                                                         head=config.head and i == len(groups) - 1))
             for i, group in enumerate(groups)]
    statistics = parts[0].statistics
    for part in parts[1:]:
        statistics = statistics.join(part.statistics)
    return ProbeResult(
        statistics=statistics,
        families={k: v for part in parts for k, v in part.families.items()},
        candidates=tuple(c for part in parts for c in part.candidates),
        meta=parts[0].meta,
    )
