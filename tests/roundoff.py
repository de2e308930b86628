"""Float tolerances derived from the dtype's epsilon and the computation's conditioning.

A float32 evaluation of a network's gradient is (op by op, backward-stably) the exact gradient of
a problem whose weights, input and intermediates are perturbed by relative amounts of order
``eps32``.  How far such a perturbation moves the gradient is the computation's conditioning, and
it is measured here in float64: :func:`float32_sensitivity` multiplies every parameter and the
input by ``1 + eps32 * u`` (``u`` uniform in ``[-1, 1]``) and reports the largest relative change
of each gradient over a few draws.  A float32 implementation's error against the float64 truth is
then a small multiple of that sensitivity: the intermediates' round-off adds perturbations of the
same size at every op, amplified at most as much.  Measured: torch's and ONNX Runtime's float32
gradients of the ResNet, the TransformerEncoder, GPT-2 and BERT lie within 3.7x of it on the
machine that wrote this and within 8.5x on another of the same kind (other GEMM kernels), so
:data:`FLOAT32_MARGIN` is 20, still more than 1000x below the O(1) error of a wrong gradient rule.
"""

from __future__ import annotations

import copy

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
# the float32 error allowed, in units of the measured float64 sensitivity (see the module docstring)
FLOAT32_MARGIN = 20.0


def relative_error(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def float32_sensitivity(exact, x, gradients, draws: int = 3, seed: int = 0) -> np.ndarray:
    """Largest relative change of each of ``gradients(model, x)`` (a list of arrays) when every
    parameter of the float64 model ``exact`` and the float input ``x`` are perturbed by a relative
    ``eps32``, over ``draws`` draws; one entry per gradient."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def jitter(t):
        return t * (1 + EPS32 * (2 * torch.rand(t.shape, generator=generator, dtype=t.dtype) - 1))

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
