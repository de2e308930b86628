"""Padding masks: which positions of a batch are data.

A padded batch (``tokenizer(..., padding=True)``) holds positions that are
no sample's data.  Counted, their features enter ``K`` and the stream
diagnostics, and the same sentences score differently depending on how they
were batched.  :func:`batch_mask` reads a batch's ``(B, T)`` mask,
:func:`applies` says which candidates it concerns (batch-first streams
``(B, T, d)`` of the same ``B`` and ``T``) and :func:`drop_absent` zeroes the
rows of absent positions, which leaves them out of every sum over positions.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def mask_label(mask) -> str | None:
    """What a checkpoint records of ``mask``: ``"auto"``, ``None`` or ``"callable"`` (code cannot be saved)."""
    if mask is None or (isinstance(mask, str) and mask == "auto"):
        return mask
    if callable(mask):
        return "callable"
    raise ValueError(f"mask must be 'auto', None or a callable mask(inputs) -> (B, T) tensor, got {mask!r}")


def batch_mask(mask, inputs, device) -> torch.Tensor | None:
    """``(B, T)`` bool on ``device``, True where a position is data; ``None`` when no mask is in play."""
    if mask is None:
        return None
    if isinstance(mask, str):  # "auto", checked by mask_label
        if not isinstance(inputs, Mapping) or "attention_mask" not in inputs:
            return None
        value, source = inputs["attention_mask"], "inputs['attention_mask']"
    else:
        value, source = mask(inputs), "mask(inputs)"
    if not torch.is_tensor(value) or value.dim() != 2:
        shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
        raise ValueError(
            f"{source} must be a (B, T) tensor to mask padded positions, got {shape}; "
            "pass mask=None to count every position, or a callable mask(inputs) -> (B, T)"
        )
    if value.is_floating_point():
        # an additive mask (0 for data, -inf for padding) would be read the wrong way round
        raise ValueError(
            f"{source} is a {value.dtype} tensor; give a bool or 0/1 integer mask, e.g. "
            "mask=lambda inputs: inputs['attention_mask'] > 0.5 for a 0/1 float mask"
        )
    return value.to(device) != 0


def check_samples(keep: torch.Tensor | None, samples: int) -> None:
    if keep is not None and keep.shape[0] != samples:
        raise ValueError(f"the mask has shape {tuple(keep.shape)} but the batch has {samples} samples")


def applies(keep: torch.Tensor | None, z: torch.Tensor) -> bool:
    """Whether ``keep`` masks the batch-first stream ``z``: a ``(B, T, d)`` stream with the mask's ``B, T``.

    Decided by shape alone: in an encoder-decoder whose decoder length equals
    the encoder's, the encoder's mask would reach the decoder's candidates too;
    pass a callable or name the candidates of one stack there.
    """
    return keep is not None and z.dim() == 3 and z.shape[:2] == keep.shape


def drop_absent(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``x`` ``(B, T, width)`` with zero rows where ``keep`` is False (also where ``x`` held NaN or inf)."""
    return x.masked_fill(~keep.to(x.device)[..., None], 0)
