"""Shape handling shared by every array-level function.

The paper writes one column per sample; satcore is sample-first.  A candidate
with positions (tokens, pixels) has per-sample matrices ``Q_i`` of shape
``(T, N)`` and ``Psi_i`` of shape ``(T, r)``.  Plain ``(M, N)`` input is the
``T = 1`` case, so every function works on the 3-d form internally.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ArrayTypeError, InputError


def memory_budget() -> int:
    """Bytes one planned allocation may take: ``SATCORE_MEMORY_BUDGET`` (default 2 GiB).

    The one budget of satcore: the ``.npz`` reader's members and rows, a
    probe's running sums, an ONNX model's external data.
    """
    from .._io.zipnpy import Limits

    return Limits.from_env().memory_budget


def check_memory(n_bytes: int, what: str) -> None:
    """Refuse, before allocating, ``what`` needing more than :func:`memory_budget` bytes (one line)."""
    from .._io.zipnpy import ENV_MEMORY_BUDGET

    budget = memory_budget()
    if n_bytes > budget:
        raise InputError(f"{what} needs {n_bytes:,} bytes, over the memory budget of {budget:,} bytes "
                         f"(set {ENV_MEMORY_BUDGET} to raise it)")


LAZY_ZEROS_BYTES = 1 << 20  # arrays from this size on get their memory on first write (:func:`lazy_zeros`)


def lazy_zeros(shape) -> np.ndarray:
    """float64 zeros whose pages the operating system supplies on first write.

    An anonymous ``mmap``: pages nothing writes stay the shared zero page, so
    a candidate's ``m`` folds cost memory only for the folds its batches
    reach (4 of 16 after 4 batches), whatever state the allocator is in
    (``np.zeros`` is ``calloc``, which clears a reused heap block page by page
    and makes it resident).  Under :data:`LAZY_ZEROS_BYTES`, ``np.zeros``.
    """
    size = int(np.prod(shape, dtype=np.int64))
    if 8 * size < LAZY_ZEROS_BYTES:
        return np.zeros(shape)
    import mmap

    return np.frombuffer(mmap.mmap(-1, 8 * size), dtype=np.float64).reshape(shape)


def check_sizes(**sizes) -> None:
    """Refuse a size that is not a whole number >= 1 (an empty axis leaves nothing to estimate)."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InputError(f"{name} must be a whole number >= 1, got {value!r}")


def statistics_bytes(N: int, r: int, *, variance: bool = False, n_folds: int = 0, curvature: bool = False) -> int:
    """Bytes of one candidate's float64 running sums: ``N r`` (cross) and ``r^2`` (Gram), ``r^2`` more
    with ``variance``, ``m N r`` for ``m`` folds (and their ``m`` int64 counts) and ``N^2`` with ``curvature``."""
    return 8 * (N * r * (1 + n_folds) + n_folds + r * r * (1 + bool(variance)) + (N * N if curvature else 0))


def check_feature_count(r) -> None:
    """Refuse a feature count below 1, or whose ``r x r`` float64 Gram alone is over the memory budget."""
    check_sizes(n_features=r)
    check_memory(8 * int(r) ** 2, f"the Gram of r = {r} features")


def check_statistics_memory(N: int, r: int, **options) -> None:
    """:func:`check_sizes` of ``N`` and ``r``, then :func:`check_memory` of :func:`statistics_bytes`."""
    check_sizes(N=N, r=r)
    check_memory(statistics_bytes(int(N), int(r), **options),
                 f"the running sums of a candidate of width N = {N} with r = {r} features")


def as_samples(array, name: str, check_finite: bool = True, allow_empty: bool = False) -> np.ndarray:
    """Return ``array`` as float64 of shape ``(M, T, width)``.

    Accepts ``(M, width)`` (one position per sample) or ``(M, T, width)``.
    Integer, boolean and complex input is refused, as is what is no array (a
    str, a ragged list), with an :class:`~satcore._shared.errors.ArrayTypeError`
    (an ``InputError`` and a ``TypeError``) naming ``name``: gradients and
    features are real numbers, and silently casting labels would hide a
    mistake.  So are NaN and
    infinite entries (e.g. a float16 overflow upstream): every sum would
    carry them into the scores; and entries so large that the squared norm
    passes :data:`SQUARED_NORM_LIMIT` (:func:`squared_norm_in_range`), whose
    sums would overflow with a NumPy RuntimeWarning before any refusal.
    ``check_finite=False`` leaves those checks to a caller that sees them in
    its sums for free (:func:`refuse_non_finite`).
    An axis of extent 0 is refused (:class:`~satcore._shared.errors.InputError`):
    with no sample, position or coordinate there is nothing to estimate;
    ``allow_empty`` lets a streaming update add a batch of ``M = 0`` samples.
    """
    takes = f"{name}: takes a real floating-point array of shape (M, N) or (M, T, N), got"
    try:
        arr = np.asarray(array)
    except ValueError as exc:  # a ragged nested list
        raise ArrayTypeError(f"{takes} a {type(array).__name__} that is no array (NumPy: {exc})") from None
    if arr.dtype.kind != "f":
        kinds = {"i": "integers", "u": "integers", "b": "booleans", "c": "complex values"}
        if arr.dtype.kind in kinds:
            got = f"{kinds[arr.dtype.kind]} (dtype {arr.dtype})"
        elif isinstance(array, np.ndarray):
            got = f"dtype {arr.dtype}"
        else:  # a str, None, an object NumPy makes no numbers of
            got = "None" if array is None else f"a {type(array).__name__}"
        cast = "; cast it (.astype(float)) if these are the values meant" if arr.dtype.kind in "iub" else ""
        raise ArrayTypeError(f"{takes} {got}{cast}")
    if arr.ndim == 2:
        arr = arr[:, None, :]
    elif arr.ndim != 3:
        raise InputError(f"{name}: expected shape (M, N) or (M, T, N), got {arr.shape}")
    empty = [axis for axis, n in zip(("samples", "positions", "columns"), arr.shape)
             if n == 0 and not (axis == "samples" and allow_empty)]
    if empty:
        raise InputError(f"{name}: shape {np.asarray(array).shape} has no {' and no '.join(empty)} "
                         "(an axis of extent 0); nothing to estimate")
    arr = np.asarray(arr, dtype=np.float64)
    if check_finite:
        squared_norm_in_range(arr, name)
    return arr


def power_of_two_scale(x: np.ndarray) -> float:
    """The least power of two above ``max |x|``, at most ``2^1023`` (1 for an ``x`` of zeros or with a non-finite
    entry).

    Dividing by it is exact (barring subnormals), so sums of squares of ``x / scale`` times ``scale`` are those of
    ``x`` to the last bit where ``x``'s do not overflow, and finite where they would (a step ``V`` of lr 1e300,
    statistics summed to that size).

    Examples
    --------
    >>> power_of_two_scale(np.array([3.0, -5.0])), power_of_two_scale(np.zeros(2))
    (8.0, 1.0)
    >>> power_of_two_scale(np.array([1e308])) == 2.0**1023  # not 2^1024, which overflows
    True
    """
    largest = float(np.max(np.abs(x), initial=0.0))
    # at most 2^1023, the largest power of two float64 holds (max |x| over 2^1023 needs 2^1024, which overflows)
    return math.ldexp(1.0, min(math.frexp(largest)[1], 1023)) if 0 < largest < math.inf else 1.0


def frobenius_norm(x) -> float:
    """``||x||_F``, computed on ``x`` scaled by :func:`power_of_two_scale`: finite and warning-free up to float64's
    largest value (a huge lr's step, statistics summed to 1e300), where the plain sum of squares overflows.

    Examples
    --------
    >>> frobenius_norm(np.array([3e300, 4e300]))
    5e+300
    """
    x = np.asarray(x, dtype=np.float64)
    scale = power_of_two_scale(x)
    return scale * float(np.linalg.norm(x / scale))


def refuse_non_finite(arr: np.ndarray, name: str) -> None:
    if not np.isfinite(arr).all():
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        raise InputError(f"{name}: {bad} of {arr.size} entries are NaN or infinite")


# The largest ||Q||_F^2, ||Psi||_F^2 or product of the two that a pair may have (about 1.3e154): every running sum
# is bounded by one of them (sum_i ||Q_i^T Psi_i||_F^2 <= ||Q||_F^2 ||Psi||_F^2, Cauchy-Schwarz), and the fold test
# squares sums of that size (its jackknife), so under this root of float64's range nothing overflows.
SQUARED_NORM_LIMIT = float(np.sqrt(np.finfo(np.float64).max))


def squared_norm_in_range(arr: np.ndarray, name: str) -> float:
    """``||arr||_F^2``, refused (one line naming ``name``) where ``arr`` holds NaN or infinite entries or the
    value is over :data:`SQUARED_NORM_LIMIT`; one pass over the array, warning-free: an overflow mid-sum printed
    NumPy's RuntimeWarning before the refusal."""
    flat = arr.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):  # an inf or NaN here is the answer, refused below
        squared = float(np.dot(flat, flat))
    if not np.isfinite(squared):
        refuse_non_finite(arr, name)  # NaN or infinite entries, counted
    if not squared <= SQUARED_NORM_LIMIT:
        raise InputError(f"{name}: its squared norm ({squared:.3g}; largest entry {float(np.max(np.abs(arr))):.3g} in "
                         f"size) is over {SQUARED_NORM_LIMIT:.3g}, the square root of float64's range, under which no sum "
                         "satcore forms of it overflows, nor the fold test's squares of those sums; rescale it")
    return squared


def refuse_out_of_range(q: np.ndarray, psi: np.ndarray) -> None:
    """Refuse, before any sum is formed, a pair whose statistics or fold test would overflow float64 (over
    :data:`SQUARED_NORM_LIMIT`), or that holds NaN or infinite entries, in one pass over each array
    (:func:`squared_norm_in_range`)."""
    squares = {name: squared_norm_in_range(arr, name) for arr, name in ((q, "Q"), (psi, "Psi"))}
    if not squares["Q"] * squares["Psi"] <= SQUARED_NORM_LIMIT:
        raise InputError(f"Q and Psi: the product of their squared norms ({squares['Q']:.3g} x {squares['Psi']:.3g}) "
                         f"is over {SQUARED_NORM_LIMIT:.3g}, the square root of float64's range, which the fold test "
                         "needs (the product bounds the per-sample variance sums, and the test squares them); rescale "
                         "either")


def as_pair(Q, Psi, check_finite: bool = True, allow_empty: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays as ``(M, T, width)`` float64 with matching ``M`` and ``T``."""
    q = as_samples(Q, "Q", False, allow_empty)
    psi = as_samples(Psi, "Psi", False, allow_empty)
    if check_finite:
        refuse_out_of_range(q, psi)
    # every function of the pair forms C (N x r) and K (r x r), and K can dwarf the arrays themselves
    check_memory(statistics_bytes(q.shape[2], psi.shape[2]), f"the sums of N = {q.shape[2]} and r = {psi.shape[2]}")
    if q.shape[:2] != psi.shape[:2]:
        raise InputError(
            f"Q has (samples, positions) = {q.shape[:2]} but Psi has {psi.shape[:2]}; they must match"
        )
    return q, psi
