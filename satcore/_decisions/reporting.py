"""Scores to a report: the depth-wide maxima, the fold tests' verdicts, Proposition 1 and predicted gains.

The last step of the data flow before display (docs/architecture.md):
statistics (:mod:`satcore._statistics.depth`) are scored once
(:class:`~satcore._scores.scores.DepthScores`), and :func:`depth_report` reads the
scores under a :class:`~satcore._decisions.criteria.Criteria` (the verdicts of
:mod:`satcore._decisions.verdicts`), :class:`~satcore._decisions.criteria.Prop1Options`
(:mod:`satcore._formulas.certification`) and, with a training split, a
:class:`~satcore._decisions.recipe.Recipe` (:mod:`satcore._decisions.predictors`).  The fold tests
are computed when a report first needs them and kept by the scores, so reading
the same scores at another ``alpha`` or tolerance does not score again.
"""

from __future__ import annotations

from dataclasses import replace

from .._formulas.certification import saturation_test
from .criteria import Criteria, Prop1Options, split_options
from .._shared.errors import InputError
from .recipe import Recipe
from .._scores import scores as _scores
from .._scores.scores import DepthScores
from .._shared.splits import TRAINING_SPLIT_WARNING, is_training_split
from .report import DepthReport
from .verdicts import decide

def depth_report(scores, criteria: Criteria | None = None, *, split: str | None = None,
                 prop1: Prop1Options | None = None, stream_rms: dict | None = None, train=None,
                 recipe: Recipe | None = None, **options) -> DepthReport:
    """Depth-wide maxima (Theorem 1: ``V_depth = max_l V_l``), the fold tests and the verdicts.

    Parameters
    ----------
    scores : DepthScores or sequence of CandidateScore
        Depth order (upstream first).
    criteria : Criteria, optional
        ``alpha``, ``tolerance`` and ``rho`` of :func:`satcore._decisions.verdicts.decide`
        (default ``Criteria()``: alpha 0.05, no tolerance).
    split : str, optional
        The split the probe came from; a training split or none stated adds a warning.
    prop1 : Prop1Options, optional
        Proposition 1's separated test at ``t`` and/or ``error``; without
        either, at the error level ``criteria.alpha``.
    stream_rms : dict, optional
        ``||z||_S`` per candidate, for a tolerance in loss units (``criteria.rho``).
    train : DepthStatistics, optional
        The same candidates on the training split: the report then carries
        :func:`satcore._decisions.predictors.predict_gains` of ``recipe``'s step (or of the
        gradient-matched block of relative size ``criteria.rho`` without a
        recipe); needs ``scores`` from :meth:`DepthStatistics.score` (the
        held-out statistics).
    recipe : Recipe, optional
        The predicted step: ``recipe.steps`` full-batch steps of ``recipe.optimizer``
        at ``recipe.lr`` (its batch size plays no part).
    **options
        Shorthand for the objects: ``alpha``, ``tolerance``, ``rho`` (criteria),
        ``delta``, ``t``, ``error``, ``detector_scale`` (prop1), ``optimizer``,
        ``lr``, ``steps`` (recipe; ``optimizer="matched"`` for the matched block).
        Each group is given either as its object or as keywords, not both.
    """
    criteria, prop1, recipe = _objects(criteria, prop1, recipe, train, options)
    scores = scores if isinstance(scores, DepthScores) else DepthScores(tuple(scores))
    candidates = scores.candidates
    if not candidates:
        raise InputError("no candidates")
    best = max(candidates, key=lambda c: c.growth_value)
    best_ag = max(candidates, key=lambda c: c.ag)
    warnings = []
    if is_training_split(split):
        warnings.append(TRAINING_SPLIT_WARNING)
    if split is None:
        warnings.append("probe split not stated: the tests assume a probe independent of training")
    warnings += [f"candidate {c.name!r}: feature rank = number of position vectors ({c.feature_rank}), so the "
                 "growth value equals AG by construction and says nothing about this candidate's family"
                 for c in candidates if c.tangent_complete]
    tests, verdict = decide(candidates, criteria, stream_rms=stream_rms)
    prop1_test = None
    if all(c.n_samples >= 2 for c in candidates):
        prop1_test = saturation_test(
            [c.name for c in candidates],
            [c.cross_gradient_norm for c in candidates],
            [c.sigma_sq for c in candidates],
            [c.n_samples for c in candidates],
            delta=prop1.delta,
            t=prop1.t,
            error=criteria.alpha if prop1.error is None else prop1.error,  # Prop. 1's level: the tests' alpha
            detector_scale=prop1.detector_scale,
        )
    report = DepthReport(
        candidates=candidates,
        ag_max=best_ag.ag,
        growth_value_max=best.growth_value,
        argmax=best.name,
        ag_argmax=best_ag.name,
        split=split,
        prop1=prop1_test,
        warnings=tuple(warnings),
        tests=tests,
        verdict=verdict,
    )
    if train is None:
        return report
    if scores.statistics is None:
        raise InputError("predicted gains need the held-out statistics: report from DepthStatistics.score()")
    from .predictors import predict_gains

    predictions = predict_gains(train, scores.statistics, recipe, criteria=criteria, stream_rms=stream_rms,
                                rtol=scores.rtol)
    return replace(report, predictions=predictions)


def _objects(criteria, prop1, recipe, train, options):
    """The option objects of a report call, made from the keyword shorthand where it was used."""
    c_fields, p_fields, step = split_options(options)
    for given, group, name in ((criteria, c_fields, "criteria"), (prop1, p_fields, "prop1"),
                               (recipe, step, "recipe")):
        if given is not None and group:
            raise TypeError(f"give {name} or its keywords ({', '.join(sorted(group))}), not both")
    criteria = criteria if criteria is not None else Criteria(**c_fields)
    prop1 = prop1 if prop1 is not None else Prop1Options(**p_fields)
    if step and train is None:
        raise TypeError(f"{', '.join(sorted(step))}: the predicted step needs train= (the training split)")
    if step and step.get("optimizer", "sgd") != "matched":  # no keywords and no recipe: the matched block
        recipe = _shorthand_recipe(train, **step)
    return criteria, prop1, recipe


def _shorthand_recipe(train, optimizer: str = "sgd", lr: float | None = None, steps: int = 1) -> Recipe:
    """``optimizer``/``lr``/``steps`` as a :class:`Recipe` of full-batch steps on the training split."""
    if lr is None:
        raise InputError(f"optimizer {optimizer!r} needs lr > 0 and steps >= 1")
    full_batch = max([s.n_samples for s in train.values()], default=1) or 1
    return Recipe(optimizer, lr, steps, full_batch)


__all__ = ["depth_report"]


_scores._NEXT_LAYER["depth_report"] = depth_report
