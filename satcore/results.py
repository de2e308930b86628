"""Frozen result objects: what a finished probe says, with the JSON names of docs/dump-format.md, Report JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING

from ._psd import DEFAULT_RTOL
from .criteria import Verdict
from .errors import InputError
from .folds import FoldSums, FoldTest

if TYPE_CHECKING:
    from .certification import SaturationTest
    from .predictors import PredictedGains
    from .verdicts import CandidateTest, DepthVerdict

REPORT_SCHEMA = "satcore-report/2"

TRAINING_SPLIT_WARNING = (
    "the probe split is the training set: the finite-sample test (Prop. 1) assumes an "
    "independent probe (Assumption 4, Remark 5); fixed-sample values remain exact"
)


def _json_number(x):
    """JSON has no NaN/Inf: map them to null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _json_safe(x):
    """:func:`_json_number` through nested dicts and lists."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return _json_number(x)


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
        """The fold test of ``H0: V_pop = 0`` in the growth value's metric (:mod:`satcore.folds`);
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
        out = {k: _json_number(getattr(self, k)) for k in self.__dataclass_fields__ if k != "fold_sums"}
        out["growth_noise_floor"] = _json_number(self.growth_noise_floor)
        out["n_folds"] = 0 if self.fold_test is None else self.fold_test.n_folds
        if self.fold_test_euclidean is not None:
            out["cross_gradient_norm_sq_unbiased"] = _json_number(self.fold_test_euclidean.unbiased)
        return out


@dataclass(frozen=True)
class DepthScores:
    """Scored candidates in depth order (upstream first): the step between statistics and decisions.

    ``candidates`` keep their fold tests once computed, so :meth:`report` under
    several :class:`~satcore.criteria.Criteria` scores only once.
    ``statistics`` (the :class:`~satcore.depth.DepthStatistics` scored, with
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
        """:func:`satcore.reporting.depth_report` of these scores (same arguments)."""
        from .reporting import depth_report  # the next step of the data flow, at call time

        return depth_report(self, criteria, **options)


@dataclass(frozen=True)
class DepthReport:
    """Depth-wide report over ordered candidates (upstream first).

    ``growth_value_max`` is ``V_S,depth = max_l V_S,l`` (Theorem 1) and
    ``argmax`` names where that largest estimate is attained, whatever the
    tests say (it is not a recommendation: :attr:`best_candidate` is);
    ``ag_max`` is the paper's ``AG_max``.  ``tests`` holds each candidate's
    fold test and verdict (:mod:`satcore.verdicts`) and ``verdict`` the
    depth-wide answer; ``prop1`` the distribution-free separated test of
    Proposition 1.  ``print(report)`` shows the table of ``satcore score``.
    """

    candidates: tuple[CandidateScore, ...]
    ag_max: float
    growth_value_max: float
    argmax: str
    ag_argmax: str
    split: str | None = None
    prop1: SaturationTest | None = None
    warnings: tuple[str, ...] = field(default=())
    tests: tuple[CandidateTest, ...] = ()
    verdict: DepthVerdict | None = None
    predictions: PredictedGains | None = None  # when a training split was given (DepthStatistics.report(train=))
    # the insertion decision a user acts on (its to_dict() goes to JSON "decision"), shown above the table
    decision: object | None = None

    def __str__(self) -> str:
        from .report_text import render_report

        return render_report(self)

    @property
    def best_candidate(self) -> str:
        """The candidate the first-order tests point to: among the ``improvable`` ones the largest
        unbiased ``V^2``, else the largest estimate (:attr:`DepthVerdict.best_candidate`); without
        tests, :attr:`argmax`.  The one "best candidate" the table, JSON, CSV and callbacks show."""
        return self.argmax if self.verdict is None else self.verdict.best_candidate

    def test(self, name: str) -> CandidateTest:
        """The fold test and verdict of candidate ``name``."""
        for t in self.tests:
            if t.name == name:
                return t
        raise KeyError(name)

    def __getitem__(self, name: str) -> CandidateScore:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict:
        tests = {t.name: t.to_dict() for t in self.tests}
        out = {
            "schema": REPORT_SCHEMA,
            "candidates": [{**c.to_dict(), **({"test": tests[c.name]} if c.name in tests else {})}
                           for c in self.candidates],
            "depth": {
                "ag_max": self.ag_max,
                "growth_value_max": self.growth_value_max,
                "argmax": self.argmax,
                "ag_argmax": self.ag_argmax,
            },
            "best_candidate": self.best_candidate,
            "split": self.split,
            "warnings": list(self.warnings),
        }
        if self.verdict is not None:
            out["verdict"] = self.verdict.to_dict()
        if self.prop1 is not None:
            out["prop1"] = {k: _json_number(v) for k, v in self.prop1.to_dict().items()}
        if self.predictions is not None:
            out["predictions"] = _json_safe(self.predictions.to_dict())
        if self.decision is not None:
            out["decision"] = self.decision.to_dict()
        return _json_safe(out)  # every number: a tolerance or gain that overflowed to inf is null, not invalid JSON

    def to_records(self) -> list[dict]:
        """One flat dict per candidate, upstream first, ``name`` first: the candidate's
        entry of :meth:`to_dict` (its scores and its ``test``) with a nested mapping's keys joined
        by ``.`` (pandas' ``json_normalize`` convention: ``test.verdict``), so that every value is a
        scalar."""
        return [{**_flatten(c), "best_candidate": c["name"] == self.best_candidate}
                for c in self.to_dict()["candidates"]]

    def to_pandas(self):
        """A ``pandas.DataFrame``, one row per candidate (upstream first) and one column per score,
        ``name`` first (WeightWatcher's layout: rows are layers, columns are metrics).

        pandas is optional: it is imported here, and its absence is one clear ``ImportError``.
        """
        try:
            import pandas
        except ImportError:
            raise ImportError("DepthReport.to_pandas needs pandas (pip install pandas)") from None
        records = self.to_records()
        columns = list(records[0]) if records else [f.name for f in fields(CandidateScore)]
        return pandas.DataFrame.from_records(records, columns=columns)

    def to_csv(self) -> str:
        """:meth:`to_records` as CSV text: a header line (``name`` first), then one line per candidate;
        a missing value (``None``) is an empty field.  Text is written as the table shows it
        (:func:`satcore._display.display_name`, uncut): a name from a file holding a newline, a
        carriage return or a terminal escape cannot break a row or reach the terminal."""
        import csv
        import io

        from ._display import display_name

        records = self.to_records()
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=[display_name(k, None) for k in records[0]], lineterminator="\n")
        writer.writeheader()
        writer.writerows({display_name(k, None): "" if v is None else display_name(v, None) if isinstance(v, str) else v
                          for k, v in r.items()} for r in records)
        return out.getvalue()

    def to_jsonl(self) -> str:
        """:meth:`to_records` as JSON Lines: one JSON object per candidate, upstream first."""
        import json

        return "".join(json.dumps(r, allow_nan=False) + "\n" for r in self.to_records())

    def scalars(self, prefix: str = "satcore/") -> dict[str, float]:
        """Numbers for a metrics logger (TensorBoard, a Trainer's logs), keys starting with ``prefix``.

        ``growth_value_max``, ``ag_max``, ``argmax_index`` (the upstream-first index of the
        candidate holding the growth maximum; loggers keep numbers, not names) and
        ``best_candidate_index`` (that of :attr:`best_candidate`), ``improvable`` and
        ``saturated`` (1/0: the depth-wide verdict), ``n_improvable``, and per candidate
        ``<name>/growth_value``, ``<name>/ag``, ``<name>/realizability``, ``<name>/noise_floor``
        (``||C||_F`` units), ``<name>/growth_noise_floor`` (growth-value units) and
        ``<name>/p_value_adjusted``.  Values that are not finite are left out.
        """
        out = {
            f"{prefix}growth_value_max": self.growth_value_max,
            f"{prefix}ag_max": self.ag_max,
            f"{prefix}argmax_index": float([c.name for c in self.candidates].index(self.argmax)),
            f"{prefix}best_candidate_index": float([c.name for c in self.candidates].index(self.best_candidate)),
        }
        if self.verdict is not None:
            out[f"{prefix}improvable"] = float(self.verdict.verdict == Verdict.IMPROVABLE)
            out[f"{prefix}saturated"] = float(self.verdict.verdict == Verdict.SATURATED)
            out[f"{prefix}n_improvable"] = float(sum(t.verdict == Verdict.IMPROVABLE for t in self.tests))
        tests = {t.name: t for t in self.tests}
        for c in self.candidates:
            for key in ("growth_value", "ag", "realizability", "noise_floor", "growth_noise_floor"):
                out[f"{prefix}{c.name}/{key}"] = getattr(c, key)
            if c.name in tests:
                out[f"{prefix}{c.name}/p_value_adjusted"] = tests[c.name].p_value_adjusted
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


@dataclass(frozen=True)
class StreamDiagnostics:
    """Residual-stream norms of one candidate, from its stream sums (:mod:`satcore.statistics`).

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


def _flatten(record: dict, parent: str = "") -> dict:
    out = {}
    for key, value in record.items():
        name = f"{parent}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


SCHEMA_FILES = {"report": "report.schema.json", "sweep": "sweep.schema.json", "dump-meta": "dump-meta.schema.json"}


def json_schema(name: str) -> dict:
    """The JSON Schema (draft 2020-12) shipped with satcore for ``"report"`` (``satcore-report/1``),
    ``"sweep"`` (``satcore-sweep/2``) or ``"dump-meta"`` (a dump's ``meta`` member)."""
    import json
    from importlib.resources import files

    if name not in SCHEMA_FILES:
        raise InputError(f"no schema {name!r}; schemas are {sorted(SCHEMA_FILES)}")
    return json.loads(files("satcore").joinpath("schemas", SCHEMA_FILES[name]).read_text())
