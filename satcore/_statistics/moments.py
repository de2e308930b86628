"""One batch's sums for one candidate: the record every adapter hands to the statistics.

Per batch and candidate an adapter computes, on its own device and in its own array type, the
sums below over the batch's samples ``i`` (``Q_i``: the ``T x N`` output gradients
``q = d loss_i / d z`` at the candidate's positions; ``Psi_i``: the ``T x r`` candidate
features ``psi(z_i)``; ``X_i = Q_i^T Psi_i``, the per-sample gradient of the zero-output block's
terminal map), packs them into a frozen :class:`BatchMoments`, and
:meth:`satcore.CandidateStatistics.add_moments` adds them to the running sums.
:func:`batch_moments` is the NumPy definition; the torch and TensorFlow adapters have twins
that hold their own tensors (a torch probe adds its batches on the device and converts only
its totals).  The growth value of the paper ("Quantifying Depth Sufficiency in Residual Neural
Networks: A First-Order Criterion", Liu et al., Theorem 2 and Lemma 4) is
``sqrt(tr(C K^+ C^T))`` with ``C = sum_cross / n`` and ``K = sum_gram / n``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from .._shared.arrays import as_pair, refuse_non_finite
from .._shared.errors import InputError

COUNTS = ("n_samples", "n_vectors", "n_stream_vectors", "n_batches")


def complete_lower(matrix: np.ndarray) -> np.ndarray:
    """``matrix`` (square) made exactly symmetric from its upper triangle, in place, row by row (3x faster
    than forming the mirrored matrix); returns it."""
    for i in range(1, matrix.shape[0]):
        matrix[i, :i] = matrix[:i, i]
    return matrix


@dataclass(frozen=True, eq=False)
class PackedGram:
    """An exactly symmetric ``r x r`` float64 sum held by its upper triangle: ``r (r + 1) / 2`` entries in
    LAPACK's rectangular full packed form (``transr='N'``, the lower triangle of the column-major matrix,
    which is the row-major upper one), half the bytes of the matrix.

    A probe's Gram totals on one CPU thread are held this way (the torch adapter's running sums), and
    statistics that adopt one (:meth:`satcore.CandidateStatistics.add_moments`) keep it packed until
    ``sum_gram`` is first read (:meth:`whole`).
    """

    packed: np.ndarray
    order: int

    def whole(self) -> np.ndarray:
        """The C-ordered float64 ``r x r`` matrix, exactly symmetric (:meth:`upper`, its upper triangle mirrored):
        the same bits however often it is formed."""
        return complete_lower(self.upper())

    def upper(self) -> np.ndarray:
        """A new C-ordered float64 ``r x r`` array holding the matrix in its upper triangle (diagonal included) and
        zeros below: LAPACK ``dtfttr`` writes the triangle only, into the array SciPy's wrapper allocates
        zero-filled; the triangle a Cholesky factorisation reads, without :meth:`whole`'s mirroring."""
        from scipy.linalg.lapack import dtfttr

        column_major, _ = dtfttr(self.order, self.packed, transr="N", uplo="L")
        return column_major.T  # C-ordered, the triangle in its upper half


@dataclass(frozen=True, eq=False, kw_only=True)
class BatchMoments:
    """The sums of one batch of ``M`` samples for one candidate, in float64.

    Each field holds whatever its producer computed it as: a Python number, a NumPy array, a
    torch tensor on the model's device (0-d for the scalars) or a TensorFlow tensor;
    :meth:`to_numpy` converts.  Optional fields are ``None`` when not tracked.

    Attributes
    ----------
    n_samples : int
        ``M``, the samples in the sums.
    n_vectors : int or None
        Position vectors in the sums: ``sum_i T_i`` (``M T``, fewer when a padding mask left
        positions out); ``None`` when not known.
    sum_q_sq : float
        ``sum_i ||Q_i||_F^2`` (``ag^2 = sum_q_sq / n``, Theorem 1).
    sum_cross : array, shape (N, r)
        ``sum_i Q_i^T Psi_i = M C``, the cross-gradient sum.
    sum_gram : array, shape (r, r), :class:`PackedGram`, or None
        ``sum_i Psi_i^T Psi_i = M K``, the feature Gram sum (packed: an adapter's totals, for
        statistics to adopt); ``None`` only where the producer added it straight into running
        totals (the torch adapter's ``grams_into``).
    sum_xi_sq : float
        ``sum_i ||X_i||_F^2``, the second moment behind the noise floor and ``sigma^2``.
    sum_xtx : array, shape (r, r), or None
        ``sum_i X_i^T X_i`` (``variance``: the unbiased ``V^2``); ``None`` also where added
        into running totals, as ``sum_gram``.
    batch_grad_norm : float or None
        ``||Q_b||_F / |b| = sqrt(sum_q_sq) / M``, the batch's term of the batch-averaged
        gradient norm (paper, eq. (2)); ``None`` when the sums are not one training batch
        (a chunk of one, a TensorFlow replica's share, arrays scored without batches).  Sums
        of several training batches (another statistics' totals, an adapter's device totals)
        hold the sum of their terms here and their count in ``n_batches``.
    n_batches : int or None
        The training batches whose terms ``batch_grad_norm`` adds up; ``None``: one (the
        sums are one batch's).
    sum_qq : array, shape (N, N), or None
        ``sum_i Q_i^T Q_i`` (``curvature``: the activation-gradient second moment ``F``).
    sum_z_sq : float or None
        ``sum_i ||z_i||_F^2`` of the candidate's stream ``z`` (the block input): the empirical
        norm ``||z||_S = sqrt(sum_z_sq / n)`` that turns ``rho`` into ``alpha``.
    n_stream_vectors : int or None
        The stream's position vectors behind ``sum_z_sq``.
    sum_update_sq : float or None
        ``sum_i ||block(z_i) - z_i||_F^2``, the block's own update (where it keeps the shape).

    Two batches' moments add up (``a + b``) to those of the two batches as one: every sum
    exactly, ``batch_grad_norm`` recomputed from the summed ``sum_q_sq``; an optional field is
    kept when both sides hold it (as :meth:`satcore.CandidateStatistics.merge` keeps them).

    Examples
    --------
    >>> import numpy as np, satcore
    >>> rng = np.random.default_rng(0)
    >>> Q, Psi = rng.normal(size=(6, 2, 3)), rng.normal(size=(6, 2, 4))
    >>> both = satcore.batch_moments(Q[:4], Psi[:4]) + satcore.batch_moments(Q[4:], Psi[4:])
    >>> both.n_samples, bool(np.allclose(both.sum_cross, satcore.batch_moments(Q, Psi).sum_cross))
    (6, True)
    """

    n_samples: Any
    n_vectors: Any
    sum_q_sq: Any
    sum_cross: Any
    sum_gram: Any
    sum_xi_sq: Any
    sum_xtx: Any = None
    batch_grad_norm: Any = None
    sum_qq: Any = None
    sum_z_sq: Any = None
    n_stream_vectors: Any = None
    sum_update_sq: Any = None
    n_batches: Any = None

    def __add__(self, other: BatchMoments) -> BatchMoments:
        """The moments of both batches as one batch (see the class docstring)."""
        if not isinstance(other, BatchMoments):
            return NotImplemented
        summed = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name not in ("batch_grad_norm", "n_batches"):
                summed[f.name] = None if mine is None or theirs is None else mine + theirs
        both = BatchMoments(**summed)
        one_batch = self.batch_grad_norm is not None and other.batch_grad_norm is not None
        return both.as_one_batch() if one_batch else both

    def as_one_batch(self) -> BatchMoments:
        """These sums counted as one training batch: ``batch_grad_norm = sqrt(sum_q_sq) / n_samples``
        (eq. (2)), computed in the sums' own framework (a torch tensor stays on its device)."""
        root = self.sum_q_sq.sqrt() if hasattr(self.sum_q_sq, "sqrt") else float(np.sqrt(self.sum_q_sq))
        return replace(self, batch_grad_norm=root / self.n_samples, n_batches=None)

    def to_numpy(self, convert: Callable = np.asarray) -> BatchMoments:
        """The same moments in NumPy: arrays float64, scalar sums Python floats, counts Python ints.

        ``convert(value)`` gives each held value as something :func:`numpy.asarray` reads (the
        default reads NumPy, Python numbers, CPU torch tensors and eager TensorFlow tensors; a
        torch tensor on an accelerator needs ``lambda t: t.cpu()``).  Counts a framework summed
        as floats (a TensorFlow all-reduce) are rounded to whole numbers.
        """
        out = {}
        for f in fields(self):
            value = out[f.name] = getattr(self, f.name)
            if value is None:
                continue
            array = np.asarray(convert(value), dtype=np.float64)
            if f.name in COUNTS:
                out[f.name] = int(round(float(array)))
            else:
                out[f.name] = float(array) if array.ndim == 0 else array
        return BatchMoments(**out)

    def as_dict(self) -> dict[str, Any]:
        """``{field: value}`` of the fields held (not ``None``), e.g. to hand across a framework's
        all-reduce or to write out; ``BatchMoments(**d)`` is the inverse (when ``n_vectors`` and
        ``sum_gram``, which have no default, are held)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def forms_sample_gradients(T: int, N: int, r: int, *, variance: bool, factor: bool = True,
                           half_kernels: bool = False) -> bool:
    """Whether forming ``X_i = Q_i^T Psi_i`` costs fewer multiply-adds per sample than the ``T x T`` kernels.

    ``X_i``: ``T N r``, plus ``N r^2 / 2`` for ``sum X_i^T X_i`` (a symmetric
    product).  Kernels, for ``sum ||X_i||^2 = <Q_i Q_i^T, Psi_i Psi_i^T>``:
    ``T^2 (N + r)`` (``T^2 (N + r / 2)`` when ``half_kernels``: the
    ``Psi_i Psi_i^T`` as symmetric products); for ``variance`` through the QR
    factor ``R_i`` of ``Q_i^T`` (``factor``): ``N T k + k T r + k r^2 / 2``
    with ``k = min(N, T)``, else through ``K_i Psi_i``: ``T^2 (N + r) + T r^2``.
    The one rule behind this module's :func:`batch_moments` and the adapters'.
    """
    k = min(N, T)
    gradient = T * N * r + (N * r * r // 2 if variance else 0)
    if not variance:
        kernel = T * T * (N + (r // 2 if half_kernels else r))
    elif factor:
        kernel = N * T * k + k * T * r + k * r * r // 2
    else:
        kernel = T * T * (N + r) + T * r * r
    return kernel > gradient


def batch_moments(Q, Psi, *, variance: bool = False, curvature: bool = False, z=None) -> BatchMoments:
    """The :class:`BatchMoments` of one batch, in float64, from NumPy arrays.

    ``Q`` ``(M, T, N)`` and ``Psi`` ``(M, T, r)`` (or ``(M, N)``, ``(M, r)``).  Every sum
    is a BLAS matrix product.  The per-sample parameter gradient
    ``X_i = Q_i^T Psi_i`` (``N x r``) is formed only when that is cheaper than
    the ``T x T`` kernel ``K_i = Q_i Q_i^T``, using
    ``||X_i||_F^2 = <K_i, Psi_i Psi_i^T>_F`` and, for ``variance``, the factor
    ``R_i`` of ``K_i = R_i^T R_i`` (QR of ``Q_i^T``): ``Y_i = R_i Psi_i`` has
    ``min(N, T)`` rows and ``Y_i^T Y_i = X_i^T X_i``, so ``sum X_i^T X_i`` is
    one symmetric product (``syrk``, half the multiply-adds of
    ``Psi^T (K Psi)``).  ``curvature`` adds ``sum_qq = sum_i Q_i^T Q_i``;
    ``z``, the batch's stream as positions ``(M, T, N)``, adds its sums
    ``sum_z_sq`` and ``n_stream_vectors``.  The batch counts as one training
    batch (``batch_grad_norm``) when it holds samples.
    """
    # Values too large to square overflow to inf; CandidateStatistics.score refuses such sums with
    # a message, so NumPy's overflow warnings would only add noise to it.
    with np.errstate(over="ignore", invalid="ignore"):
        out = _batch_moments(Q, Psi, variance)
        if curvature:
            q = np.asarray(Q, dtype=np.float64)
            q2 = q.reshape(-1, q.shape[-1])
            out["sum_qq"] = q2.T @ q2
        if z is not None:
            out.update(_stream_sums(z))
        if out["n_samples"]:
            out["batch_grad_norm"] = float(np.sqrt(out["sum_q_sq"])) / out["n_samples"]
        return BatchMoments(**out)  # made once: a batch of a few samples costs little more than this


def _batch_moments(Q, Psi, variance: bool) -> dict:
    # A NaN or inf input shows in ||Q||^2 or in K's diagonal; only then are the inputs scanned
    # (a separate scan of every batch cost ~10% of `satcore score` on a raw dump).
    q, psi = as_pair(Q, Psi, check_finite=False, allow_empty=True)
    M, T, N = q.shape
    r = psi.shape[2]
    q2, p2 = q.reshape(M * T, N), psi.reshape(M * T, r)
    sum_q_sq = float(np.vdot(q2, q2))
    sum_gram = p2.T @ p2
    if not (np.isfinite(sum_q_sq) and np.isfinite(np.trace(sum_gram))):
        refuse_non_finite(q, "Q")
        refuse_non_finite(psi, "Psi")
    sum_xtx = None
    if forms_sample_gradients(T, N, r, variance=variance):
        X = (q.transpose(0, 2, 1) @ psi).reshape(M * N, r)
        sum_xi_sq = float(np.vdot(X, X))
        if variance:
            sum_xtx = X.T @ X
    elif variance:
        Y = (np.linalg.qr(q.transpose(0, 2, 1), mode="r") @ psi).reshape(M * min(N, T), r)
        sum_xi_sq = float(np.vdot(Y, Y))
        sum_xtx = Y.T @ Y
    else:
        sum_xi_sq = float(np.vdot(q @ q.transpose(0, 2, 1), psi @ psi.transpose(0, 2, 1)))
    return {"n_samples": M, "n_vectors": M * T, "sum_q_sq": sum_q_sq, "sum_cross": q2.T @ p2, "sum_gram": sum_gram,
            "sum_xi_sq": sum_xi_sq, "sum_xtx": sum_xtx}


def _stream_sums(z) -> dict:
    """``sum_z_sq = sum_i ||z_i||_F^2`` (float64) and ``n_stream_vectors = M T`` of a stream laid out as
    positions ``(M, T, N)``."""
    zp = np.asarray(z)
    if zp.ndim != 3:
        raise InputError(f"stream sums need the stream as positions (M, T, N), got shape {zp.shape}")
    flat = zp.reshape(-1).astype(np.float64, copy=False)
    return {"sum_z_sq": float(np.dot(flat, flat)), "n_stream_vectors": zp.shape[0] * zp.shape[1]}
