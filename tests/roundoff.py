"""Float tolerances derived from the dtype's epsilon and the computation's conditioning.

A float32 evaluation of a network's gradient is, op by op, the exact gradient of a problem whose
weights are perturbed: a sum of ``n`` products computed in float32, in any order, blocked or with
FMA, is the exact sum of products whose factors are perturbed by relative amounts of at most
``gamma_n = n eps32 / (1 - n eps32)`` (Higham, "Accuracy and Stability of Numerical Algorithms",
Section 3.1, eq. (3.4)); elementwise ops and the stored intermediates add ``eps32`` each.  So the
float32 error is bounded by how far perturbations of relative size ``n eps32`` move the gradient,
where ``n`` is the longest inner product of the computation (:func:`longest_inner_product`): that
is the computation's conditioning, measured here in float64 by :func:`float32_sensitivity`, which
multiplies every parameter and the input by ``1 + n eps32 u`` (``u`` uniform in ``[-1, 1]``) and
reports the largest relative change of each gradient over a few draws.  The forward pass is one
such perturbed evaluation and the backward pass's transposed products are another, hence
:data:`FLOAT32_MARGIN` = 2.  The bound depends on no host's kernels (the summation order, blocking,
FMA and vector width are all inside ``gamma_n``), and a radius of ``n eps32`` rather than
``eps32`` also covers ReLU kinks: a pre-activation within the forward error of zero may flip on
one host and not another, and perturbations of that size flip it in the measurement too.
Measured: torch's and ONNX Runtime's float32 gradients of the ResNet, the TransformerEncoder,
GPT-2 and BERT err by at most 0.17 times this sensitivity on the machine that wrote this (12 times
inside the margin; the realistic error grows like ``sqrt(n) eps32``, the bound like ``n eps32``).
The bound before, 20 times the sensitivity at radius ``eps32``, failed on another host: a ResNet
tap erred 57 times that sensitivity, whose three draws had missed the kinks the host's round-off
crossed.  A wrong gradient rule errs by O(1), over 1000 times the bound on these models.
"""

from __future__ import annotations

import copy
import math

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
# the float32 error allowed, in units of the measured sensitivity at radius n eps32: forward + backward pass
FLOAT32_MARGIN = 2.0


def longest_inner_product(model) -> int:
    """The longest sum of products a forward or backward pass through ``model``'s weights computes: a
    weight of shape ``(out, in, *kernel)`` sums ``in * kernel`` products forward and ``out * kernel``
    backward (an output layer's softmax and its gradient sum over its ``out`` classes too)."""
    longest = 1
    for p in model.parameters():
        if p.dim() >= 2:
            longest = max(longest, max(p.shape[0], p.shape[1]) * math.prod(p.shape[2:]))
    return longest


def relative_error(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def float32_sensitivity(exact, x, gradients, draws: int = 3, seed: int = 0) -> np.ndarray:
    """Largest relative change of each of ``gradients(model, x)`` (a list of arrays) when every
    parameter of the float64 model ``exact`` and the float input ``x`` are perturbed by a relative
    ``n eps32`` (``n``: :func:`longest_inner_product`, module docstring), over ``draws`` draws; one
    entry per gradient."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    radius = longest_inner_product(exact) * EPS32

    def jitter(t):
        return t * (1 + radius * (2 * torch.rand(t.shape, generator=generator, dtype=t.dtype) - 1))

    truth = gradients(exact, x)
    worst = np.zeros(len(truth))
    for _ in range(draws):
        model = copy.deepcopy(exact)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(jitter(p))
        moved = gradients(model, jitter(x) if x.is_floating_point() else x)
        worst = np.maximum(worst, [relative_error(m, t) for m, t in zip(moved, truth)])
    assert (worst > 0).all()  # a perturbation that moves nothing measures nothing
    return worst


def assert_nested_close(got, want, rel: float, abs: float = 0.0, path: str = "") -> None:
    """``got`` equals ``want`` key by key and item by item: strings, ints, bools and None exactly,
    floats to ``rel`` (relative) or ``abs``; for report dictionaries computed two ways."""
    where = path or "<root>"
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (where, sorted(got), sorted(want))
        for key in want:
            assert_nested_close(got[key], want[key], rel, abs, f"{path}.{key}" if path else str(key))
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_nested_close(g, w, rel, abs, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert isinstance(got, (int, float)), (where, got, want)
        if np.isnan(want) or np.isinf(want):
            assert got == want or (np.isnan(got) and np.isnan(want)), (where, got, want)
        else:
            assert np.abs(got - want) <= max(rel * np.abs(want), abs), (where, got, want)
    else:
        assert type(got) is type(want) and got == want, (where, got, want)
