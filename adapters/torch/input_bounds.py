"""Bounds on what ``decide`` and ``expand`` are handed, checked before any work, and the random state they keep.

* data: a split is read into a list once by :func:`satcore.adapter_api.read_batches` (every adapter's): at most
  ``MAX_DATA_BATCHES`` batches are taken, so an endless iterator is refused instead of read until memory runs out;
* token ids: every id in ``0 .. vocab_size - 1`` (:func:`check_token_ids`), in Python as on the command line;
* new blocks: at most one per place of the model (``n_blocks + 1``), so ``at=`` with thousands of entries is
  refused instead of growing the model for minutes;
* the trials' steps: a recipe of more than :data:`MAX_TRIAL_STEPS` steps (the trials train up to that many in
  all) is refused with its estimate unless ``SATCORE_MAX_TRIAL_STEPS`` raises the bound: the user confirms the
  work by raising it;
* random state: :func:`forked_rng` runs the decision under a fork of torch's generators (the CPU's and every
  initialised CUDA device's), so the caller's next draws are those it would have made without it.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from satcore import InputError
from satcore.adapter_api import parse_whole_number

IGNORED_LABEL = -100  # the label cross-entropy skips (PyTorch's and transformers' ignore_index)
MAX_TRIAL_STEPS = 100_000
ENV_MAX_TRIAL_STEPS = "SATCORE_MAX_TRIAL_STEPS"


def check_token_ids(ids, vocab_size: int, what: str) -> None:
    """Refuse token ids outside ``0 .. vocab_size - 1`` (an embedding lookup past the table fails deep in the
    model), naming the first one."""
    if isinstance(ids, np.ndarray):
        # read where it lies: torch warns on sharing a read-only array (the .npz reader's), and a copy doubles it
        if not (np.issubdtype(ids.dtype, np.integer) or np.issubdtype(ids.dtype, np.unsignedinteger)):
            raise InputError(f"{what}: token ids must be integers, got {ids.dtype}")
        outside = (ids < 0) | (ids >= vocab_size)
        if ids.size and bool(outside.any()):
            raise InputError(f"{what}: token id {int(ids[outside].reshape(-1)[0])} is outside the model's "
                             f"vocabulary 0..{vocab_size - 1}")
        return
    ids = torch.as_tensor(ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise InputError(f"{what}: token ids must be integers, got {ids.dtype}")
    outside = (ids < 0) | (ids >= vocab_size)
    if ids.numel() and bool(outside.any()):
        raise InputError(f"{what}: token id {int(ids[outside].reshape(-1)[0])} is outside the model's vocabulary "
                         f"0..{vocab_size - 1}")


def check_labels(model, labels, what: str) -> None:
    """Refuse labels the model's own loss cannot take: outside its vocabulary ``0 .. vocab_size - 1`` and not
    the ignored ``-100`` (cross-entropy would fail inside the loss), naming the first one.  Checked where the
    loss is the model's own (``loss_fn=None``) and the model says its vocabulary (``config.vocab_size``)."""
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(vocab_size, int) or not torch.is_tensor(labels) or labels.is_floating_point():
        return
    outside = (labels != IGNORED_LABEL) & ((labels < 0) | (labels >= vocab_size))
    if bool(outside.any()):
        raise InputError(f"{what}: label {int(labels[outside].reshape(-1)[0])} is outside the model's vocabulary "
                         f"0..{vocab_size - 1} (and not {IGNORED_LABEL}, which is ignored)")


def check_new_block_count(count: int, n_blocks: int, what: str) -> None:
    """Refuse more new blocks than the model has places for (``n_blocks`` blocks and the head)."""
    if count > n_blocks + 1:
        raise InputError(f"{what}: {count:,} new blocks; at most {n_blocks + 1}, one per place of the model "
                         f"({n_blocks} blocks and the head)")


def max_trial_steps() -> int:
    """:data:`MAX_TRIAL_STEPS`, or ``SATCORE_MAX_TRIAL_STEPS`` where set."""
    text = os.environ.get(ENV_MAX_TRIAL_STEPS)
    return MAX_TRIAL_STEPS if text is None else parse_whole_number(text, ENV_MAX_TRIAL_STEPS)


def check_trial_steps(recipe) -> None:
    """Refuse, before any probe, a recipe whose trials would train more than :func:`max_trial_steps` steps in all
    (the trials share ``recipe.steps`` steps of ``recipe.batch_size`` samples)."""
    check_trial_work(recipe.steps, recipe.batch_size, f"recipe: steps {recipe.steps:,}", "price a shorter recipe")


def check_trial_work(steps: int, batch_size: int, what: str, instead: str) -> None:
    """Refuse, before the trials start, ``steps`` optimizer steps in all above :func:`max_trial_steps` (the
    message names ``what`` asked for them and what to do ``instead``, besides raising the bound)."""
    bound = max_trial_steps()
    if steps > bound:
        raise InputError(f"{what}: the trials would train up to {steps:,} optimizer steps of {batch_size} samples, above "
                         f"the bound of {bound:,}; set {ENV_MAX_TRIAL_STEPS} to confirm that work, or {instead}")


@contextlib.contextmanager
def forked_rng():
    """torch's random state (the CPU's and every initialised CUDA device's) restored on exit."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        yield
