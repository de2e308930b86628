"""Statistics over an ordered set of candidates, upstream first, and their scores.

A sums module: it imports no decision (verdicts, predictors); the report is
made from the scores by :mod:`satcore._decisions.reporting` (statistics -> scores ->
decisions -> results, docs/architecture.md).
"""

from __future__ import annotations

import math
from collections import OrderedDict

from .._formulas.psd import DEFAULT_RTOL
from .._shared.errors import InputError
from .._formulas.folds import DEFAULT_FOLDS
from .._scores.scores import CandidateScore, DepthScores
from .candidate import UNNAMED, CandidateStatistics

class DepthStatistics(OrderedDict):
    """Ordered mapping ``candidate name -> CandidateStatistics``, upstream first.

    Mergeable (candidate-wise, names and order must agree) and serialisable as
    ``{"<name>/<field>": array}``.
    """

    def merge(self, other: "DepthStatistics") -> "DepthStatistics":
        if list(self) != list(other):
            raise InputError(f"candidate lists differ: {list(self)} vs {list(other)}")
        merged = DepthStatistics()
        for name in self:
            try:
                merged[name] = self[name].merge(other[name])
            except InputError as exc:
                raise InputError(f"candidate {name!r}: {exc}") from None
        return merged

    __add__ = merge

    def join(self, other: "DepthStatistics") -> "DepthStatistics":
        """The candidates of both, ``self``'s first: one model probed in groups of candidates (one pass
        each, over the same samples), whose statistics form one report.  Names must be disjoint."""
        shared = [name for name in other if name in self]
        if shared:
            raise InputError(f"candidate(s) {shared} are in both: join takes disjoint candidates (merge adds samples)")
        return DepthStatistics(list(self.items()) + list(other.items()))

    def stream_rms(self, meta: dict | None = None) -> dict:
        """``||z||_S`` per candidate (:meth:`CandidateStatistics.stream_rms`), in candidate order.

        A candidate whose statistics hold no stream sums (a dump written before they existed)
        falls back on the value ``meta["diagnostics"][name]["stream_rms"]`` records, if any
        (:func:`stream_rms_from_meta`); the sums come first, so a merge of
        shards, whose meta is one shard's, reads the merged norm.
        """
        recorded = stream_rms_from_meta(meta) if meta is not None else {}
        out = {}
        for name, stats in self.items():
            value = stats.stream_rms()
            if value is None:
                value = recorded.get(name)
            if value is not None:
                out[name] = value
        return out

    def to_arrays(self) -> dict:
        return {f"{name}/{f}": v for name, s in self.items() for f, v in s.to_arrays().items()}

    @classmethod
    def from_arrays(cls, arrays: dict, order) -> "DepthStatistics":
        """``arrays`` maps ``"<name>/<field>"``; ``order`` lists candidate names.

        Names may contain dots and slashes; the field is the part after the last ``/``.
        """
        grouped: dict[str, dict] = {name: {} for name in order}
        for key, value in arrays.items():
            name, _, field = key.rpartition("/")
            if name not in grouped:
                raise InputError(f"statistics for unknown candidate {name!r}")
            grouped[name][field] = value
        out = cls()
        for name in order:
            try:
                out[name] = CandidateStatistics.from_arrays(grouped[name])
            except InputError as exc:
                raise InputError(f"stats/{name}: {exc}") from None
        return out

    def score(self, rtol: float = DEFAULT_RTOL) -> DepthScores:
        """Score every candidate (:meth:`CandidateStatistics.score`), upstream first.

        The scores' fold tests run when first asked for; :meth:`DepthScores.report`
        reads the same scores under any number of criteria without scoring again.
        """
        return DepthScores(tuple(s.score(name, rtol) for name, s in self.items()), statistics=self, rtol=rtol)

    def report(self, criteria=None, *, split: str | None = None, prop1=None, train: "DepthStatistics | None" = None,
               recipe=None, stream_rms: dict | None = None, rtol: float = DEFAULT_RTOL, **options):
        """Score every candidate, test each one and give the verdict: ``self.score(rtol).report(...)``.

        ``self`` is the probe split the tests read (independent of training).
        ``criteria`` (:class:`satcore.Criteria`: ``alpha``, ``tolerance``,
        ``rho``), ``prop1`` (:class:`satcore.Prop1Options`) and, with ``train``
        (the same candidates on the training split), ``recipe``
        (:class:`satcore.Recipe`, the step whose training and held-out gains
        the report then leads with) are those of
        :func:`satcore._decisions.reporting.depth_report`, as are the keyword shorthands
        ``alpha=``, ``tolerance=``, ``rho=``, ``delta=``, ``t=``, ``error=``,
        ``detector_scale=``, ``optimizer=``, ``lr=``, ``steps=``.  ``stream_rms`` defaults to
        :meth:`stream_rms`, the statistics' own ``||z||_S`` (what ``satcore score`` reads).
        """
        return self.score(rtol).report(criteria, split=split, prop1=prop1, train=train, recipe=recipe,
                                       stream_rms=self.stream_rms() if stream_rms is None else stream_rms, **options)


def score(Q, Psi, *, name: str = UNNAMED, rtol: float = DEFAULT_RTOL, batch_size: int | None = None,
          n_folds: int = DEFAULT_FOLDS) -> CandidateScore:
    """Score one candidate from in-memory arrays: the frozen :class:`CandidateScore`.

    Runs the same streaming statistics a probe uses (with ``sum X_i^T X_i``),
    so ``score(Q, Psi).growth_value == growth_value(Q, Psi)``.  ``name``: the
    candidate's, in the score and in any refusal (default ``"candidate"``).  ``n_folds``:
    the folds kept for the per-candidate test (0: none); the test itself runs
    only when the score's ``fold_test`` is first read.
    """
    stats = CandidateStatistics.from_samples(Q, Psi, variance=True, batch_size=batch_size, n_folds=n_folds)
    return stats.score(name, rtol)


def stream_rms_from_meta(meta: dict) -> dict:
    """``||z||_S`` per candidate from a dump's or probe's ``meta["diagnostics"]`` (empty when absent)."""
    diagnostics = meta.get("diagnostics") if isinstance(meta, dict) else None
    if not isinstance(diagnostics, dict):
        return {}
    out = {}
    for name, d in diagnostics.items():
        value = d.get("stream_rms") if isinstance(d, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            out[name] = float(value)
    return out
