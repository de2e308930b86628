"""Training recipes and loss evaluation (CPU-sized versions of the paper's App. B recipes).

Images: SGD with momentum 0.9, weight decay 5e-4, batch 128, initial
learning rate 0.1 (App. B.2 Table 5) but a cosine schedule over a few epochs
instead of 300 epochs with steps at 100/150 (CPU budget).  Text: AdamW with
a cosine schedule on random windows of the byte stream.  Losses for the
tables are evaluated in ``eval()`` mode (BatchNorm running statistics), the
function the probe differentiates, accumulated in float64.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn

from satcore.adapters.torch import sequence_loss


def batches(x, y, batch_size: int):
    """Fixed, ordered ``(inputs, targets)`` tensor batches (probe data)."""
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(y), batch_size)]


def per_sample_ce(outputs, targets):
    """Per-sample cross-entropy ``(B,)`` (the ``loss_i`` of docs/core.md, Conventions)."""
    return nn.functional.cross_entropy(outputs, targets, reduction="none")


def train_classifier(model, x, y, *, epochs: int, seed: int, batch_size: int = 128, lr: float = 0.1,
                     weight_decay: float = 5e-4) -> float:
    """SGD + momentum, cosine schedule; returns the wall time in seconds."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(y) / batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * steps_per_epoch)
    start = time.time()
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), batch_size):
            idx = order[i : i + batch_size]
            if len(idx) < 2:
                continue  # BatchNorm needs two samples
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    return time.time() - start


@torch.no_grad()
def classifier_loss(model, x, y, batch_size: int = 500) -> tuple[float, float]:
    """Mean per-sample cross-entropy (float64 sum) and accuracy, in eval mode."""
    model.eval()
    total, correct = 0.0, 0
    for xb, yb in batches(x, y, batch_size):
        out = model(xb)
        total += float(per_sample_ce(out.to(torch.float64), yb).sum())
        correct += int((out.argmax(1) == yb).sum())
    return total / len(y), correct / len(y)


def lm_windows(tokens: np.ndarray, seq_len: int, count: int, seed: int) -> torch.Tensor:
    """``count`` windows of ``seq_len`` bytes at seeded random offsets, ``(count, seq_len)`` int64."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(tokens) - seq_len, size=count)
    return torch.as_tensor(np.stack([tokens[s : s + seq_len] for s in starts]).astype(np.int64))


def lm_batches(windows: torch.Tensor, batch_size: int):
    """Probe data for a causal LM: ``({"input_ids": w}, w)`` batches."""
    return [({"input_ids": w}, w) for w in windows.split(batch_size)]


def train_lm(model, tokens: np.ndarray, *, steps: int, seq_len: int, batch_size: int, seed: int,
             lr: float = 3e-3, weight_decay: float = 0.01) -> float:
    """AdamW with 5% warm-up then cosine decay on fresh random windows; returns wall seconds."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))
    )
    start = time.time()
    model.train()
    for _ in range(steps):
        starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)
        ids = torch.as_tensor(np.stack([tokens[s : s + seq_len] for s in starts]).astype(np.int64))
        loss = sequence_loss(model(input_ids=ids), ids).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    return time.time() - start


@torch.no_grad()
def lm_loss(model, windows: torch.Tensor, batch_size: int = 64) -> float:
    """Mean per-sequence next-byte cross-entropy (nats), eval mode."""
    model.eval()
    total = 0.0
    for w in windows.split(batch_size):
        total += float(sequence_loss(model(input_ids=w), w).to(torch.float64).sum())
    return total / len(windows)
