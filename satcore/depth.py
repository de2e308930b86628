"""Statistics over an ordered set of candidates and the depth-wide report."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from ._psd import DEFAULT_RTOL
from .certification import saturation_test
from .results import TRAINING_SPLIT_WARNING, DepthReport
from .statistics import CandidateStatistics
from .verdicts import DEFAULT_ALPHA, decide, stream_rms_from_meta

TRAINING_SPLIT_NAMES = ("train", "training", "trainset", "train_set")


def is_training_split(split: str | None) -> bool:
    """Whether the probe data's name says it is the training set (reports and probes then warn)."""
    return split is not None and split.lower() in TRAINING_SPLIT_NAMES


class DepthStatistics(OrderedDict):
    """Ordered mapping ``candidate name -> CandidateStatistics``, upstream first.

    Mergeable (candidate-wise, names and order must agree) and serialisable as
    ``{"<name>/<field>": array}``.
    """

    def merge(self, other: "DepthStatistics") -> "DepthStatistics":
        if list(self) != list(other):
            raise ValueError(f"candidate lists differ: {list(self)} vs {list(other)}")
        merged = DepthStatistics()
        for name in self:
            try:
                merged[name] = self[name].merge(other[name])
            except ValueError as exc:
                raise ValueError(f"candidate {name!r}: {exc}") from None
        return merged

    __add__ = merge

    def join(self, other: "DepthStatistics") -> "DepthStatistics":
        """The candidates of both, ``self``'s first: one model probed in groups of candidates (one pass
        each, over the same samples), whose statistics form one report.  Names must be disjoint."""
        shared = [name for name in other if name in self]
        if shared:
            raise ValueError(f"candidate(s) {shared} are in both: join takes disjoint candidates (merge adds samples)")
        return DepthStatistics(list(self.items()) + list(other.items()))

    def stream_rms(self, meta: dict | None = None) -> dict:
        """``||z||_S`` per candidate (:meth:`CandidateStatistics.stream_rms`), in candidate order.

        A candidate whose statistics hold no stream sums (a dump written before they existed)
        falls back on the value ``meta["diagnostics"][name]["stream_rms"]`` records, if any
        (:func:`satcore.verdicts.stream_rms_from_meta`); the sums come first, so a merge of
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
                raise ValueError(f"statistics for unknown candidate {name!r}")
            grouped[name][field] = value
        out = cls()
        for name in order:
            try:
                out[name] = CandidateStatistics.from_arrays(grouped[name])
            except ValueError as exc:
                raise ValueError(f"stats/{name}: {exc}") from None
        return out

    def report(
        self,
        *,
        split: str | None = None,
        alpha: float = DEFAULT_ALPHA,
        tolerance: float = 0.0,
        rho: float | None = None,
        stream_rms: dict | None = None,
        delta: float = 0.0,
        t: float | None = None,
        error: float | None = None,
        detector_scale: float | None = None,
        rtol: float = DEFAULT_RTOL,
        train: "DepthStatistics | None" = None,
        optimizer: str | None = None,
        lr: float | None = None,
        steps: int = 1,
    ) -> DepthReport:
        """Score every candidate, test each one and give the verdict (:func:`depth_report`).

        ``self`` is the probe split the tests read (independent of training).
        With ``train`` (the same candidates on the training split) and a step
        (``optimizer`` ``"sgd"``/``"adam"`` with ``lr`` and ``steps``, or
        ``"matched"`` with ``rho``), the report also carries
        :func:`satcore.predictors.predict_gains`: per candidate the predicted
        training gain of that step and its held-out gain on ``self`` with
        interval and ``P(decrease)``, which the table then leads with.
        """
        predictions = None
        if train is not None:
            from .predictors import predict_gains

            predictions = predict_gains(train, self, optimizer=optimizer or "sgd", lr=lr, steps=steps, rho=rho,
                                        stream_rms=stream_rms, alpha=alpha, rtol=rtol)
        report = depth_report(
            [s.score(name, rtol) for name, s in self.items()],
            split=split,
            alpha=alpha,
            tolerance=tolerance,
            rho=rho,
            stream_rms=stream_rms,
            delta=delta,
            t=t,
            error=error,
            detector_scale=detector_scale,
        )
        return report if predictions is None else replace(report, predictions=predictions)


def depth_report(scores, *, split=None, alpha=DEFAULT_ALPHA, tolerance=0.0, rho=None, stream_rms=None,
                 delta=0.0, t=None, error=None, detector_scale=None) -> DepthReport:
    """Depth-wide maxima (Theorem 1: ``V_depth = max_l V_l``), the fold tests and the verdicts.

    ``alpha``, ``tolerance``, ``rho`` and ``stream_rms`` are those of
    :func:`satcore.verdicts.decide`.  Proposition 1's separated test runs at
    ``t`` and/or ``error``; without either, at the error level ``alpha``.
    """
    scores = tuple(scores)
    if not scores:
        raise ValueError("no candidates")
    best = max(scores, key=lambda c: c.growth_value)
    best_ag = max(scores, key=lambda c: c.ag)
    warnings = []
    if is_training_split(split):
        warnings.append(TRAINING_SPLIT_WARNING)
    if split is None:
        warnings.append("probe split not stated: the tests assume a probe independent of training")
    warnings += [f"candidate {c.name!r}: feature rank = number of position vectors ({c.feature_rank}), so the "
                 "growth value equals AG by construction and says nothing about this candidate's family"
                 for c in scores if c.tangent_complete]
    tests, verdict = decide(scores, alpha=alpha, tolerance=tolerance, rho=rho, stream_rms=stream_rms)
    prop1 = None
    if all(c.n_samples >= 2 for c in scores):
        prop1 = saturation_test(
            [c.name for c in scores],
            [c.cross_gradient_norm for c in scores],
            [c.sigma_sq for c in scores],
            [c.n_samples for c in scores],
            delta=delta,
            t=t,
            error=alpha if error is None else error,  # Prop. 1's error level defaults to the tests' alpha
            detector_scale=detector_scale,
        )
    return DepthReport(
        candidates=scores,
        ag_max=best_ag.ag,
        growth_value_max=best.growth_value,
        argmax=best.name,
        ag_argmax=best_ag.name,
        split=split,
        prop1=prop1,
        warnings=tuple(warnings),
        tests=tests,
        verdict=verdict,
    )


def score(Q, Psi, *, name: str = "", rtol: float = DEFAULT_RTOL, batch_size: int | None = None):
    """Score one candidate from in-memory arrays: the frozen :class:`CandidateScore`.

    Runs the same streaming statistics a probe uses (with ``sum X_i^T X_i``),
    so ``score(Q, Psi).growth_value == growth_value(Q, Psi)``.
    """
    return CandidateStatistics.from_samples(Q, Psi, variance=True, batch_size=batch_size).score(name, rtol)
