"""Streaming sufficient statistics per candidate (docs/core.md, Streaming statistics).

A probe never holds ``Q`` or ``Psi`` for all samples.  Per candidate it adds up,
in float64:

=====================  ============================================  ==========
field                  meaning                                       shape
=====================  ============================================  ==========
``n_samples``          samples seen                                  scalar
``sum_q_sq``           ``sum_i ||Q_i||_F^2``                         scalar
``sum_cross``          ``sum_i Q_i^T Psi_i``  (``= n C``)            ``(N, r)``
``sum_gram``           ``sum_i Psi_i^T Psi_i`` (``= n K``)           ``(r, r)``
``sum_xi_sq``          ``sum_i ||X_i||_F^2``, ``X_i = Q_i^T Psi_i``  scalar
``sum_xtx``            ``sum_i X_i^T X_i`` (optional, ``variance``)  ``(r, r)``
``sum_batch_grad_norm`` ``sum_b ||Q_b||_F / |b|`` (paper eq. 2)      scalar
``n_batches``          batches behind ``sum_batch_grad_norm``        scalar
``n_positions``        ``T`` of the first batch (1: unpositioned)      scalar
``n_vectors``          position vectors summed (``sum_b M_b T_b``)   scalar
``n_folds``            folds ``m`` (0: none kept)                    scalar
``fold_cross``         ``sum_{i in a} X_i`` per fold ``a``           ``(m, N, r)``
``fold_samples``       samples per fold                              ``(m,)``
``sum_qq``             ``sum_i Q_i^T Q_i`` (optional, ``curvature``)   ``(N, N)``
``sum_z_sq``           ``sum_i ||z_i||_F^2`` of the stream (optional,  scalar
                       ``stream``)
``n_stream_vectors``   stream position vectors behind ``sum_z_sq``    scalar
``sum_update_sq``      ``sum_i ||block(z_i) - z_i||_F^2`` (optional,   scalar
                       ``block_update``)
=====================  ============================================  ==========

``sum_qq`` is the activation-gradient second moment ``F = sum_qq / n`` of the
Kronecker-factored curvature in :mod:`satcore._decisions.predictors` (``N^2`` per
position vector; kept only when asked for, and only by :meth:`update` and
:meth:`add_moments` callers that supply it).

Stream sums.  ``sum_z_sq`` over the candidate's stream ``z`` (the block
input) gives the empirical norm ``||z||_S = sqrt(sum_z_sq / n_samples)``
(:meth:`CandidateStatistics.stream_rms`) that turns a relative insertion size
``rho`` into ``alpha`` and a ``tolerance`` in loss units into growth-value
units; ``n_stream_vectors`` counts the stream's position vectors (every
position the stream has, which ``position_subsample`` does not thin; a padding
mask leaves its absent ones out), ``sum_update_sq`` the block's own update
where it keeps the shape.  Adapters add them (``stream=True``,
``block_update=True``); they merge like every other sum, so a merge of
shards keeps ``||z||_S``.  Statistics made from ``Q`` and ``Psi`` alone
(:meth:`~CandidateStatistics.update`) and dumps written before the fields
existed have none (readers then fall back on ``meta.diagnostics``).

Folds.  Batch ``b`` (counted from 0 over the whole probe) goes to fold
``b mod m``; the fold sums are what the per-candidate test of
:mod:`satcore._formulas.folds` needs (an unbiased ``V^2``, a sign-flip p-value, a
jackknife interval) and add ``m N r`` numbers to the memory.  Merging
``A + B`` rotates ``B``'s folds by ``A``'s batch count, so a merge of shards
holds exactly the folds of one pass over ``A``'s batches then ``B``'s.  Arrays
scored in memory without a batch size (:meth:`CandidateStatistics.from_samples`)
are cut into ``m`` consecutive blocks of samples.  Statistics from dumps
written before folds existed have ``n_folds = 0``.

``n_vectors`` is what ``tangent_complete`` compares the rank with: it differs
from ``n_samples * n_positions`` when ``T`` changes from batch to batch or a
padding mask leaves positions out.  Dumps written before it existed lack it;
such statistics (and any merge or continuation of them) hold ``None`` and fall
back on ``n_samples * n_positions``.

Memory is ``O(N r + r^2)`` whatever the number of samples.  Two statistics
merge by adding fields, which equals one pass over the union.  ``to_arrays``
and ``from_arrays`` give the ``stats/<name>/<field>`` members of a dump.
Sums reach the statistics one way: :meth:`~CandidateStatistics.add_moments`
of a :class:`~satcore._statistics.moments.BatchMoments` (one batch's sums, or
the totals of ``n_batches`` batches an adapter added up on its device).
:meth:`CandidateStatistics.update` (arrays), :meth:`~CandidateStatistics.from_samples`
and :meth:`~CandidateStatistics.accumulate` (another statistics, in place) go
through it.  Equality compares the sums.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .._shared.arrays import (as_pair, check_sizes, check_statistics_memory, frobenius_norm, lazy_zeros,
                              refuse_out_of_range)
from .._formulas.psd import DEFAULT_RTOL, GramInverse, PsdSpectrum, gram_inverse
from .._formulas.certification import debiased_energy, noise_floor, variance_estimate
from .._shared.errors import InputError
from .._formulas.folds import DEFAULT_FOLDS, FoldSums
from .moments import BatchMoments, PackedGram, batch_moments
from .._formulas.quantities import realizability
from .._scores.scores import CandidateScore, StreamDiagnostics

STREAM_FIELDS = ("sum_z_sq", "n_stream_vectors")  # together, or neither (``stream``)
SCALAR_FIELDS = ("n_samples", "n_positions", "n_vectors", "sum_q_sq", "sum_xi_sq", "sum_batch_grad_norm",
                 "n_batches", "n_folds") + STREAM_FIELDS + ("sum_update_sq",)
COUNT_FIELDS = ("n_samples", "n_positions", "n_vectors", "n_batches", "n_folds", "n_stream_vectors")
UNNAMED = "candidate"  # what a candidate scored without a name is called, in its score and in its refusals
MAX_FOLDS = 64  # 2^63 sign patterns: far past anything a probe needs (16 is the default)
MAX_COUNT = 2**53  # counts stored as float64 are exact up to here
# Stored sums may come from float32 per-batch sums (relative round-off ~1e-7 per batch); a relation
# they break by more than this was not produced by adding up honest batches.
CONSISTENCY_RTOL = 1e-5
# Round-off of a Gram summed in float32 moves the unit-diagonal Gram's eigenvalues by far less than
# this share of the largest; a corrupted or hand-edited sum_gram moves them by more.
INDEFINITE_RTOL = 1e-3
# The growth value is a projection of ag's Q: it may pass ag only by round-off near tangent completeness.
PROJECTION_RTOL = 1e-2
MATRIX_FIELDS = ("sum_cross", "sum_gram", "sum_xtx", "sum_qq")
FOLD_FIELDS = ("fold_cross", "fold_samples")
# what depends on how the samples were cut into batches (eq. (2)'s batch average, the folds); every
# other sum of one pass is the same however the same samples are batched
BATCHING_FIELDS = ("n_batches", "sum_batch_grad_norm") + FOLD_FIELDS
FIELDS = SCALAR_FIELDS + MATRIX_FIELDS + FOLD_FIELDS
# absent from dumps written before they existed (n_vectors, folds) or when not asked for (sum_xtx)
OPTIONAL_FIELDS = ("n_vectors", "sum_xtx", "n_folds", "sum_qq") + FOLD_FIELDS + STREAM_FIELDS + ("sum_update_sq",)


def _checked_folds(arrays, n_folds: int, cross: np.ndarray, n_samples: int):
    """The stored ``fold_cross`` and ``fold_samples``, refused unless they add up to the totals."""
    folds = np.asarray(arrays["fold_cross"], dtype=np.float64)
    counts = np.asarray(arrays["fold_samples"])
    if folds.shape != (n_folds, *cross.shape) or counts.shape != (n_folds,):
        raise InputError(f"fold_cross {folds.shape} and fold_samples {counts.shape} do not fit "
                         f"{n_folds} folds of {cross.shape}")
    if counts.dtype.kind not in "iuf" or not np.all((counts >= 0) & (counts == np.round(counts))):
        raise InputError("fold_samples must hold whole numbers >= 0")
    counts = counts.astype(np.int64)
    if int(counts.sum()) != n_samples:
        raise InputError(f"fold_samples add up to {int(counts.sum())}, n_samples is {n_samples}")
    scale = float(np.abs(folds).sum(axis=0).max(initial=0.0))
    if float(np.abs(folds.sum(axis=0) - cross).max(initial=0.0)) > CONSISTENCY_RTOL * scale:
        raise InputError("fold_cross does not add up to sum_cross")
    return folds.copy(), counts


def _all_finite(values) -> bool:
    """Whether every entry is finite: a finite sum says so in one pass without a mask (NaN or inf in it makes the
    sum NaN or inf); only a sum that is not (those, or finite entries whose sum overflows) looks at each entry."""
    return bool(np.isfinite(np.sum(values))) or bool(np.isfinite(values).all())


def _symmetric(matrix) -> np.ndarray:
    m = np.asarray(matrix, dtype=np.float64)
    return 0.5 * (m + m.T)


def _added(total: np.ndarray, value, symmetric: bool = False) -> np.ndarray:
    """``total`` plus ``value`` (symmetrised where ``symmetric``), in place."""
    total += _symmetric(value) if symmetric else np.asarray(value, dtype=np.float64)
    return total


def _adopted(zeros: np.ndarray, value, symmetric: bool = False) -> np.ndarray:
    """``value`` itself where it is a C-ordered float64 array of ``zeros``' shape, else :func:`_added` to ``zeros``."""
    if (isinstance(value, np.ndarray) and value.dtype == np.float64 and value.shape == zeros.shape
            and value.flags.c_contiguous and value.flags.writeable):
        return value
    return _added(zeros, value, symmetric)


@dataclass(eq=False, repr=False)
class CandidateStatistics:
    """Mergeable, serialisable running sums for one candidate (see module docstring)."""

    n_hidden: int
    n_features: int
    n_positions: int = 1
    variance: bool = False
    n_folds: int = DEFAULT_FOLDS
    curvature: bool = False
    stream: bool = False
    block_update: bool = False

    def __post_init__(self):
        if not 0 <= self.n_folds <= MAX_FOLDS:
            raise InputError(f"n_folds must be in [0, {MAX_FOLDS}], got {self.n_folds}")
        check_sizes(n_positions=self.n_positions)  # before any array is allocated, within the memory budget
        check_statistics_memory(self.n_hidden, self.n_features, variance=self.variance, n_folds=self.n_folds,
                                curvature=self.curvature)
        self.n_samples = 0
        self.n_vectors = 0  # None once a part of the sums did not count them (an old dump)
        self.n_batches = 0
        self.sum_q_sq = 0.0
        self.sum_xi_sq = 0.0
        self.sum_batch_grad_norm = 0.0
        self.sum_cross = np.zeros((self.n_hidden, self.n_features))
        self.sum_gram = np.zeros((self.n_features, self.n_features))
        self._exact_gram = True  # exactly symmetric: summed by add_moments, not put there from outside (score)
        self.sum_xtx = np.zeros((self.n_features, self.n_features)) if self.variance else None
        self.sum_qq = np.zeros((self.n_hidden, self.n_hidden)) if self.curvature else None
        # the folds a probe's batches never reach take no memory (4 of the 16 after 4 batches)
        self.fold_cross = lazy_zeros((self.n_folds, self.n_hidden, self.n_features)) if self.n_folds else None
        self.fold_samples = np.zeros(self.n_folds, dtype=np.int64) if self.n_folds else None
        if self.block_update and not self.stream:
            raise InputError("block_update sums are relative to the stream's: they need stream=True")
        self.sum_z_sq = 0.0 if self.stream else None
        self.n_stream_vectors = 0 if self.stream else None
        self.sum_update_sq = 0.0 if self.block_update else None

    @classmethod
    def from_samples(cls, Q, Psi, *, variance: bool = True, batch_size: int | None = None,
                     n_folds: int = DEFAULT_FOLDS, curvature: bool = False):
        """One pass over in-memory arrays (batched as ``batch_size`` for eq. (2)).

        Without ``batch_size`` the samples are one batch for eq. (2) and
        ``n_folds`` consecutive blocks for the folds.  The sums are those of
        :meth:`update` batch by batch (to round-off), made in one pass over
        all samples: a batch at a time costs a call per batch, which dominated
        scoring small arrays.
        """
        q, psi = as_pair(Q, Psi, check_finite=False)
        refuse_out_of_range(q, psi)  # checks finiteness too, in the same one pass
        M, T = q.shape[:2]
        stats = cls(q.shape[2], psi.shape[2], T, variance, n_folds, curvature)
        if M == 0:
            return stats
        step = batch_size or -(-M // max(n_folds, 1))
        batch_of = np.arange(M) // step
        folds = None
        if n_folds:  # batch b goes to fold b mod m, as update() deals them
            counts = np.bincount(batch_of % n_folds, minlength=n_folds)
            order = np.argsort(batch_of % n_folds, kind="stable")  # each fold's samples together
            qs, ps = q[order].reshape(M * T, -1), psi[order].reshape(M * T, -1)
            ends = np.cumsum(counts) * T
            cross = np.stack([qs[e - c * T : e].T @ ps[e - c * T : e] for c, e in zip(counts, ends)])
            folds = (cross, counts)
        moments = batch_moments(q, psi, variance=variance, curvature=curvature)
        if batch_size:  # eq. (2): sum over batches of ||Q_b||_F / |b|
            per_batch = np.bincount(batch_of, weights=np.einsum("mtn,mtn->m", q, q))
            moments = replace(moments, batch_grad_norm=float(np.sum(np.sqrt(per_batch) / np.bincount(batch_of))),
                              n_batches=int(batch_of[-1]) + 1)
        return stats.add_moments(moments, folds=folds)

    def update(self, Q, Psi, *, z=None) -> "CandidateStatistics":
        """Add one batch; the batch also counts once in the eq. (2) average.

        ``T`` may differ from batch to batch (sequences of different lengths);
        ``n_positions`` keeps the first batch's, as the adapters do, and
        ``n_vectors`` counts every batch's ``M T``.  ``z``: the batch's stream
        as positions ``(M, T, N)``, whose sums statistics with ``stream=True``
        need (:func:`~satcore._statistics.moments.batch_moments`).
        """
        q, psi = as_pair(Q, Psi, check_finite=False, allow_empty=True)  # batch_moments checks, for free
        if q.shape[2] != self.n_hidden or psi.shape[2] != self.n_features:
            raise InputError(
                f"batch has (N, r) = ({q.shape[2]}, {psi.shape[2]}), statistics expect "
                f"({self.n_hidden}, {self.n_features})"
            )
        moments = batch_moments(q, psi, variance=self.variance, curvature=self.curvature,
                                z=z if self.stream else None)
        return self.add_moments(moments)

    def add_moments(self, moments: BatchMoments, *, fold: int | None = None, folds=None,
                    adopt: bool = False) -> "CandidateStatistics":
        """Add one batch's sums, a :class:`~satcore._statistics.moments.BatchMoments` (adapters compute them on their
        device; NumPy values, Python numbers, or anything :func:`numpy.asarray` and ``float`` read).

        The batch counts in eq. (2)'s average when it carries ``batch_grad_norm`` (as
        ``n_batches`` batches when it says so: the totals of several).  Its
        ``n_vectors`` ``None`` leaves the statistics' ``n_vectors`` unknown too.  ``fold``: the
        fold the batch goes to; by default the number of batches before it, modulo
        ``n_folds``.  ``folds``: instead, per-fold parts ``(fold_cross, fold_samples)`` of the
        sums (another statistics' folds, as :meth:`accumulate` adds them).  A sum these
        statistics track (``sum_xtx``, ``sum_qq``, the stream sums) must be in the batch.

        ``adopt``: statistics that hold no sums yet take the batch's float64 arrays (and ``folds``'
        ``fold_cross``) as their own, without a copy, where they are C-ordered NumPy arrays of the
        right shape (the caller lets go of them; its Grams exactly symmetric): the same bits as
        adding them to zeros, without a second copy of every sum.  An adapter's device totals
        handed over at the end of a probe come this way (on the CPU, copying 16 folds of
        ``N x r`` into fresh zeros took a quarter of a GPT-2 probe and made every fold resident).
        An adopted :class:`~satcore._statistics.moments.PackedGram` stays packed (half the bytes) until
        ``sum_gram`` is first read.
        """
        m = moments
        if m.sum_gram is None:
            raise InputError("the batch holds no sum_gram (its producer added it into running totals)")
        if self.variance and m.sum_xtx is None:
            raise InputError("these statistics track sum_xtx (variance=True); the batch did not supply it")
        if self.curvature and m.sum_qq is None:
            raise InputError("these statistics track sum_qq (curvature=True); the batch did not supply it")
        if self.stream and (m.sum_z_sq is None or m.n_stream_vectors is None):
            raise InputError("these statistics track the stream sums (stream=True); the batch did not supply them")
        if self.block_update and m.sum_update_sq is None:
            raise InputError("these statistics track sum_update_sq (block_update=True); the batch did not supply it")
        if adopt and (self.n_samples or self.n_batches):
            raise InputError("only statistics that hold no sums yet can adopt a batch's arrays")
        take = _adopted if adopt else _added
        if self.n_folds and folds is not None:
            self.fold_cross = take(self.fold_cross, folds[0])
            self.fold_samples += np.asarray(folds[1], dtype=np.int64)
        elif self.n_folds:
            k = self.n_batches % self.n_folds if fold is None else int(fold)
            self.fold_cross[k] += np.asarray(m.sum_cross, dtype=np.float64)
            self.fold_samples[k] += int(m.n_samples)
        self.n_samples += int(m.n_samples)
        self.n_vectors = None if self.n_vectors is None or m.n_vectors is None else self.n_vectors + int(m.n_vectors)
        self.sum_q_sq += float(m.sum_q_sq)
        self.sum_xi_sq += float(m.sum_xi_sq)
        self.sum_cross = take(self.sum_cross, m.sum_cross)
        # Batch sums computed in float32 (or by a non-symmetric BLAS path) are symmetric only
        # to round-off; symmetrising here keeps the totals exactly symmetric, as dumps require
        # (adopted Grams are exactly symmetric already: 0.5 (G + G^T) would be G's very bits).
        exact = self._exact_gram  # assigning sum_gram (the property) would clear it
        gram = m.sum_gram
        if isinstance(gram, PackedGram) and not (adopt and gram.order == self.n_features):
            gram = gram.whole()
        # an adopted packed Gram stays packed until sum_gram is first read (the property makes it whole)
        self._sum_gram = gram if isinstance(gram, PackedGram) else take(self._sum_gram, gram, symmetric=True)
        self._exact_gram = exact
        if self.variance:
            self.sum_xtx = take(self.sum_xtx, m.sum_xtx, symmetric=True)
        if self.curvature:
            self.sum_qq = take(self.sum_qq, m.sum_qq, symmetric=True)
        if self.stream:
            self.sum_z_sq += float(m.sum_z_sq)
            self.n_stream_vectors += int(m.n_stream_vectors)
        if self.block_update:
            self.sum_update_sq += float(m.sum_update_sq)
        if m.batch_grad_norm is not None:
            self.sum_batch_grad_norm += float(m.batch_grad_norm)
            self.n_batches += 1 if m.n_batches is None else int(m.n_batches)
        return self

    def accumulate(self, other: "CandidateStatistics") -> "CandidateStatistics":
        """In place: add ``other``'s sums, so that ``self`` equals one pass over both sample sets.

        ``sum_xtx``, ``sum_qq``, the stream sums and the folds are kept only when both sides
        have them (else refused: ``self`` tracks them); ``n_vectors`` becomes unknown when either side's is.
        ``other``'s folds are rotated by ``self``'s batch count, as one pass over ``self``'s
        batches then ``other``'s would have dealt them.
        """
        self._check_compatible(other)
        folds = None
        if self.n_folds:
            if not other.n_folds:
                raise InputError("these statistics keep folds; the other statistics keep none")
            shift = self.n_batches % self.n_folds
            folds = (np.roll(other.fold_cross, shift, axis=0), np.roll(other.fold_samples, shift))
        sums = BatchMoments(
            n_samples=other.n_samples,
            n_vectors=other.n_vectors,
            sum_q_sq=other.sum_q_sq,
            sum_cross=other.sum_cross,
            sum_gram=other.sum_gram,
            sum_xi_sq=other.sum_xi_sq,
            sum_xtx=other.sum_xtx if self.variance else None,
            sum_qq=other.sum_qq if self.curvature else None,
            sum_z_sq=other.sum_z_sq,
            n_stream_vectors=other.n_stream_vectors,
            sum_update_sq=other.sum_update_sq,
            batch_grad_norm=other.sum_batch_grad_norm,
            n_batches=other.n_batches,
        )
        return self.add_moments(sums, folds=folds)

    def __eq__(self, other) -> bool:
        """Equal shapes, settings and sums (every array of :meth:`to_arrays`, element for element)."""
        if not isinstance(other, CandidateStatistics):
            return NotImplemented
        mine, theirs = self.to_arrays(), other.to_arrays()
        return (
            (self.n_hidden, self.n_features, self.n_positions, self.variance)
            == (other.n_hidden, other.n_features, other.n_positions, other.variance)
            and mine.keys() == theirs.keys()
            and all(np.array_equal(mine[k], theirs[k]) for k in mine)
        )

    __hash__ = None  # mutable sums

    @property
    def sum_gram(self) -> np.ndarray:
        """``sum_i Psi_i^T Psi_i`` (module docstring); a Gram adopted packed is made whole here, once."""
        if isinstance(self._sum_gram, PackedGram):
            self._sum_gram = self._sum_gram.whole()
        return self._sum_gram

    @sum_gram.setter
    def sum_gram(self, value) -> None:
        # an array put here from outside (a dump's, a test's) is symmetric to its round-off only, as far as
        # score() knows: it symmetrises it; the sums add_moments makes are exactly symmetric and skip that
        self._sum_gram = value
        self._exact_gram = False

    def __repr__(self) -> str:
        # it describes sums of any size without a warning: the norm is scaled (finite up to float64's largest
        # value), and a trace past that range (or of infinite entries) is shown as the inf or nan it is
        with np.errstate(over="ignore", invalid="ignore"):
            trace = float(np.trace(self.sum_gram))
        return (
            f"CandidateStatistics(N={self.n_hidden}, r={self.n_features}, T={self.n_positions}, "
            f"variance={self.variance}, stream={self.stream}, n_samples={self.n_samples}, n_vectors={self.n_vectors}, "
            f"n_batches={self.n_batches}, sum_q_sq={self.sum_q_sq:.6g}, sum_xi_sq={self.sum_xi_sq:.6g}, "
            f"||sum_cross||_F={frobenius_norm(self.sum_cross):.6g}, tr(sum_gram)={trace:.6g})"
        )

    # -- merging and serialisation -------------------------------------------------
    def _check_compatible(self, other: "CandidateStatistics"):
        mine = (self.n_hidden, self.n_features, self.n_positions)
        theirs = (other.n_hidden, other.n_features, other.n_positions)
        if mine != theirs:
            raise InputError(f"cannot merge statistics with (N, r, T) {mine} and {theirs}")
        if self.n_folds and other.n_folds and self.n_folds != other.n_folds:
            raise InputError(f"cannot merge statistics with {self.n_folds} and {other.n_folds} folds")

    def merge(self, other: "CandidateStatistics") -> "CandidateStatistics":
        """New statistics equal to one pass over both sample sets (``self``'s batches first).

        ``sum_xtx``, ``sum_qq``, ``n_vectors`` and the stream sums survive only when both
        sides have them, folds likewise; ``other``'s folds are rotated by ``self``'s batch
        count, as one pass would have dealt its batches.
        """
        self._check_compatible(other)
        n_folds = self.n_folds if self.n_folds and other.n_folds else 0
        out = CandidateStatistics(
            self.n_hidden, self.n_features, self.n_positions, self.variance and other.variance, n_folds,
            self.curvature and other.curvature, self.stream and other.stream,
            self.block_update and other.block_update,
        )
        return out.accumulate(self).accumulate(other)

    __add__ = merge

    def to_arrays(self) -> dict[str, np.ndarray]:
        out = {f: np.asarray(getattr(self, f)) for f in SCALAR_FIELDS if getattr(self, f) is not None}
        out["sum_cross"] = self.sum_cross
        out["sum_gram"] = self.sum_gram
        if self.variance:
            out["sum_xtx"] = self.sum_xtx
        if self.curvature:
            out["sum_qq"] = self.sum_qq
        if self.n_folds:
            out["fold_cross"] = self.fold_cross
            out["fold_samples"] = self.fold_samples
        return out

    @classmethod
    def from_arrays(cls, arrays: dict) -> "CandidateStatistics":
        """Inverse of :meth:`to_arrays`; validates shapes and consistency."""
        missing = [f for f in FIELDS if f not in OPTIONAL_FIELDS and f not in arrays]
        if missing:
            raise InputError(f"missing field(s) {', '.join(missing)}")
        cross = np.asarray(arrays["sum_cross"], dtype=np.float64)
        gram = np.asarray(arrays["sum_gram"], dtype=np.float64)
        if cross.ndim != 2 or gram.shape != (cross.shape[1], cross.shape[1]):
            raise InputError(f"sum_cross {cross.shape} and sum_gram {gram.shape} do not fit (N, r) and (r, r)")
        if 0 in cross.shape:
            raise InputError(f"sum_cross has shape {cross.shape}: a candidate needs N >= 1 and r >= 1")
        scalars = {}
        for f in [f for f in SCALAR_FIELDS if f in arrays]:
            value = np.asarray(arrays[f])
            if value.shape != ():
                raise InputError(f"{f} must be a scalar, got shape {value.shape}")
            if value.dtype.kind not in "iuf":
                raise InputError(f"{f} must be numeric, got dtype {value.dtype}")
            scalars[f] = value.item()
        for f in [f for f in COUNT_FIELDS if f in scalars]:
            count = scalars[f]
            if not (0 <= count <= MAX_COUNT and count == int(count)):
                raise InputError(f"{f} must be a whole number in [0, 2^53], got {count!r}")
            scalars[f] = int(count)
        if scalars["n_positions"] < 1:
            raise InputError("n_positions must be >= 1")
        if scalars.get("n_vectors") == 0 and scalars["n_samples"] >= 1:
            raise InputError(f"n_vectors is 0 but n_samples is {scalars['n_samples']}: samples add position vectors")
        if scalars.get("n_stream_vectors") == 0 and scalars.get("sum_z_sq", 0) > 0:  # else a stream RMS per position
            raise InputError(f"n_stream_vectors is 0 but sum_z_sq is {scalars['sum_z_sq']:g}: a stream sum has vectors")
        if scalars["n_batches"] == 0 and scalars["sum_batch_grad_norm"] > 0:  # else ag_batch None, without a word
            raise InputError(f"n_batches is 0 but sum_batch_grad_norm is {scalars['sum_batch_grad_norm']:g}: a sum "
                             "over batches has batches")
        n_folds = scalars.get("n_folds", 0)
        if n_folds > MAX_FOLDS:
            raise InputError(f"n_folds must be in [0, {MAX_FOLDS}], got {n_folds}")
        if bool(n_folds) != ("fold_cross" in arrays) or ("fold_cross" in arrays) != ("fold_samples" in arrays):
            raise InputError("n_folds, fold_cross and fold_samples come together (all or none)")
        stream = "sum_z_sq" in scalars
        if stream != ("n_stream_vectors" in scalars) or ("sum_update_sq" in scalars and not stream):
            raise InputError("sum_z_sq and n_stream_vectors come together (both or none); sum_update_sq needs them")
        stats = cls(cross.shape[0], cross.shape[1], scalars["n_positions"], "sum_xtx" in arrays, n_folds,
                    "sum_qq" in arrays, stream, "sum_update_sq" in scalars)
        stats.n_vectors = None  # unless stored: a dump written before the field existed
        for f, value in scalars.items():
            setattr(stats, f, value)
        if not all(np.isfinite(v) for v in (stats.sum_z_sq or 0.0, stats.sum_update_sq or 0.0)):
            raise InputError("sum_z_sq or sum_update_sq is not finite")
        if min(stats.sum_q_sq, stats.sum_xi_sq, stats.sum_batch_grad_norm, stats.sum_z_sq or 0.0,
               stats.sum_update_sq or 0.0) < 0:
            raise InputError("negative sum of squares or norms")
        stats.sum_cross, stats.sum_gram = cross.copy(), gram.copy()  # symmetric to the stored round-off only
        if stats.variance:
            xtx = np.asarray(arrays["sum_xtx"], dtype=np.float64)
            if xtx.shape != gram.shape:
                raise InputError(f"sum_xtx has shape {xtx.shape}, expected {gram.shape}")
            stats.sum_xtx = xtx.copy()
        if stats.curvature:
            qq = np.asarray(arrays["sum_qq"], dtype=np.float64)
            if qq.shape != (cross.shape[0], cross.shape[0]):
                raise InputError(f"sum_qq has shape {qq.shape}, expected {(cross.shape[0], cross.shape[0])}")
            stats.sum_qq = qq.copy()
        if n_folds:
            stats.fold_cross, stats.fold_samples = _checked_folds(arrays, n_folds, cross, stats.n_samples)
        for f in ("sum_gram", "sum_xtx", "sum_qq"):
            m = getattr(stats, f)
            if m is not None and not np.allclose(m, m.T, rtol=1e-10, atol=1e-12 * (np.abs(m).max() + 1e-300)):
                raise InputError(f"{f} is not symmetric")
        stats._check_consistent()
        return stats

    def _check_consistent(self) -> None:
        """Relations every honest set of sums satisfies, up to float32 round-off of per-batch sums:
        ``sum ||xi_i||^2 >= ||sum xi_i||^2 / n`` (a variance is not negative) and
        ``tr(sum X_i^T X_i) = sum ||xi_i||^2``; diagonals of the Grams are sums of squares."""
        for gram in [self.sum_gram] + ([self.sum_xtx] if self.variance else []) + (
                [self.sum_qq] if self.curvature else []):
            # a Gram summed by FFT (the conv route) may leave an all-zero feature at -1e-16 of the largest
            diagonal = np.diagonal(gram)
            if not np.all(diagonal >= -CONSISTENCY_RTOL * np.max(np.abs(diagonal), initial=0.0)):
                raise InputError("a Gram (sum_gram or sum_xtx) has a negative diagonal entry")
        if self.n_samples > 0:
            mean_part = float(np.sum(self.sum_cross * self.sum_cross)) / self.n_samples
            if self.sum_xi_sq < mean_part * (1 - CONSISTENCY_RTOL):
                raise InputError(f"sum_xi_sq {self.sum_xi_sq:.6g} < ||sum_cross||^2 / n_samples {mean_part:.6g} "
                                 "(a negative variance)")
        if self.variance:
            trace = float(np.trace(self.sum_xtx))
            if abs(trace - self.sum_xi_sq) > CONSISTENCY_RTOL * max(trace, self.sum_xi_sq):
                raise InputError(f"trace(sum_xtx) {trace:.6g} differs from sum_xi_sq {self.sum_xi_sq:.6g}")
        if self.curvature:  # tr(sum_i Q_i^T Q_i) = sum_i ||Q_i||_F^2
            trace = float(np.trace(self.sum_qq))
            if abs(trace - self.sum_q_sq) > CONSISTENCY_RTOL * max(trace, self.sum_q_sq):
                raise InputError(f"trace(sum_qq) {trace:.6g} differs from sum_q_sq {self.sum_q_sq:.6g}")

    # -- finished quantities -----------------------------------------------------------
    def cross_gradient(self) -> np.ndarray:
        """``C = sum_cross / n``."""
        return self.sum_cross / self.n_samples

    def feature_gram(self) -> np.ndarray:
        """``K = sum_gram / n``."""
        return self.sum_gram / self.n_samples

    def _feature_rows(self) -> int:
        """The position vectors behind ``sum_gram``, a bound on its rank: without a stored count (an old dump)
        every batch is taken to have had the first batch's ``T``."""
        return self.n_samples * self.n_positions if self.n_vectors is None else self.n_vectors

    def feature_gram_inverse(self, rtol: float = DEFAULT_RTOL) -> GramInverse | PsdSpectrum:
        """``K^-`` of ``K = sum_gram / n`` (:func:`~satcore._formulas.psd.gram_inverse`), the one every growth value,
        matched block and predicted change of these statistics reads (Lemma 4 of Liu et al.: ``V^2 = tr(C K^- C^T)``).

        Made from ``sum_gram``'s own inverse as ``(sum_gram / n)^- = n sum_gram^-`` (``mean_of``; the unit-diagonal
        ``S K S`` is ``sum_gram``'s), without an ``r x r`` copy ``K``, from a packed ``sum_gram`` without making it
        whole here (``gram_inverse`` unpacks it into the array it factors): one route, so that the report's growth value and
        ``grow``'s predicted change ``-alpha V^2`` agree to round-off however ill-conditioned ``K`` is (two
        routes to one inverse differ by round-off times its conditioning).  ``K``'s rank is at most its position
        vectors (the route's ``rank_bound``); sums these statistics added up themselves are exactly symmetric.
        """
        if self.n_samples == 0:
            raise InputError("these statistics hold no samples: K = sum_gram / n is undefined")
        return gram_inverse(self._sum_gram, rtol, rank_bound=self._feature_rows(), symmetric=self._exact_gram,
                            mean_of=self.n_samples)

    def stream_rms(self) -> float | None:
        """``||z||_S = sqrt(sum_i ||z_i||^2 / n_samples)``, the empirical norm of the candidate's stream
        (paper, Appendix H: the block of relative size ``rho`` has ``alpha = rho ||z||_S / V``);
        ``None`` when the statistics hold no stream sums or no samples."""
        if not self.stream or not self.n_samples:
            return None
        return float(np.sqrt(self.sum_z_sq / self.n_samples))

    def stream_diagnostics(self, name: str = UNNAMED) -> StreamDiagnostics | None:
        """:class:`~satcore._scores.scores.StreamDiagnostics` from the stream sums (``None`` without them)."""
        rms = self.stream_rms()
        if rms is None:
            return None
        per_position = float(np.sqrt(self.sum_z_sq / max(self.n_stream_vectors, 1)))
        relative = (float(np.sqrt(self.sum_update_sq / self.sum_z_sq))
                    if self.block_update and self.sum_z_sq > 0 else None)
        return StreamDiagnostics(name, rms, per_position, relative)

    def gradient_moment(self) -> np.ndarray:
        """``F = sum_qq / n`` (``curvature=True`` statistics only)."""
        if not self.curvature:
            raise InputError("these statistics do not keep sum_qq (curvature=False)")
        return self.sum_qq / self.n_samples

    def _check_finite(self, name: str) -> None:
        """Refuse sums that hold NaN or inf: adapters add batches without looking at them
        (a per-batch check would stall a GPU), so this is where a float16 overflow surfaces."""
        # a packed sum_gram by its packed entries (the same numbers): reading sum_gram would make it whole
        values = {f: self._sum_gram.packed if f == "sum_gram" and isinstance(self._sum_gram, PackedGram)
                  else getattr(self, f) for f in ("sum_q_sq", "sum_xi_sq", "sum_batch_grad_norm") + MATRIX_FIELDS}
        fields = [f for f, value in values.items() if value is not None and not _all_finite(value)]
        if fields:
            raise InputError(
                f"candidate {name!r}: {', '.join(fields)} not finite: its gradients or features held NaN or inf, "
                "or values too large to square in float64"
            )

    def score(self, name: str = UNNAMED, rtol: float = DEFAULT_RTOL) -> CandidateScore:
        """Finalise into a :class:`CandidateScore` of the candidate ``name`` (default ``"candidate"``); see its
        docstring for the formulas."""
        n = self.n_samples
        if n == 0:
            raise InputError(f"candidate {name!r} has no samples")
        self._check_finite(name)
        rows = self._feature_rows()
        spectrum = self.feature_gram_inverse(rtol)
        if not spectrum.lowest >= -INDEFINITE_RTOL * spectrum.highest:  # written so that a NaN fails it
            raise InputError(f"candidate {name!r}: sum_gram is not positive semi-definite (eigenvalue "
                             f"{spectrum.lowest:.3g} of the unit-diagonal Gram, largest {spectrum.highest:.3g})")
        ag_value = float(np.sqrt(self.sum_q_sq / n))
        # the fold Grams now: these statistics may go on adding batches before the score's tests are asked for;
        # the whitened folds add up to the whitened sum_cross (FoldSums.with_whitened_total), C's own whitening
        fold_sums, whitened_sum = None, None
        if self.n_folds:
            fold_sums, whitened_sum = FoldSums.with_whitened_total(self.fold_cross, self.fold_samples, spectrum.whiten)
        if whitened_sum is None:
            growth = float(np.sqrt(spectrum.quadratic_form(self.cross_gradient())))
        else:
            growth = float(np.sqrt(np.sum(whitened_sum * whitened_sum))) / n
        if growth > ag_value * (1 + PROJECTION_RTOL) + np.finfo(float).tiny:
            # a projection of Q cannot be longer than Q (Theorem 1 item 2)
            raise InputError(f"candidate {name!r}: growth value {growth:.6g} exceeds ag {ag_value:.6g}: "
                             "sum_q_sq is too small for sum_cross and sum_gram")
        # ||C||_F^2 = ||sum_cross||_F^2 / n^2 as one dot product: no N x r copy C, no squared temporary
        cross = np.ravel(self.sum_cross)
        g_norm_sq = float(np.dot(cross, cross)) / (n * n)
        sigma_sq = variance_estimate(n, self.sum_xi_sq, g_norm_sq)
        gv_debiased = None
        if self.variance and n > 1:
            # sum_i xi_i^T (I kron K^+) xi_i = <K^+, sum_i X_i^T X_i>
            noise = float(np.sum(spectrum.pinv() * self.sum_xtx))
            gv_debiased = (n * n * growth**2 - noise) / (n * (n - 1))
        return CandidateScore(
            name=name,
            n_samples=n,
            n_hidden=self.n_hidden,
            n_features=self.n_features,
            n_positions=self.n_positions,
            ag=ag_value,
            ag_normalized=ag_value / float(np.sqrt(self.n_hidden)),
            ag_batch=self.sum_batch_grad_norm / self.n_batches if self.n_batches else None,
            growth_value=growth,
            realizability=realizability(growth, ag_value),
            cross_gradient_norm=float(np.sqrt(g_norm_sq)),
            feature_rank=spectrum.rank,
            tangent_complete=spectrum.rank == rows,
            sigma_sq=sigma_sq,
            noise_floor=noise_floor(n, sigma_sq),
            signal_energy_debiased=debiased_energy(n, self.sum_xi_sq, g_norm_sq),
            growth_value_sq_debiased=gv_debiased,
            fold_sums=fold_sums,
        )
