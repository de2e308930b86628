"""Family features in NumPy from captured activations (no second framework).

Layouts follow :mod:`satcore._formulas.families`: a 4-d activation is channels-first
``(M, C, H, W)`` (ONNX, PyTorch) and :func:`satcore._formulas.families.positions` (the core's
one definition, used here as is: ONNX Runtime hands out NumPy arrays) makes its
gradient ``Q`` of shape ``(M, H*W, C)``; 2-d and 3-d activations are ``(M, N)`` /
``(M, T, N)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from satcore.adapters.options import builtin_kind, family_record
from satcore import Family, make_family
from satcore.adapter_api import family_spec

from .errors import OnnxProbeError


def width(z: np.ndarray) -> int:
    return z.shape[1] if z.ndim == 4 else z.shape[-1]


@dataclass(frozen=True)
class FeatureMap:
    """``psi`` for one candidate: a seeded :class:`Family` or a user callable ``z -> (M, [T,] r)``."""

    family: Family | None
    user: Callable | None = None

    def __call__(self, z: np.ndarray) -> np.ndarray:
        if self.user is not None:
            psi = np.asarray(self.user(z))
            return psi if psi.ndim == 3 else psi[:, None, :]
        return self.family.features(z)

    def describe(self) -> dict:
        if self.family is None:
            return {"kind": "user", "callable": getattr(self.user, "__name__", type(self.user).__name__)}
        return family_record(self.family)


def feature_map(spec, z: np.ndarray, *, seed: int = 0, init_std: float | None = None,
                n_features: int | None = None) -> FeatureMap:
    """Resolve ``spec`` (``"auto"``, a kind, a :class:`Family` or a callable) for activations like ``z``.

    ``auto`` is ``conv`` for 4-d activations and ``mlp`` otherwise; built-in
    kinds use ``make_family(kind, width, seed=seed)`` exactly as the other
    adapters do, so the same seed gives the same ``psi`` in every framework
    (``n_features``: a built-in kind's ``r``, as ``make_family`` takes it).
    """
    if isinstance(spec, Family):
        if spec.width != width(z):
            raise OnnxProbeError(f"family width {spec.width} does not match the activation's {width(z)}")
        return FeatureMap(spec)
    if callable(spec):
        return FeatureMap(None, spec)
    try:
        kind = builtin_kind(spec, z.shape, others="pass a callable")
        definition = family_spec(kind)
        if not definition.drawn or definition.features is None:
            raise ValueError(f"family {kind!r} has no NumPy feature map (it is built from a model by its framework)")
    except ValueError as exc:
        raise OnnxProbeError(str(exc)) from None
    return FeatureMap(make_family(kind, width(z), seed=seed, init_std=init_std if definition.takes_init_std else None,
                                  n_features=n_features))
