"""Scores: what the sums give per candidate (growth value, AG, noise floors) and in depth order."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING

from .._formulas.psd import DEFAULT_RTOL
from .._shared.json_numbers import json_number
from .._formulas.folds import FoldSums, FoldTest

if TYPE_CHECKING:
    from .._decisions.report import DepthReport

# The report is the next layer's work: satcore._decisions.reporting puts its depth_report here when it loads
# (satcore's __init__ loads it), so that scores import nothing from the layers after them.
_NEXT_LAYER: dict = {}


def growth_noise_floor(score: "CandidateScore") -> float | None:
    """``f = sqrt(max(0, V_hat^2 - V2_unbiased))``: the growth value a saturated candidate shows on this probe.

    ``E V_hat^2 = V^2 + f^2`` (docs/core.md, Noise floor); the unbiased ``V^2``
    comes from ``sum X^T X`` (``variance=True``) when the probe kept it, else
    from the folds.  ``None`` when neither is there.  In growth-value units,
    unlike :attr:`CandidateScore.noise_floor` (``||C||_F`` units).
    """
    unbiased = score.growth_value_sq_debiased
    if unbiased is None and score.fold_sums is not None:
        test = score.fold_test
        unbiased = test.unbiased if test.n_folds >= 2 else None
    if unbiased is None or not math.isfinite(unbiased):
        return None
    return math.sqrt(max(0.0, score.growth_value**2 - unbiased))


@dataclass(frozen=True)
class CandidateScore:
    """Scores of one insertion candidate (docs/core.md, Quantities and Certification).

    ``growth_value`` is ``V_S = sqrt(tr(C K^+ C^T))`` (Thm 2, Lemma 4);
    ``realizability = growth_value / ag`` (Remark 3); ``cross_gradient_norm`` is
    ``||C||_F = ||g_S||_2`` (Remark 4).  ``sigma_sq`` is the per-sample variance
    of ``xi_i = vec(Q_i^T Psi_i)``, ``noise_floor = sqrt(sigma_sq / n)`` the
    typical ``||g_hat|| = ||C||_F`` under saturation (in ``||C||_F`` units; the
    growth value's own floor, in its units, is :attr:`growth_noise_floor`),
    ``signal_energy_debiased`` the
    unbiased estimate of ``||g_pop||^2`` and ``growth_value_sq_debiased`` the
    same debiasing of ``growth_value^2`` in the ``K^+`` metric (``None`` when
    the probe did not accumulate ``sum X_i^T X_i``).
    """

    name: str
    n_samples: int
    n_hidden: int
    n_features: int
    n_positions: int
    ag: float
    ag_normalized: float
    ag_batch: float | None
    growth_value: float
    realizability: float
    cross_gradient_norm: float
    feature_rank: int
    tangent_complete: bool
    sigma_sq: float
    noise_floor: float
    signal_energy_debiased: float
    growth_value_sq_debiased: float | None
    fold_sums: FoldSums | None = field(default=None, repr=False, compare=False)

    # The fold tests cost 45 times the rest of a score (the sign-flip p-value enumerates 2^(m-1)
    # patterns): a score computes them when first asked for, once (cached_property writes the
    # instance's __dict__ directly, which a frozen dataclass allows).
    @cached_property
    def fold_test(self) -> FoldTest | None:
        """The fold test of ``H0: V_pop = 0`` in the growth value's metric (:mod:`satcore._formulas.folds`);
        ``None`` for statistics that keep no folds.  Computed on first access."""
        return None if self.fold_sums is None else self.fold_sums.test("growth value")

    @cached_property
    def fold_test_euclidean(self) -> FoldTest | None:
        """The same test in ``||C||_F``'s metric (Prop. 1's quantity); computed on first access."""
        return None if self.fold_sums is None else self.fold_sums.test("euclidean")

    @property
    def growth_noise_floor(self) -> float | None:
        """The growth value's sampling-noise floor, in growth-value units (:func:`growth_noise_floor`)."""
        return growth_noise_floor(self)

    def to_dict(self) -> dict:
        out = {k: json_number(getattr(self, k)) for k in self.__dataclass_fields__ if k != "fold_sums"}
        out["growth_noise_floor"] = json_number(self.growth_noise_floor)
        out["n_folds"] = 0 if self.fold_test is None else self.fold_test.n_folds
        if self.fold_test_euclidean is not None:
            out["cross_gradient_norm_sq_unbiased"] = json_number(self.fold_test_euclidean.unbiased)
        return out


@dataclass(frozen=True)
class DepthScores:
    """Scored candidates in depth order (upstream first): the step between statistics and decisions.

    ``candidates`` keep their fold tests once computed, so :meth:`report` under
    several :class:`~satcore._decisions.criteria.Criteria` scores only once.
    ``statistics`` (the :class:`~satcore._statistics.depth.DepthStatistics` scored, with
    ``rtol``) is there for predicted gains, which refit a step on the sums.
    """

    candidates: tuple[CandidateScore, ...]
    statistics: object = field(default=None, repr=False, compare=False)
    rtol: float = DEFAULT_RTOL

    def __iter__(self):
        return iter(self.candidates)

    def __len__(self) -> int:
        return len(self.candidates)

    def __getitem__(self, name: str) -> CandidateScore:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def report(self, criteria=None, **options) -> "DepthReport":
        """:func:`satcore.depth_report` of these scores (same arguments)."""
        return _NEXT_LAYER["depth_report"](self, criteria, **options)


@dataclass(frozen=True)
class StreamDiagnostics:
    """Residual-stream norms of one candidate, from its stream sums (:mod:`satcore._statistics.candidate`).

    * ``stream_rms = sqrt(sum_i ||z_i||^2 / M) = ||z||_S``, the empirical norm that turns a
      relative insertion size ``rho`` into ``alpha`` (:func:`satcore.alpha_for_relative_update`);
    * ``stream_rms_per_position = sqrt(sum_i ||z_i||^2 / n_stream_vectors)``, the RMS norm of one
      token's (pixel's) stream vector;
    * ``relative_update = sqrt(sum_i ||block(z_i) - z_i||^2 / sum_i ||z_i||^2)``, the size of the
      block's own update relative to the stream (NAG, docs/references.md; ``None`` for the
      ``head`` endpoint, blocks that change the shape, and adapters that do not run the block).
    """

    name: str
    stream_rms: float
    stream_rms_per_position: float
    relative_update: float | None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
