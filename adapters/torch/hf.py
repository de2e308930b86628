"""Hugging Face conventions: dict batches with ``labels`` and the model's own per-sample loss.

A ``DataCollator`` (or a tokenizer's ``BatchEncoding``) gives a mapping
``{"input_ids", "attention_mask", "labels", ...}``.  The probe passes the
whole mapping to the model and reads the targets from ``labels`` (the batch
convention of every adapter, :mod:`satcore.adapters.batches`).  Without a
``loss_fn`` it uses :func:`per_sample_loss` for the model's task, the
PER-SAMPLE form of the loss the model computes itself:

* causal LM (``...ForCausalLM``, ``GPT2LMHeadModel``: the classes transformers
  lists for causal language modelling): token ``t`` predicts
  ``labels[:, t + 1]`` (the model's own shift);
* token tasks (masked LM, token classification: ``(B, T, V)`` logits and
  ``(B, T)`` labels): token ``t`` predicts ``labels[:, t]``;
* sequence classification (``(B, C)`` logits): cross-entropy with ``(B,)``
  integer labels, squared error when ``config.num_labels == 1`` (regression),
  binary cross-entropy averaged over the labels for float ``(B, C)`` labels
  (multi-label), as ``config.problem_type`` decides in transformers.

A token loss ``loss_i`` is the MEAN over sample ``i``'s labels that are not
``ignore_index`` (-100: padding, prompt or unmasked tokens); a sample without
any such label has loss 0.  The model's own ``outputs.loss`` is one mean over
every label of the batch, which weights samples by their label counts: it is
``(1/B) sum_i loss_i`` only when every sample has the same count, which is why
the probe refuses a 0-d loss under padding (:func:`scalar_loss_problem`).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from satcore import ProbeError

IGNORE_INDEX = -100


def token_losses(logits: torch.Tensor, labels: torch.Tensor, *, shift: bool,
                 ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """``(B,)``: each sample's mean cross-entropy over its labels that are not ``ignore_index``.

    ``shift``: token ``t`` predicts ``labels[:, t + 1]`` (causal LM), else ``labels[:, t]``.
    Labels that are not ``(B, T)`` for logits ``(B, T, V)`` are refused with one line naming both shapes.
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ProbeError(f"token losses need labels (B, T) for logits (B, T, V); got labels {tuple(labels.shape)} "
                         f"for logits {tuple(logits.shape)}")
    pred, target = (logits[:, :-1], labels[:, 1:]) if shift else (logits, labels)
    token = nn.functional.cross_entropy(
        pred.reshape(-1, pred.shape[-1]), target.reshape(-1), ignore_index=ignore_index, reduction="none"
    ).view(target.shape)
    mask = (target != ignore_index).to(token.dtype)
    return (token * mask).sum(1) / mask.sum(1).clamp_min(1)


def sequence_loss(outputs, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Per-sample causal-LM loss ``(B,)``: the mean over a sample's predicted tokens.

    ``outputs`` is a Hugging Face output (its ``.logits``) or logits
    ``(B, T, V)``; token ``t`` predicts ``labels[:, t + 1]``; labels equal to
    ``ignore_index`` are left out of the mean.
    """
    return token_losses(getattr(outputs, "logits", outputs), labels, shift=True, ignore_index=ignore_index)


# where configs keep the number of positions the model was built (and trained) for, by family
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


def context_length(config) -> tuple[str, int] | None:
    """``(key, positions)``: the model's context as its ``config.json`` names it (GPT-2's
    ``n_positions``, Llama's ``max_position_embeddings``, ...), or ``None`` when the config has
    none of :data:`CONTEXT_KEYS`.  Longer windows index past GPT-2's position table, and feed
    rotary models positions they were never trained on.  ``config``: a transformers config, or the
    ``config.json`` object as read (a ``dict``, before the weights are)."""
    aliases = getattr(config, "attribute_map", {})
    for key in CONTEXT_KEYS:
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return aliases.get(key, key), value
    return None


@functools.lru_cache(maxsize=1)
def _causal_lm_classes() -> frozenset:
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # transformers absent: then no model is one of its classes
        return frozenset()
    names = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update(value if isinstance(value, (tuple, list)) else [value])
    return frozenset(names)


def task_of(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> str:
    """``"causal_lm"``, ``"token"`` or ``"sequence"`` (see the module docstring)."""
    if type(model).__name__ in _causal_lm_classes():
        return "causal_lm"
    if logits.dim() == 3 and labels.dim() == 2:
        return "token"
    if logits.dim() == 2:
        return "sequence"
    raise ValueError(
        f"cannot tell the task of {type(model).__name__} from logits {tuple(logits.shape)} and labels "
        f"{tuple(labels.shape)}; pass loss_fn(outputs, labels) -> (B,) per-sample losses"
    )


def per_sample_loss(model: nn.Module, outputs, labels: torch.Tensor) -> torch.Tensor:
    """The model's own loss per sample, ``(B,)`` (module docstring), -100 labels ignored."""
    logits = getattr(outputs, "logits", None)
    if logits is None:
        raise ValueError(f"{type(model).__name__}'s output has no .logits; pass loss_fn(outputs, labels) -> (B,)")
    task = task_of(model, logits, labels)
    if task != "sequence":
        return token_losses(logits, labels, shift=task == "causal_lm")
    config = getattr(model, "config", None)
    if getattr(config, "num_labels", None) == 1 or getattr(config, "problem_type", None) == "regression":
        return (logits.squeeze(-1) - labels.to(logits.dtype)).pow(2).reshape(len(labels), -1).mean(1)
    if labels.is_floating_point():  # multi-label
        losses = nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
        return losses.mean(1)
    return nn.functional.cross_entropy(logits, labels, reduction="none")


def model_loss(model: nn.Module):
    """``loss_fn(outputs, labels)`` = :func:`per_sample_loss` of ``model``, named ``"model_loss"``."""

    def loss_fn(outputs, labels):
        return per_sample_loss(model, outputs, labels)

    loss_fn.__name__ = "model_loss"
    return loss_fn


def scalar_loss_problem(keep: torch.Tensor | None, targets) -> str | None:
    """Why ``B`` times a 0-d batch-mean loss would not be ``sum_i loss_i`` here, or ``None``.

    A mean over tokens weights each sample by its number of counted tokens; ``B`` times it equals
    the sum of the samples' own means only when every sample counts as many: not under a padding
    mask that leaves positions out, nor with labels of which samples have different numbers
    that are not -100.
    """
    if keep is not None and not bool(keep.all()):
        return "the padding mask leaves positions out"
    if torch.is_tensor(targets) and targets.dim() >= 2 and not targets.is_floating_point():
        counts = (targets != IGNORE_INDEX).reshape(len(targets), -1).sum(1)
        if bool((counts != counts[0]).any()):
            return "the samples have different numbers of labels that are not -100"
    return None
