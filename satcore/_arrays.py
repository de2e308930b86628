"""Shape handling shared by every array-level function.

The paper writes one column per sample; satcore is sample-first.  A candidate
with positions (tokens, pixels) has per-sample matrices ``Q_i`` of shape
``(T, N)`` and ``Psi_i`` of shape ``(T, r)``.  Plain ``(M, N)`` input is the
``T = 1`` case, so every function works on the 3-d form internally.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError


def as_samples(array, name: str, check_finite: bool = True) -> np.ndarray:
    """Return ``array`` as float64 of shape ``(M, T, width)``.

    Accepts ``(M, width)`` (one position per sample) or ``(M, T, width)``.
    Integer and boolean input is refused: gradients and features are real
    numbers, and silently casting labels would hide a mistake.  So are NaN and
    infinite entries (e.g. a float16 overflow upstream): every sum would
    carry them into the scores.  ``check_finite=False`` leaves that check to
    a caller that sees it in its sums for free (:func:`refuse_non_finite`).
    """
    arr = np.asarray(array)
    if arr.dtype.kind not in "fc" or arr.dtype.kind == "c":
        raise TypeError(f"{name}: expected a real floating-point array, got dtype {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[:, None, :]
    elif arr.ndim != 3:
        raise InputError(f"{name}: expected shape (M, N) or (M, T, N), got {arr.shape}")
    arr = np.asarray(arr, dtype=np.float64)
    if check_finite:
        refuse_non_finite(arr, name)
    return arr


def refuse_non_finite(arr: np.ndarray, name: str) -> None:
    if not np.isfinite(arr).all():
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        raise InputError(f"{name}: {bad} of {arr.size} entries are NaN or infinite")


def as_pair(Q, Psi, check_finite: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays as ``(M, T, width)`` float64 with matching ``M`` and ``T``."""
    q = as_samples(Q, "Q", check_finite)
    psi = as_samples(Psi, "Psi", check_finite)
    if q.shape[:2] != psi.shape[:2]:
        raise InputError(
            f"Q has (samples, positions) = {q.shape[:2]} but Psi has {psi.shape[:2]}; they must match"
        )
    return q, psi
