"""A per-candidate test of ``H0: g = 0`` from fold sums: sign flips, an unbiased ``V^2``, a jackknife.

Why.  Proposition 1 bounds ``P(|Gamma_hat - Gamma| >= t)`` by Chebyshev and a
union bound.  It holds for any distribution, but at the probe sizes people
use its ``t`` is several times the estimate itself, so "saturated" read off it
says only that the test had no power.  This module tests each candidate with
a test whose size is exact under a symmetry assumption that needs neither a
dimension nor Gaussian vectors.

Folds.  The probe's batches are dealt round-robin into ``m`` folds (default
16; a merge of shards and the ranks of a distributed probe map onto the same
folds).  Each fold ``a`` keeps the sum of its per-sample parameter gradients
``F_a = sum_{i in a} X_i`` (``N x r``, ``X_i = Q_i^T Psi_i``) and its count
``n_a``.  With fold means ``g_a = F_a / n_a`` and weights ``w_a = n_a / n``,
the fold Gram in a metric ``A`` is ``G_ab = <g_a, g_b>_A``:

* the growth value's metric, ``<g_a, g_b> = tr(g_a K^- g_b^T)`` with ``K``
  the feature Gram of all the data (so ``sum_ab w_a w_b G_ab = V_hat^2``,
  the squared growth value), and
* the Euclidean one, ``<g_a, g_b> = <g_a, g_b>_F`` (``||C||_F``'s metric, the
  quantity of Proposition 1).

Unbiased estimate.  Samples in different folds are independent, so
``E G_ab = ||mu||_A^2`` for ``a != b`` (``mu`` the population gradient), and

    U = sum_{a != b} w_a w_b G_ab / (1 - sum_a w_a^2)

is unbiased for ``||mu||_A^2`` (``V_pop^2`` in the growth value's metric).  The
diagonal terms, which carry the noise floor ``E ||g_a||^2 = ||mu||^2 +
sigma^2 / n_a``, are left out; ``U`` may be negative.

Sign-flip p-value.  Under ``H0: mu = 0`` with fold means distributed
symmetrically about 0 (exact when each sample's gradient is; close to it for
any distribution once a fold averages many samples), flipping the sign of any
set of folds leaves the joint distribution unchanged.  The statistic
``T(eps) = sum_{a != b} eps_a eps_b w_a w_b G_ab`` is computed for every
``eps`` in ``{+-1}^m`` with ``eps_1 = +1`` (``eps`` and ``-eps`` give the same
value): ``2^(m-1)`` patterns, 32768 for 16 folds.  The p-value is the share of
patterns with ``T(eps) >= T(1)``; it is never below ``2^-(m-1)``.  Above
``EXACT_FOLDS`` folds a seeded sample of patterns is drawn instead, with
``p = (1 + #{T(eps) >= T(1)}) / (1 + B)``.

Jackknife.  Leaving fold ``a`` out gives ``U_(a)`` (weights renormalised over
the other folds); ``se^2 = (m - 1) / m sum_a (U_(a) - mean U_(.))^2`` is the
delete-one jackknife variance of ``U``, and ``U +- t_{m-1, 1 - alpha/2} se``
the interval for ``||mu||_A^2`` used for the "saturated" reading.

Across candidates, Holm's step-down method turns the p-values into adjusted
ones that control the family-wise error rate.  Every function here takes and
returns arrays; the statistics objects and reports call them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
# scipy.special, not scipy.stats (whose ppf/cdf call these): a third of the import time, paid by every CLI run
from scipy.special import stdtrit

from .._shared.errors import InputError

DEFAULT_FOLDS = 16
EXACT_FOLDS = 20  # 2^19 patterns x 20^2: enumerated in well under a second
RANDOM_PATTERNS = 2**15
MIN_FOLDS = 2


@dataclass(frozen=True)
class FoldTest:
    """Fold-based test of ``H0: mu = 0`` in one metric (module docstring).

    ``statistic`` is ``T(1) = sum_{a != b} w_a w_b G_ab``, ``unbiased`` its
    normalisation ``U`` (unbiased for ``||mu||^2``), ``se`` the jackknife
    standard error of ``U``, ``p_value`` the sign-flip p-value, ``n_folds``
    the folds that held samples and ``exact`` whether every sign pattern was
    enumerated.  With fewer than 2 non-empty folds nothing can be tested:
    ``p_value`` is 1 and ``se`` is ``inf``.
    """

    statistic: float
    unbiased: float
    se: float
    p_value: float
    n_folds: int
    exact: bool

    def interval(self, alpha: float) -> tuple[float, float]:
        """``U -+ t_{m-1, 1-alpha/2} se``: a two-sided ``1 - alpha`` interval for ``||mu||^2``."""
        if self.n_folds < MIN_FOLDS or not math.isfinite(self.se):
            return (-math.inf, math.inf)
        half = float(stdtrit(self.n_folds - 1, 1 - alpha / 2)) * self.se
        return (self.unbiased - half, self.unbiased + half)

    def to_dict(self) -> dict:
        return {
            "statistic": self.statistic,
            "unbiased": self.unbiased,
            "se": self.se,
            "p_value": self.p_value,
            "n_folds": self.n_folds,
            "exact": self.exact,
        }


def fold_gram(fold_sums, fold_counts, whiten=None) -> tuple[np.ndarray, np.ndarray]:
    """Fold Gram ``G_ab = <g_a, g_b>`` of the fold means, and the fold weights ``w_a = n_a / n``.

    Parameters
    ----------
    fold_sums : array_like, shape (m, N, r)
        ``F_a = sum_{i in a} X_i`` per fold.
    fold_counts : array_like, shape (m,)
        Samples per fold.  Empty folds are dropped.
    whiten : callable, optional
        Maps an ``(..., N, r)`` array ``A`` to ``W`` with ``<W_a, W_b>_F =
        tr(A_a K^- A_b^T)`` (:meth:`satcore._formulas.psd.PsdSpectrum.whiten`); the
        Euclidean metric when omitted.

    Returns
    -------
    G : ndarray, shape (k, k)
        Over the ``k`` non-empty folds.
    w : ndarray, shape (k,)
    """
    means, w = _fold_means(fold_sums, fold_counts)
    return _gram(means if whiten is None else whiten(means)), w


def _fold_means(fold_sums, fold_counts) -> tuple[np.ndarray, np.ndarray]:
    """The non-empty folds' means ``(k, N, r)`` and weights ``w_a = n_a / n`` (:func:`fold_gram`)."""
    sums = np.asarray(fold_sums, dtype=np.float64)
    counts = np.asarray(fold_counts, dtype=np.float64)
    keep = counts > 0
    counts = counts[keep]
    return sums[keep] / counts[:, None, None], counts / counts.sum()


def _gram(means: np.ndarray) -> np.ndarray:
    flat = means.reshape(means.shape[0], -1)
    return flat @ flat.T


def _sign_patterns(k: int) -> np.ndarray:
    """Every pattern of ``k`` signs, one per row (``2^k x k``; one empty row for ``k = 0``)."""
    bits = (np.arange(2**k, dtype=np.int64)[:, None] >> np.arange(k)) & 1
    return 1.0 - 2.0 * bits


def sign_flip_p_value(G, w, *, seed: int = 0) -> tuple[float, bool]:
    """Sign-flip p-value of ``T(1) = sum_{a != b} w_a w_b G_ab`` (module docstring); ``(p, exact)``.

    Up to ``EXACT_FOLDS`` folds every pattern is evaluated, split in two halves
    ``eps = (eps_L, eps_R)`` (``eps_1 = +1`` in ``L``):
    ``T(eps) = eps_L^T A_LL eps_L + eps_R^T A_RR eps_R + eps_L^T (A_LR + A_RL^T) eps_R``,
    so the ``2^(m-1)`` values cost one ``2^(h-1) x 2^(m-h)`` outer sum instead
    of a quadratic form each (``h = ceil(m / 2)``).
    """
    A = np.asarray(G, dtype=np.float64) * np.outer(w, w)
    np.fill_diagonal(A, 0.0)
    m = A.shape[0]
    observed = float(A.sum())
    # ties within round-off count as at least as extreme (the identity pattern always does)
    slack = 1e-12 * float(np.abs(A).sum())
    if m <= EXACT_FOLDS:
        h = (m + 1) // 2
        left = np.concatenate([np.ones((2 ** (h - 1), 1)), _sign_patterns(h - 1)], axis=1)
        right = _sign_patterns(m - h)
        L, R = slice(0, h), slice(h, m)
        q_left = np.einsum("pa,ab,pb->p", left, A[L, L], left)
        q_right = np.einsum("pa,ab,pb->p", right, A[R, R], right)
        cross = (left @ (A[L, R] + A[R, L].T)) @ right.T
        values = q_left[:, None] + q_right[None, :] + cross
        return float(np.count_nonzero(values >= observed - slack)) / values.size, True
    rng = np.random.default_rng(seed)
    eps = rng.choice((-1.0, 1.0), size=(RANDOM_PATTERNS, m))
    values = np.einsum("pa,ab,pb->p", eps, A, eps, optimize=True)
    return (1.0 + float(np.count_nonzero(values >= observed - slack))) / (1.0 + RANDOM_PATTERNS), False


def off_diagonal_sum(G, w) -> float:
    """``T(1) = sum_{a != b} w_a w_b G_ab``."""
    G = np.asarray(G, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    return float(w @ G @ w - np.sum(w * w * np.diagonal(G)))


def unbiased_square(G, w) -> float:
    """``U = sum_{a != b} w_a w_b G_ab / (1 - sum_a w_a^2)``: unbiased for ``||mu||^2``."""
    w = np.asarray(w, dtype=np.float64)
    return off_diagonal_sum(G, w) / (1.0 - float(np.sum(w * w)))


def jackknife_se(G, w) -> float:
    """Delete-one-fold jackknife standard error of :func:`unbiased_square`; ``inf`` below 3 folds."""
    m = len(w)
    if m < 3:
        return math.inf  # leaving one of two folds out leaves nothing to pair
    leave_out = np.empty(m)
    for a in range(m):
        rest = np.arange(m) != a
        wr = w[rest] / w[rest].sum()
        leave_out[a] = unbiased_square(G[np.ix_(rest, rest)], wr)
    return math.sqrt((m - 1) / m * float(np.sum((leave_out - leave_out.mean()) ** 2)))


def fold_test(fold_sums, fold_counts, whiten=None, *, seed: int = 0) -> FoldTest:
    """The fold test of ``H0: mu = 0`` in one metric (module docstring).

    Parameters
    ----------
    fold_sums, fold_counts, whiten
        As for :func:`fold_gram`.
    seed : int
        Seeds the sampled sign patterns above ``EXACT_FOLDS`` folds.

    Returns
    -------
    FoldTest

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(320, 3, 4)) + 0.5      # per-sample gradients, mean 0.5
    >>> sums = X.reshape(16, 20, 3, 4).sum(axis=1)   # 16 folds of 20 samples
    >>> t = fold_test(sums, np.full(16, 20))
    >>> t.p_value < 1e-3, round(t.unbiased, 1)       # ||mu||^2 = 12 * 0.25 = 3
    (True, 2.8)
    """
    return gram_fold_test(*fold_gram(fold_sums, fold_counts, whiten), seed=seed)


def gram_fold_test(G, w, *, seed: int = 0) -> FoldTest:
    """:func:`fold_test` from the fold Gram ``G`` and weights ``w`` of :func:`fold_gram`."""
    m = len(w)
    if m < MIN_FOLDS:
        return FoldTest(0.0, math.nan, math.inf, 1.0, m, True)
    p, exact = sign_flip_p_value(G, w, seed=seed)
    return FoldTest(off_diagonal_sum(G, w), unbiased_square(G, w), jackknife_se(G, w), p, m, exact)


@dataclass(frozen=True, eq=False)
class FoldSums:
    """What a candidate's score keeps of its fold sums so that the fold tests run only when asked for:
    the fold Grams of :func:`fold_gram` in both metrics (``k x k`` each) and the fold weights.

    The tests read nothing else, so the ``(m, N, r)`` sums are not kept: a probe of many wide
    candidates (``m N r`` doubles each, 0.5 GiB at ``N = r = 2048``) holds its scores in ``k^2``
    numbers each.  Formed when the score is: later batches added to the statistics change nothing.
    """

    gram: np.ndarray  # the growth value's metric (``K^-``, the whole probe's feature Gram)
    gram_euclidean: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(cls, sums, counts, whiten) -> "FoldSums":
        """From the fold sums ``(m, N, r)``, counts ``(m,)`` and the growth value's ``whiten``.

        Both Grams are bilinear, so they are those of the sums scaled by ``1 / (n_a n_b)``: each
        non-empty fold is read in place (no ``(k, N, r)`` copy of the means; whitened, it is
        ``N x rank``).
        """
        return cls.with_whitened_total(sums, counts, whiten)[0]

    @classmethod
    def with_whitened_total(cls, sums, counts, whiten) -> tuple["FoldSums", np.ndarray | None]:
        """:meth:`of`, and ``whiten`` of the folds' total ``sum_a sums[a]`` (``N x rank``; ``None``
        without a non-empty fold) as the sum of the whitened folds, which the fold Gram forms anyway:
        ``whiten`` is linear, so that is ``whiten(sum_cross)`` to round-off, without its
        ``N x r`` by ``r x rank`` product (a third of a score's work at ``N = r = 2048`` with two
        written folds).  The non-empty folds go through ``whiten`` as one product when they are
        consecutive (a probe of fewer batches than folds writes folds ``0 .. b - 1``).
        """
        sums = np.asarray(sums, dtype=np.float64)
        counts = np.asarray(counts, dtype=np.float64)
        kept = np.flatnonzero(counts > 0)
        flat = [sums[a].reshape(-1) for a in kept]
        euclidean = np.zeros((kept.size, kept.size))
        for a, b in zip(*np.triu_indices(kept.size)):  # each pair once: the Gram is symmetric
            euclidean[a, b] = euclidean[b, a] = np.dot(flat[a], flat[b])
        total = None
        if kept.size:
            consecutive = kept[-1] - kept[0] + 1 == kept.size
            whitened = whiten(sums[kept[0] : kept[-1] + 1]) if consecutive else np.stack([whiten(sums[a]) for a in kept])
            gram = _gram(whitened)
            total = whitened.sum(axis=0)
        else:
            gram = np.zeros((0, 0))
        inverse = 1.0 / counts[kept]
        scale = np.outer(inverse, inverse)
        return cls(gram * scale, euclidean * scale, counts[kept] / counts[kept].sum()), total

    def test(self, metric: str = "growth value") -> FoldTest:
        """:func:`fold_test` in the growth value's metric or, with ``metric="euclidean"``, ``||C||_F``'s."""
        if metric not in ("growth value", "euclidean"):
            raise InputError(f"metric must be 'growth value' or 'euclidean', got {metric!r}")
        return gram_fold_test(self.gram if metric == "growth value" else self.gram_euclidean, self.weights)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control over candidates).

    ``p_(j)`` sorted ascending becomes ``max_{i <= j} min(1, (k - i + 1) p_(i))``.

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03]).round(3).tolist()
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(p_values, dtype=np.float64)
    k = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (k - np.arange(k)) * p[order])
    adjusted = np.empty(k)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted
