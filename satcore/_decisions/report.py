"""The finished report: scores read under criteria, with tests, verdicts, predictions and the decision.

Its JSON names are those of docs/dump-format.md (Report JSON).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from .._scores.scores import CandidateScore
from .._shared.json_numbers import json_number, json_safe
from .criteria import Verdict

if TYPE_CHECKING:
    from .._formulas.certification import SaturationTest
    from .predictors import PredictedGains
    from .verdicts import CandidateTest, DepthVerdict

REPORT_SCHEMA = "satcore-report/2"


@dataclass(frozen=True)
class DepthReport:
    """Depth-wide report over ordered candidates (upstream first).

    ``growth_value_max`` is ``V_S,depth = max_l V_S,l`` (Theorem 1) and
    ``argmax`` names where that largest estimate is attained, whatever the
    tests say (it is not a recommendation: :attr:`best_candidate` is);
    ``ag_max`` is the paper's ``AG_max``.  ``tests`` holds each candidate's
    fold test and verdict (:mod:`satcore._decisions.verdicts`) and ``verdict`` the
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
        from .._rendering.table import render_report

        return render_report(self)

    @property
    def best_candidate(self) -> str:
        """The candidate the first-order tests point to: among the ``improvable`` ones the largest
        unbiased ``V^2``, else the candidate of largest unbiased ``V^2``
        (:attr:`DepthVerdict.best_candidate`); without tests, :attr:`argmax`.  The one "best candidate" the
        table, JSON, CSV and callbacks show."""
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
            out["prop1"] = {k: json_number(v) for k, v in self.prop1.to_dict().items()}
        if self.predictions is not None:
            out["predictions"] = json_safe(self.predictions.to_dict())
        if self.decision is not None:
            out["decision"] = self.decision.to_dict()
        return json_safe(out)  # every number: a tolerance or gain that overflowed to inf is null, not invalid JSON

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
        (:func:`satcore._shared.display.display_name`, uncut): a name from a file holding a newline, a
        carriage return or a terminal escape cannot break a row or reach the terminal."""
        import csv
        import io

        from .._shared.display import display_name

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

    def scalars(self, prefix: str = "satcore/", per_candidate: bool = True) -> dict[str, float]:
        """Numbers for a metrics logger (TensorBoard, a Trainer's logs), keys starting with ``prefix``.

        ``growth_value_max``, ``ag_max``, ``argmax_index`` (the upstream-first index of the
        candidate holding the growth maximum; loggers keep numbers, not names) and
        ``best_candidate_index`` (that of :attr:`best_candidate`), ``improvable`` and
        ``saturated`` (1/0: the depth-wide verdict), ``n_improvable``, and, with ``per_candidate``
        (six keys a candidate: a 24-layer model's 150 where the summary is 7), per candidate
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
        for c in self.candidates if per_candidate else ():
            for key in ("growth_value", "ag", "realizability", "noise_floor", "growth_noise_floor"):
                out[f"{prefix}{c.name}/{key}"] = getattr(c, key)
            if c.name in tests:
                out[f"{prefix}{c.name}/p_value_adjusted"] = tests[c.name].p_value_adjusted
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def _flatten(record: dict, parent: str = "") -> dict:
    out = {}
    for key, value in record.items():
        name = f"{parent}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out
