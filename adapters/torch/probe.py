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
:class:`satcore.CandidateStatistics`.  Positions a padding mask marks as
absent are left out of every sum (:mod:`.masks`).
Gradients go to the taps only (``torch.autograd.grad``), never into the
parameters' ``.grad``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping

import torch
from torch import nn

from satcore.depth import DepthStatistics
from satcore.families import FAMILIES
from satcore.statistics import CandidateStatistics

from .capture import StreamTaps
from .checkpoint import load_checkpoint, save_checkpoint
from .diagnostics import StreamAccumulator
from .distributed import reduce_probe
from .families import ConvFeatures, build_feature_map, positions, rebuild_feature_map
from .locate import find_candidates, named_candidates
from .masks import applies, batch_mask, check_samples, drop_absent, mask_label
from .moments import (
    batch_moments,
    conv_batch_moments,
    float64_device,
    position_index,
    squared_norm,
    subsample_positions,
)
from .result import ProbeResult
from .running import RunningSums


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


def sequence_loss(outputs, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-sample causal-LM loss ``(B,)``: the mean over a sample's predicted tokens.

    ``outputs`` is a Hugging Face output (its ``.logits``) or logits
    ``(B, T, V)``; token ``t`` predicts ``labels[:, t + 1]``; labels equal to
    ``ignore_index`` are left out of the mean.
    """
    logits = getattr(outputs, "logits", outputs)
    pred, target = logits[:, :-1], labels[:, 1:]
    token = nn.functional.cross_entropy(
        pred.reshape(-1, pred.shape[-1]), target.reshape(-1), ignore_index=ignore_index, reduction="none"
    ).view(target.shape)
    mask = (target != ignore_index).to(token.dtype)
    return (token * mask).sum(1) / mask.sum(1).clamp_min(1)


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


def _family_for(family, name):
    return family.get(name, "auto") if isinstance(family, dict) else family


def _family_label(family):
    if isinstance(family, dict):
        return {name: _family_label(f) for name, f in family.items()}
    return family if isinstance(family, str) else type(family).__name__


def _batches(data, skip: int):
    for index, batch in enumerate(data):
        if index >= skip:
            yield index, batch


def probe(
    model: nn.Module,
    data,
    loss_fn,
    *,
    candidates=None,
    family="auto",
    seed: int = 0,
    init_std: float | None = None,
    variance: bool = False,
    position_subsample: int | None = None,
    mask="auto",
    batch_dtype: torch.dtype = torch.float64,
    head: bool = True,
    split: str | None = None,
    progress: bool = False,
    checkpoint=None,
    checkpoint_every: int = 1,
) -> ProbeResult:
    """Probe ``model`` on ``data`` at every candidate; see the module docstring.

    Parameters
    ----------
    data : iterable of ``(inputs, targets)``; ``inputs`` is passed as
        :func:`call_model` says and moved to the model's device.
    loss_fn : ``loss_fn(outputs, targets) -> (B,)`` per-sample losses (a 0-d
        batch mean is rescaled by ``B``); :func:`sequence_loss` for causal LMs.
    candidates : ``None`` (the blocks :func:`find_candidates` recognises) or a
        list of module names (the input of each).
    family : ``"auto"`` (``conv`` for ``(M, C, H, W)`` streams, else ``mlp``),
        ``"mlp"``/``"conv"``/``"linear"``/``"bias"``, ``"native"`` (the tangent
        space of the block ``insert_block(model, name, seed=seed)`` inserts:
        :mod:`.native`), an ``nn.Module`` feature map, or a dict candidate name ->
        one of those.  Built-in weights are
        ``satcore.make_family(kind, width, seed=seed, init_std=...)``.
    init_std : ``mlp`` weight scale; default the model's own
        (``config.initializer_range``) when it has one, else ``width**-0.5``.
    variance : also accumulate ``sum X_i^T X_i`` (debiased growth value).
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
        totals are computed on the CPU).
    head : add the ``"head"`` endpoint (output of the last block).
    split : name of the probe data, passed to the report.
    progress : a tqdm bar counting samples (samples/s).
    checkpoint, checkpoint_every : save the running sums to this ``.npz``
        every ``checkpoint_every`` batches; if the file exists the probe resumes
        from it, skipping the batches it already holds (``data`` must yield the
        same batches in the same order).  Under ``torch.distributed`` give each
        rank its own path.
    """
    found = find_candidates(model, head=head) if candidates is None else named_candidates(model, candidates, head=head)
    init_std = model_init_std(model) if init_std is None else init_std
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    config = {  # what a checkpoint must agree on to be resumed
        "candidates": [c.name for c in found],
        "family": _family_label(family),
        "seed": seed,
        "init_std": init_std,
        "position_subsample": position_subsample,
        "variance": variance,
        "mask": mask_label(mask),
    }
    if isinstance(family, dict) and set(family) - {c.name for c in found}:
        unknown = sorted(set(family) - {c.name for c in found})
        raise ValueError(f"family given for unknown candidate(s) {unknown}; candidates are {[c.name for c in found]}")
    statistics, streams, families, specs, skip = DepthStatistics(), {}, {}, {}, 0
    running: dict[str, RunningSums] = {}
    if checkpoint is not None and os.path.exists(checkpoint):
        statistics, streams, specs, skip = load_checkpoint(checkpoint, config)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(unit="sample", desc="probe")
    done = skip
    try:
        with eval_mode(model), StreamTaps(model, found) as taps:
            for index, (inputs, targets) in _batches(data, skip):
                inputs = to_device(inputs, device)
                keep = batch_mask(mask, inputs, device)
                taps.clear(keep)
                outputs = call_model(model, inputs)
                names = [c.name for c in found]
                missing = [n for n in names if n not in taps.taps]
                if missing:
                    raise ValueError(f"candidate(s) {missing} did not run in the forward pass")
                losses = loss_fn(outputs, to_device(targets, device))
                samples = _batch_size(losses, taps.streams, names)
                check_samples(keep, samples)
                grads = taps.gradients(per_sample_losses(losses, samples), names)
                generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
                for name, grad in zip(names, grads):
                    z = taps.streams[name]
                    if name not in families:
                        families[name] = build_feature_map(
                            _family_for(family, name), z, seed=seed, init_std=init_std, model=model,
                            candidate=taps.by_name[name],
                        ).eval()
                    if families[name].reads_context:
                        families[name].context = taps.calls[name]
                    if name not in running:
                        running[name] = _running_sums(name, z, families[name], statistics, streams, variance,
                                                      position_subsample)
                    present = keep if applies(keep, z) else None
                    moments, sum_z_sq, n_vectors = _batch_sums(z, grad, families[name], generator, position_subsample,
                                                               variance, batch_dtype, running[name].matrices, present)
                    running[name].add(moments, sum_z_sq, n_vectors, taps.updates.get(name))
                done = index + 1
                if bar is not None:
                    bar.update(samples)
                if checkpoint is not None and done % checkpoint_every == 0:
                    _sync(running)
                    save_checkpoint(checkpoint, statistics, streams, _specs(families), done, config)
    finally:
        if bar is not None:
            bar.close()
    _sync(running)
    ordered = DepthStatistics((c.name, statistics[c.name]) for c in found if c.name in statistics)
    if len(ordered) != len(found):
        raise ValueError("data yielded no batches: nothing was probed")
    for name, spec in specs.items():  # resumed from a checkpoint that already held every batch
        if name not in families and spec["kind"] in FAMILIES:
            families[name] = rebuild_feature_map(spec, parameter.dtype if parameter is not None else torch.float32, device)
    if checkpoint is not None:
        save_checkpoint(checkpoint, statistics, streams, _specs(families), done, config)
    reduce_probe(ordered, streams, device)
    return ProbeResult(
        statistics=ordered,
        families=families,
        streams={c.name: streams[c.name] for c in found},
        candidates=found,
        meta={"model": type(model).__name__, "loss": getattr(loss_fn, "__name__", type(loss_fn).__name__),
              "split": split},
    )


def _specs(families):
    return {name: fm.spec for name, fm in families.items()}


def _sync(running):
    for sums in running.values():
        sums.sync()


def _running_sums(name, z, feature_map, statistics, streams, variance, keep) -> RunningSums:
    """Device totals of candidate ``name``, seeded from its resumed statistics if any."""
    if name not in statistics:
        _, T, N = positions(z).shape
        kept = T if keep is None else min(keep, T)  # the statistics see the subsampled positions
        statistics[name] = CandidateStatistics(N, feature_map.n_features, kept, variance)
        streams[name] = StreamAccumulator(True)
    return RunningSums(statistics[name], streams[name], float64_device(z.device))


def _batch_sums(z, grad, feature_map, generator, keep, variance, dtype, totals, present):
    """``(moments, sum ||z_i||^2, stream vectors counted)`` of one batch of one candidate, on its
    device, over the positions ``present`` (``(B, T)`` bool, or ``None``: all) marks as data; its
    Grams may go straight into ``totals`` (``batch_moments(grams_into=...)``)."""
    with torch.no_grad():
        zp = positions(z)
        T = zp.shape[1]
        index = position_index(T, keep, generator)
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
            moments = batch_moments(q, psi, variance=variance, dtype=dtype, grams_into=totals)
            if present is not None:
                moments["n_vectors"] = kept.sum()  # the zeroed rows are no position vectors
        if present is not None:
            return moments, squared_norm(drop_absent(z, present)), present.sum()
        # of z, not positions(z): that is a transposed view of a channels-first map, 10x slower to square
        return moments, squared_norm(z), z.shape[0] * T
