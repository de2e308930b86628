"""Scores of ``studies/decision_validity.py``'s recorded runs: calibration fitted leave one model set out, the
decision and its baselines per target, the depth sweeps, and the shipped calibration (``fit_and_write``).

Everything here reads the raw JSON rows and calls the core functions ``decide`` calls
(:mod:`satcore._decisions.trials`), so the tables are regenerated from data.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
from scipy.stats import rankdata, spearmanr

from satcore import Recipe
from satcore._decisions.calibration import CALIBRATION_FORMAT
from satcore._decisions.trials import (Calibration, CandidateDecision, TrialCurve, choose, error_scale, extrapolate,
                              halving_plan, trial_checkpoints, trial_plan, verified_candidate)

LEVELS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8,
          0.85, 0.9, 0.95, 0.975, 0.99)
TREND_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)
RELATIVE_SCALES = (0.0, 0.1, 0.25, 0.5, 1.0)
TREND_SCALES = (0.0, 0.1, 0.25, 0.5, 1.0)
P_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
TOLERANCES = (0.0, 0.001, 0.003, 0.01)
LONG = (300, 1000)
BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


TRIAL_SEEDS_FILE = "-trialseed"  # <part>-trialseed<seeds>.json: more trial seeds of <part>.json's models


SHIPPED_SCHEDULE = "even"  # decide's default schedule; each schedule's calibration is fitted on its own trials
OPTIMIZER_FAMILIES = ("adam", "sgd")


def optimizer_family(optimizer: str) -> str:
    """``"sgd"`` for SGD, ``"adam"`` for Adam and AdamW (a recipe's optimizer, or a recorded column's first word)."""
    return "sgd" if optimizer == "sgd" else "adam"


def schedule_points(n: int, steps: int, max_trials: int, every_count: bool = True) -> set:
    """Every checkpoint the trial schedules scored here read at ``steps`` (``n`` candidates): the even plan
    with 1 to ``max_trials`` trials (``every_count=False``: with ``max_trials`` only, as ``decide`` runs it),
    and successive halving's two stages (:func:`satcore._decisions.trials.halving_plan`)."""
    recipe = Recipe("sgd", 1.0, steps, 1)
    points = set()
    for m in range(1, max_trials + 1) if every_count else (max_trials,):
        points |= set(trial_plan(n, recipe, m)[2])
    _, first, _, second = halving_plan(n, recipe, max_trials)
    return points | set(trial_checkpoints(first)) | set(trial_checkpoints(second))


# a re-trained model is the recorded one when its base losses and screen match to float64 round-off: the same
# code, seeds and single thread reproduce the float32 training bit for bit, and the float64 statistics differ only
# by a summation order (measured on the 12 bench models: at most 2e-16 of the largest screen value of a length, 5e-15
# of a small value itself, base losses identical); 1e-12 leaves room for sums of thousands of terms and is still
# 1e5 times below a float32 round-off of any weight, which moves them by 1e-7 or more
SAME_MODEL_RTOL = 1e-12


def model_deviation(stored: dict, new: dict) -> tuple[float, str]:
    """The largest relative difference between ``new`` (a model row re-recorded for more trial seeds) and the
    ``stored`` one, and where: a base loss relative to itself, a screen value relative to the largest of its
    length's candidates (a value near zero is a cancellation); ``inf`` where candidates, keys or ``None`` differ."""
    if new["candidates"] != stored["candidates"]:
        return math.inf, f"candidates {new['candidates']} != {stored['candidates']}"
    worst = (0.0, "")
    for key, value in new["base"].items():
        if key not in stored["base"]:
            return math.inf, f"base {key}: absent from the recorded model"
        worst = max(worst, (abs(value - stored["base"][key]) / max(abs(value), abs(stored["base"][key]), 1e-300),
                            f"base {key}: {value!r} vs recorded {stored['base'][key]!r}"))
    for key, values in new["screen"].items():
        recorded = stored["screen"].get(key, {})
        scale = max([abs(v) for v in (*values.values(), *recorded.values()) if v is not None] + [1e-300])
        for c, value in values.items():
            was = recorded.get(c, "absent")
            if value is None or was is None or was == "absent":
                if value != was:
                    return math.inf, f"screen {key} {c}: {value} vs recorded {was}"
                continue
            worst = max(worst, (abs(value - was) / scale, f"screen {key} {c}: {value!r} vs recorded {was!r}"))
    return worst


def model_mismatch(stored: dict, new: dict) -> str | None:
    """Why ``new`` is not the ``stored`` model (:func:`model_deviation` beyond ``SAME_MODEL_RTOL``), or ``None``."""
    deviation, where = model_deviation(stored, new)
    return None if deviation <= SAME_MODEL_RTOL else f"{where}, relative {deviation:.1e} > {SAME_MODEL_RTOL:.0e}"


def _merge_trial_seeds(models: list, path: Path, data: dict) -> None:
    """Add the runs of ``path`` (``<part>-trialseed<seeds>.json``) to its part's models, matched by model tag."""
    part = path.stem.split(TRIAL_SEEDS_FILE)[0] + ".json"
    recorded = {m["model"]: m for m in models if m.get("file") == part}
    for new in data["models"]:
        stored = recorded.get(new["model"])
        if stored is None:
            raise ValueError(f"{path.name}: model {new['model']!r} is not in {part}")
        if (why := model_mismatch(stored, new)) is not None:
            raise ValueError(f"{path.name}: model {new['model']!r} is not the one in {part} ({why})")
        have = {(r["candidate"], r["column"], r["seed"]): r["steps"] for r in stored["runs"]}
        for run in new["runs"]:
            key = (run["candidate"], run["column"], run["seed"])
            if key in have:
                raise ValueError(f"{path.name}: model {new['model']!r} run {key} is in {part} already")
            first = (run["candidate"], run["column"], min(s for c, col, s in have if c == key[0] and col == key[1]))
            if run["steps"] != have[first]:
                raise ValueError(f"{path.name}: model {new['model']!r} run {key} has checkpoints {run['steps']}, "
                                 f"{part} {have[first]}")
        stored["runs"] = stored["runs"] + new["runs"]


def load(out: Path) -> tuple[list, list, dict]:
    """Models, sweeps and per-file metadata of every recorded part in ``out``; ``<part>-trialseed<seeds>.json``
    files add their runs to ``<part>.json``'s models (only whole models are in a file: it is written after each)."""
    models, sweeps, meta = [], [], {}
    paths = sorted(out.glob("*.json"))
    extra = [p for p in paths if TRIAL_SEEDS_FILE in p.stem]
    for path in [p for p in paths if p not in extra] + extra:
        data = json.loads(path.read_text())
        if path in extra:
            _merge_trial_seeds(models, path, data)
        else:
            models += [{**m, "file": path.name} for m in data["models"]]
            sweeps += data["sweeps"]
        meta[path.stem] = {"seconds": data.get("seconds"), "written": data.get("written"),
                           "columns": data["columns"], "seeds": data["seeds"]}
    return models, sweeps, meta


def _at(run: dict, split: str, step: int) -> float:
    return run[split]["change"][run["steps"].index(step)]


def _curve(run: dict, T: int) -> TrialCurve:
    # a compressed trial (--compressed) is recorded at T/2 and T only: its trend d(T) - d(T/2) is the same
    points = [p for p in trial_checkpoints(T) if p in run["steps"]]
    return TrialCurve(points, [_at(run, "heldout", p) for p in points], [_at(run, "train", p) for p in points],
                      run["heldout"]["se"][run["steps"].index(T)])


def _train_se(run: dict | None, curve: TrialCurve | None) -> float | None:
    """The paired standard error of a trial's training change at its last checkpoint (None without a trial)."""
    return None if curve is None else run["train"]["se"][run["steps"].index(curve.steps[-1])]


def _trial_schedule(schedule: str, names: list, screen: dict, runs: dict, steps: int) -> tuple[dict, int]:
    """``({candidate: (curve or None, may_choose)}, block-steps)`` of one decision under ``schedule``, as
    ``decide`` runs it with ``max_trials=4``: ``"halving"`` (the screen's first 4, successive halving: the
    candidates its first stage drops keep their ``T1`` curve and are never chosen), ``"even"`` (each of them
    ``steps // n`` steps), ``"trials-m"`` (the screen's first ``m``, ``steps // m`` steps each).  Candidates
    without a trial are priced by the screen (no curve)."""
    recipe = Recipe("sgd", 1.0, steps, 1)
    m = int(schedule.split("-")[1]) if schedule.startswith("trials-") else 4
    verified, T, _ = trial_plan(len(names), recipe, m)
    # the screen's order, as decide orders it; a candidate the screen could not score goes last
    trialled = sorted(names, key=lambda c: (screen[c] is None, screen[c] or 0.0))[:verified]
    rows = dict.fromkeys(names, (None, False))
    if schedule == "halving":
        _, first, finalists, second = halving_plan(len(trialled), recipe, len(trialled))
        kept = sorted(trialled, key=lambda c: _at(runs[c], "heldout", first))[:finalists]
        rows.update({c: (_curve(runs[c], second), True) if c in kept else (_curve(runs[c], first), False)
                     for c in trialled})
        return rows, verified * first + finalists * (second - first)
    rows.update({c: (_curve(runs[c], T), True) for c in trialled})
    return rows, verified * T


COMPRESSED_SGD = "even, SGD trials compressed"  # a schedule of the rules table: the even plan, SGD trials at lr*S/T


def attach_compressed(models: list, folder: Path) -> list:
    """``models`` with their ``--compressed`` runs (``folder``) attached as ``model["compressed"]``, keyed by
    ``(recipe steps, column, candidate, seed)``, for the :data:`COMPRESSED_SGD` schedule."""
    if not folder.is_dir():
        return models
    runs = {m["model"]: {(r["steps_recipe"], r["column"], r["candidate"], r["seed"]): r for r in m["runs"]}
            for m in load(folder)[0]}
    return [{**m, "compressed": runs[m["model"]]} if m["model"] in runs else m for m in models]


SENSITIVITY_FOLDER = "decision_validity_sensitivity"  # studies/decision_validity.py --sensitivity, beside ``out``


def attach_sensitivity(models: list, folder: Path) -> list:
    """``models`` with the sensitivity baseline's values (``--sensitivity`` recordings in ``folder``) attached as
    ``model["sensitivity"]`` (per candidate), where that model was recorded: refused unless the re-trained model's
    base losses are the recorded ones (:data:`SAME_MODEL_RTOL`)."""
    if not folder.is_dir():
        return models
    recorded = {m["model"]: m for m in load(folder)[0]}
    out = []
    for m in models:
        new = recorded.get(m["model"])
        if new is None:
            out.append(m)
            continue
        deviation = max(abs(new["base"][k] - m["base"][k]) / max(abs(m["base"][k]), 1e-300) for k in new["base"])
        if deviation > SAME_MODEL_RTOL or new["candidates"] != m["candidates"]:
            raise SystemExit(f"{folder.name}: model {m['model']!r} is not the recorded one (base losses differ by "
                             f"{deviation:.1e} relative, candidates {new['candidates']} against {m['candidates']})")
        out.append({**m, "sensitivity": new["sensitivity"]})
    return out


def instances(models: list, schedule: str = SHIPPED_SCHEDULE, heldout: str = "heldout") -> list[dict]:
    """One decision per (model, recipe column, length, trial seed): every candidate's trial curve (that seed's
    prefix, read as ``schedule`` reads it, :func:`_trial_schedule`), its target (the other seeds' mean realized
    test change at the length) and seed spread.  ``heldout``: the recorded split the decision reads as its
    held-out data (``"heldout_large"``: the ``--large-heldout`` recording's split 4 times the bench's)."""
    out = []
    for m in models:
        runs = {(r["candidate"], r["column"], r["seed"]): {**r, "heldout": r[heldout]} for r in m["runs"]}
        columns = sorted({r["column"] for r in m["runs"]})
        seeds = sorted({r["seed"] for r in m["runs"]})
        for column in columns:
            longest = max(runs[(m["candidates"][0], column, seeds[0])]["steps"])
            for steps in (30, 300, 1000):
                if steps > longest:
                    continue
                screen = m["screen"][f"{column}/{steps}"]
                for a in seeds:
                    read = {c: runs[(c, column, a)] for c in m["candidates"]}
                    if schedule == COMPRESSED_SGD and column.startswith("sgd") and steps in LONG:
                        # the SGD trials read from the time-compressed runs; targets from the recipe's own runs
                        read = {c: m["compressed"][(steps, column.removesuffix("_1000"), c, a)]
                                for c in m["candidates"]}
                        read = {c: {**r, "heldout": r[heldout]} for c, r in read.items()}
                    trials, cost = _trial_schedule("even" if schedule == COMPRESSED_SGD else schedule,
                                                   m["candidates"], screen, read, steps)
                    rows = []
                    for c in m["candidates"]:
                        run = runs[(c, column, a)]
                        others = [_at(runs[(c, column, b)], "test", steps) for b in seeds if b != a]
                        every = [_at(runs[(c, column, b)], "test", steps) for b in seeds]
                        train_others = [_at(runs[(c, column, b)], "train", steps) for b in seeds if b != a]
                        # the target's test-sample noise: the other seeds' paired test standard errors, averaged
                        test_se = [runs[(c, column, b)]["test"]["se"][runs[(c, column, b)]["steps"].index(steps)]
                                   for b in seeds if b != a]
                        rows.append({"candidate": c, "curve": trials[c][0], "may_choose": trials[c][1],
                                     "train_se": _train_se(read[c], trials[c][0]),
                                     "target": float(np.mean(others)), "own": _at(run, "test", steps),
                                     "own_heldout": _at(run, "heldout", steps),
                                     "mean": float(np.mean(every)), "spread": float(np.ptp(every)),
                                     "seed_sd": float(np.std(every, ddof=1)) if len(every) > 1 else math.inf,
                                     "train_target": float(np.mean(train_others)), "screen": screen[c],
                                     "target_se": float(np.mean(test_se)) if test_se else math.inf,
                                     **({"sensitivity": m["sensitivity"][c]} if "sensitivity" in m else {})})
                    out.append({"model": m["model"], "set": m["set"], "column": column, "steps": steps, "seed": a,
                                "optimizer_family": optimizer_family(column.split("_")[0]),
                                "cost": cost, "base_heldout": m["base"][heldout], "base_test": m["base"]["test"],
                                "base_train": m["base"]["train"],
                                "rows": rows,
                                # --large-heldout recordings: the candidates' paired standard errors per checkpoint
                                "paired_se": m.get("paired_se", {}).get(f"{column}/{a}/{heldout}"),
                                "pair_steps": runs[(m["candidates"][0], column, a)]["steps"]})
    return out


# -- calibration -----------------------------------------------------------------------------------------
def _residuals(insts, trend_weight, relative_scale, trend_scale):
    z = []
    for inst in insts:
        for r in _trialled(inst):
            point = extrapolate(r["curve"], inst["steps"], trend_weight)
            scale = error_scale(r["curve"], inst["steps"], point, relative_scale, trend_scale)
            if scale > 0:
                z.append((r["target"] - point) / scale)
    return np.array(z)


def _trialled(inst) -> list:
    return [r for r in inst["rows"] if r["curve"] is not None]


def _decide(inst, calibration):
    """The decision :func:`satcore._decisions.trials.choose` makes on ``inst``: a row without a curve is priced by the
    screen and a row that may not be chosen (dropped by a schedule's first stage) is not verified, as
    ``decide`` builds its candidates."""
    recipe = Recipe("sgd", 1.0, inst["steps"], 1)
    cands = []
    for r in inst["rows"]:
        if r["curve"] is None:  # priced by the screen alone (unscored: no change), not verified; never chosen
            v = 0.0 if r["screen"] is None else r["screen"]
            cands.append(CandidateDecision.screen_only(r["candidate"], v, v))
            continue
        c = verified_candidate(r["candidate"], r["curve"], inst["steps"], calibration, r["screen"])
        cands.append(c if r["may_choose"] else dataclasses.replace(c, eliminated=True))
    d = choose(cands, recipe, inst["base_heldout"], inst["base_train"], inst["cost"], calibration)
    if d.runner_up is None or not inst.get("paired_se"):
        return d
    # the margin's standard error paired over the held-out samples, at the checkpoint both trials end on
    pairs, end = inst["paired_se"], d.candidates[d.choice].trial.steps[-1]
    se = pairs.get(f"{d.choice}|{d.runner_up}") or pairs[f"{d.runner_up}|{d.choice}"]
    return dataclasses.replace(d, margin_se=se[inst["pair_steps"].index(end)])


def fit(insts, source: str, trend_by: str = "error", lengths: tuple = LONG, error_insts=()) -> Calibration:
    """The calibration fitted on the decisions of ``insts`` whose recipe length is in ``lengths``: the trend
    weight (``trend_by="error"``: the least relative absolute error of the point prediction; ``"gain"``: the
    largest mean realized gain of the decisions fitted at it), then the error scale (``gamma``, ``c``) by Brier
    score, the residual quantiles and logistic of the fitted pair, the threshold and the stop tolerance's
    generalization gap fraction (on :data:`TOLERANCES`; the held-out loss fraction, a user's, 0) by the
    decisions' mean realized gain, ties to the lower threshold and fraction.  ``error_insts``: more decisions pooled with ``insts`` for the error model alone
    (``gamma``, ``c``, quantiles, logistic): the same models' trials read on a larger held-out split, so that
    the error model holds where the held-out data, and with it the paired standard error, differs in size.

    ``"error"`` on the long recipes ships: fitted on the 30-step recipes too (near the first-order regime,
    where trials and targets behave otherwise), every held-out score of the long recipes was as good or worse
    (``variants``, docs/predictive-validity.md)."""
    insts = [i for i in insts if i["steps"] in lengths]
    error_insts = [i for i in error_insts if i["steps"] in lengths]
    if trend_by == "error":
        def abs_error(w):
            return sum(abs(r["target"] - extrapolate(r["curve"], i["steps"], w)) / i["base_test"]
                       for i in insts for r in _trialled(i))

        return _fit_at_trend_weight(insts, source, min(TREND_WEIGHTS, key=abs_error), error_insts)
    best = None
    for trend_weight in TREND_WEIGHTS:
        cal = _fit_at_trend_weight(insts, source, trend_weight, error_insts)
        gain = _mean_decision_gain(insts, cal)
        if best is None or gain > best[0]:
            best = (gain, cal)
    return best[1]


def _fit_at_trend_weight(insts, source: str, trend_weight: float, error_insts=()) -> Calibration:
    pooled = list(insts) + list(error_insts)
    best = None
    for gamma in RELATIVE_SCALES:
        for c_trend in TREND_SCALES:
            z = _residuals(pooled, trend_weight, gamma, c_trend)
            if gamma == 0 and c_trend == 0 and not all(math.isfinite(v) for v in z):
                continue
            cal = Calibration(trend_weight, gamma, LEVELS, tuple(np.quantile(z, LEVELS)), 0.5, 0.0, source, c_trend)
            a, b = _logistic(pooled, cal)
            cal = Calibration(**{**cal.to_dict(), "logit_intercept": a, "logit_slope": b})
            brier = np.mean([(c.p_decrease - float(r["target"] < 0)) ** 2  # over the rows with a probability
                             for i in pooled for r, c in zip(i["rows"], _decide(i, cal).candidates.values())
                             if c.p_decrease is not None])
            if best is None or brier < best[0]:
                best = (brier, cal)
    cal = best[1]
    scored = []
    for p in P_THRESHOLDS:
        for fraction in TOLERANCES:
            trial = dataclasses.replace(cal, p_threshold=p, generalization_gap_fraction=fraction)
            scored.append((_mean_decision_gain(insts, trial), -p, -fraction, trial))
    return max(scored, key=lambda s: s[:3])[3]


def _logistic(insts, cal) -> tuple[float, float]:
    """``(a, b)`` of ``P(decrease) = 1 / (1 + exp(a + b t))``, ``t = point / scale``, by maximum likelihood."""
    from scipy.optimize import minimize

    t, y = [], []
    for inst in insts:
        for r in _trialled(inst):
            point = extrapolate(r["curve"], inst["steps"], cal.trend_weight)
            scale = error_scale(r["curve"], inst["steps"], point, cal.relative_scale, cal.trend_scale)
            if scale > 0:
                t.append(np.clip(point / scale, -50, 50))
                y.append(float(r["target"] < 0))
    t, y = np.array(t), np.array(y)

    def nll(ab):
        x = ab[0] + ab[1] * t
        # -log p(y): p(decrease) = sigmoid(-x)
        return float(np.sum(np.logaddexp(0, x) * y + np.logaddexp(0, -x) * (1 - y)))

    a, b = minimize(nll, np.array([0.0, 1.0]), method="Nelder-Mead").x
    return float(a), float(b)


def _mean_decision_gain(insts, calibration, decider=_decide) -> float:
    """Mean realized test decrease of the decisions, relative to the test loss (0 where they stop)."""
    gains = []
    for inst in insts:
        d = decider(inst, calibration)
        target = {r["candidate"]: r["target"] for r in inst["rows"]}
        gains.append(0.0 if d.choice is None else -target[d.choice] / inst["base_test"])
    return float(np.mean(gains))


def lomo_calibrations(insts, error_insts=()) -> dict:
    """Per model set, the calibration fitted on the other sets (their ``error_insts`` too, :func:`fit`)."""
    sets = sorted({i["set"] for i in insts})
    return {s: fit([i for i in insts if i["set"] != s], f"bench sets other than {s}",
                   error_insts=[i for i in error_insts if i["set"] != s]) for s in sets}


LARGE_HELDOUT = 4  # studies/decision_validity.py --large-heldout's default factor: the error model's second size


def large_heldout_folder(out: Path, factor: int = LARGE_HELDOUT) -> Path:
    """Where ``--large-heldout factor`` records the parts of the folder ``out`` (the bench's or the transfer
    sets'), beside it."""
    name = f"{out.name}_large_heldout"
    return out.parent / (name if factor == LARGE_HELDOUT else f"{name}_x{factor}")


def larger_heldout(out: Path, schedule: str = SHIPPED_SCHEDULE, factor: int = LARGE_HELDOUT) -> list[dict]:
    """The decisions of the ``--large-heldout factor`` recording beside ``out`` (the default factor: the error
    model's second size, :func:`fit`), read on its larger held-out split; none where it is not recorded (for
    :data:`COMPRESSED_SGD`, nor where the compressed SGD trials were not read on that split)."""
    large = large_heldout_folder(out, factor)
    if not large.is_dir():
        return []
    models = load(large)[0]
    if schedule == COMPRESSED_SGD:
        models = attach_compressed(models, large_heldout_folder(out.parent / COMPRESSED_FOLDER, factor))
        if not all("compressed" in m for m in models):
            return []
    return instances(models, schedule, "heldout_large")


# -- scores -------------------------------------------------------------------------------------------------
def _spearman(x, y):
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


SEED_CEILING = "trial seed trained in full (seed ceiling)"
HELDOUT_CEILING = "trial seed trained in full, read on the held-out split (held-out ceiling)"
SENSITIVITY = "sensitivity (SensLI: ||C||^2 of a zero virtual layer)"
METHODS = ("decide", "short trial alone", "first-order ranking", SENSITIVITY, "every block helps", "random candidate",
           "head / end of stack", HELDOUT_CEILING, SEED_CEILING, "full-training oracle")


def _predictions(inst, method, calibration, decider=_decide):
    """``(predicted changes per candidate or None, p_decrease per candidate or None, pick, decision choice)``;
    ``decider``: how ``decide`` decides (:func:`_decide`, or a stop rule tried, :data:`STOP_RULES`)."""
    rows, names = inst["rows"], [r["candidate"] for r in inst["rows"]]
    # the pick: the lowest prediction among the candidates the decision may choose (trialled, not eliminated)
    eligible = [k for k, r in enumerate(rows) if r["curve"] is not None and r["may_choose"]]

    def pick_of(pred):
        return names[min(eligible, key=lambda k: pred[k])]

    if method == "decide":
        d = decider(inst, calibration)
        cands = d.candidates
        pred = [cands[n].predicted_heldout_change for n in names]
        return pred, [cands[n].p_decrease for n in names], pick_of(pred), d.choice
    if method == "short trial alone":
        pred = [r["screen"] if r["curve"] is None else r["curve"].heldout_change[-1] for r in rows]
        p = [float(v < 0) if r["curve"] is None else
             0.5 * math.erfc(v / max(r["curve"].heldout_se, 1e-12) / math.sqrt(2)) for v, r in zip(pred, rows)]
        pick = pick_of(pred)
        return pred, p, pick, pick if pred[names.index(pick)] < 0 else None
    if method == "first-order ranking":
        pred = [r["screen"] for r in rows]
        pick = names[int(np.argmin(pred))]
        return pred, None, pick, pick if min(pred) < 0 else None
    if method == SENSITIVITY:
        # inserts where the sensitivity is largest, whatever the recipe, and never stops: every layer it ranks has a
        # sensitivity >= 0, read as a predicted decrease of that size
        pred = [-r["sensitivity"] for r in rows]
        pick = names[int(np.argmin(pred))]
        return pred, None, pick, pick
    if method == "every block helps":
        return [-1.0] * len(rows), [1.0] * len(rows), None, "random"
    if method == "random candidate":
        return None, None, None, "random"
    if method == "head / end of stack":
        return None, None, names[-1], names[-1]
    if method == SEED_CEILING:
        # the trial seed's own realized change at the recipe's full length: the most any predictor reading that
        # seed's training can know of the other seeds' outcome (their minibatch order is what differs)
        pred = [r["own"] for r in rows]
        pick = names[int(np.argmin(pred))]
        return pred, None, pick, pick if min(pred) < 0 else None
    if method == HELDOUT_CEILING:
        # the same full-length run as the seed ceiling, read where a decision reads it (the held-out split, not the
        # test split the target is measured on): what a trial as long as the recipe could know through that split
        pred = [r["own_heldout"] for r in rows]
        pick = names[int(np.argmin(pred))]
        return pred, None, pick, pick if min(pred) < 0 else None
    pick = names[int(np.argmin([r["target"] for r in rows]))]
    return [r["target"] for r in rows], None, pick, pick if min(r["target"] for r in rows) < 0 else None


def scored_methods(insts) -> tuple:
    """:data:`METHODS`, less the sensitivity baseline where a model of ``insts`` has no recorded sensitivity
    (:func:`attach_sensitivity`)."""
    recorded = all("sensitivity" in r for i in insts for r in i["rows"])
    return tuple(m for m in METHODS if m != SENSITIVITY or recorded)


def score(insts, calibrations: dict, method: str, decider=_decide) -> dict:
    """One method's scores over ``insts`` (each scored with its own set's leave-one-out calibration; ``decider``:
    :func:`_predictions`')."""
    pooled_pred, pooled_real, within, picked, ratios, gains, probs, outcomes = [], [], [], [], [], [], [], []
    pick_gains, best_gains = [], []  # relative to the test loss, decisions whose best candidate decreased it
    harms = flagged = clear = signs = covered = n_cov = 0
    close_calls = {True: [], False: []}  # decide's choices by InsertionDecision.close_call: is the pick the best?
    for inst in insts:
        cal = calibrations[inst["set"]]
        pred, p, pick, choice = _predictions(inst, method, cal, decider)
        target = np.array([r["target"] for r in inst["rows"]])
        names = [r["candidate"] for r in inst["rows"]]
        best = int(np.argmin(target))
        if pred is not None and method != "every block helps":
            pooled_pred += list(np.asarray(pred) / inst["base_test"])
            pooled_real += list(target / inst["base_test"])
            w = _spearman(pred, target)
            if w is not None:
                within.append(w)
        if pick is None:  # random / every block helps: expected values
            picked.append(1 / len(names))
            if target[best] < 0:
                ratios.append(float(np.mean(-target)) / -target[best])
                pick_gains.append(float(np.mean(-target)) / inst["base_test"])
                best_gains.append(-target[best] / inst["base_test"])
        else:
            picked.append(float(names.index(pick) == best))
            if target[best] < 0:
                ratios.append(-target[names.index(pick)] / -target[best])
                pick_gains.append(-target[names.index(pick)] / inst["base_test"])
                best_gains.append(-target[best] / inst["base_test"])
        if choice == "random":
            gains.append(float(np.mean(-target)) / inst["base_test"])
        else:
            gains.append(0.0 if choice is None else -target[names.index(choice)] / inst["base_test"])
        for k, r in enumerate(inst["rows"]):
            # the target is the other seeds' change: the trial seed's own continuation is never scored
            is_clear = abs(r["target"]) > r["spread"]
            if pred is not None and is_clear:
                clear += 1
                signs += int(np.sign(pred[k]) == np.sign(r["target"]))
            if is_clear and r["target"] > 0:
                harms += 1
                # a row without a probability (not verified) flags nothing
                flagged += int(p[k] is not None and p[k] < 0.5) if p is not None else int(pred is not None
                                                                                          and pred[k] > 0)
            if p is not None and p[k] is not None:
                probs.append(p[k])
                outcomes.append(float(r["target"] < 0))
        if method == "decide":
            d = decider(inst, cal)
            if d.runner_up is not None and inst.get("paired_se"):  # only where the paired margin is recorded
                close_calls[d.close_call].append(float(d.choice == names[best]))
            for k, n in enumerate(names):
                if d.candidates[n].interval is not None:  # over the rows that claim an interval
                    lo, hi = d.candidates[n].interval
                    covered += int(lo <= target[k] <= hi)
                    n_cov += 1
    out = {"n_decisions": len(insts), "n_insertions": sum(len(i["rows"]) for i in insts),
           "spearman_pooled": _spearman(pooled_pred, pooled_real) if pooled_pred else None,
           "spearman_within": float(np.mean(within)) if within else None,
           "best_picked": float(np.mean(picked)), "pick_gain_ratio": float(np.mean(ratios)) if ratios else None,
           # the same target read as a ratio of averages: one decision whose best gain is near 0 cannot dominate it
           "pick_gain_of_means": float(np.sum(pick_gains) / np.sum(best_gains)) if best_gains else None,
           "decision_gain": float(np.mean(gains)), "harms": harms, "harms_flagged": flagged,
           "clear": clear, "sign_right": signs / clear if clear and pred is not None else None}
    if probs:
        probs, outcomes = np.array(probs), np.array(outcomes)
        brier = float(np.mean((probs - outcomes) ** 2))
        base = float(np.mean((outcomes.mean() - outcomes) ** 2))
        bins = []
        for lo, hi in zip(BINS, BINS[1:]):
            sel = (probs >= lo) & ((probs < hi) if hi < 1 else (probs <= hi))
            if sel.any():
                bins.append({"bin": [lo, hi], "n": int(sel.sum()), "mean_p": float(probs[sel].mean()),
                             "frequency": float(outcomes[sel].mean())})
        rng = np.random.default_rng(0)
        for b in bins:  # what a bin of n insertions resolves: a bootstrap 95% interval of its frequency
            sel = (probs >= b["bin"][0]) & ((probs < b["bin"][1]) if b["bin"][1] < 1 else (probs <= 1))
            boot = rng.choice(outcomes[sel], (2000, int(sel.sum()))).mean(1)
            b["frequency_95"] = [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))]
        big = [b for b in bins if b["n"] >= 10]
        out |= {"brier": brier, "brier_base_rate": base, "brier_skill": 1 - brier / base if base > 0 else None,
                "reliability": bins,
                "reliability_max_gap": max(abs(b["mean_p"] - b["frequency"]) for b in big) if big else None}
    if n_cov:
        out["coverage_95"] = covered / n_cov
        out |= {"close_calls": len(close_calls[True]), "choices_with_paired_margin": sum(map(len, close_calls.values())),
                "best_chosen_close": float(np.mean(close_calls[True])) if close_calls[True] else None,
                "best_chosen_clear": float(np.mean(close_calls[False])) if close_calls[False] else None}
    return out


# -- depth sweeps -----------------------------------------------------------------------------------------
def sweep_scores(sweeps, calibration, schedule: str = SHIPPED_SCHEDULE, decider=_decide) -> list[dict]:
    """Each sweep's per-depth decision (``decide`` under ``schedule`` on the trials recorded at every depth;
    ``decider``: :func:`_predictions`') and where it first stops, beside the realized best depth.  The model's
    training loss (``base_train``, a stop rule's input) is the sweep's, on its whole training set (the trials'
    training split is part of it)."""
    out = []
    for sw in sweeps:
        recipe = Recipe.from_dict(sw["recipe"])
        stops, per_depth = None, []
        for d in sw["depths"]:
            names = list(d["screen"])
            trials, cost = _trial_schedule(schedule, names, d["screen"], d["trials"], recipe.steps)
            inst = {"steps": recipe.steps, "base_heldout": d["heldout_loss"], "base_train": d["train_loss"], "cost": cost,
                    "optimizer_family": optimizer_family(recipe.optimizer),
                    "rows": [{"candidate": c, "curve": trials[c][0], "may_choose": trials[c][1],
                              "train_se": _train_se(d["trials"].get(c), trials[c][0]), "screen": d["screen"][c]}
                             for c in names]}
            dec = decider(inst, calibration)
            per_depth.append({"depth": d["depth"], "test_loss": d["test_loss"], "choice": dec.choice,
                              "stop_reason": dec.stop_reason, "cost_fraction": dec.cost_fraction})
            if stops is None and dec.choice is None:
                stops = d["depth"]
        depths = [d["depth"] for d in sw["depths"]]
        best = depths[int(np.argmin([d["test_loss"] for d in sw["depths"]]))]
        stop = stops if stops is not None else max(depths) + 1
        out.append({"sweep": sw["sweep"], "best_depth": best, "stop_depth": stop, "within_one": abs(stop - best) <= 1,
                    "best_is_shallowest": best == min(depths), "depths": per_depth})
    return out


def loop_scores(out: Path, sweeps) -> list[dict]:
    """The growth loop's runs (files with ``loops``) beside the scratch sweep of the same tag: its final depth
    against the sweep's realized best and against the best of the models the loop itself trained (lowest test
    loss, the depth-1 start included).  A loop whose start is not the sweep's depth-1 model is refused."""
    scratch = {sw["sweep"]: sw for sw in sweeps}
    rows = []
    for path in sorted(out.glob("*.json")):
        for loop in json.loads(path.read_text()).get("loops", []):
            sw = scratch[loop["loop"]]
            first = sw["depths"][0]
            if first["depth"] != loop["start_depth"] or not math.isclose(first["test_loss"], loop["start_test_loss"],
                                                                           rel_tol=1e-9):
                raise SystemExit(f"{path}: loop {loop['loop']} did not start from its sweep's depth-1 model "
                                 f"(test loss {loop['start_test_loss']} against {first['test_loss']})")
            best_row = sw["depths"][int(np.argmin([d["test_loss"] for d in sw["depths"]]))]
            best = best_row["depth"]
            trained = [(loop["start_depth"], loop["start_test_loss"])] + [(t["depth"], t["test_loss"])
                                                                          for t in loop["trained"]]
            own_best = min(trained, key=lambda dt: dt[1])[0]
            final_test = next(t for d, t in reversed(trained) if d == loop["final_depth"])
            rows.append({"loop": loop["loop"], "scratch_best": best, "scratch_best_test_loss": best_row["test_loss"],
                         "final_depth": loop["final_depth"],
                         "within_one": abs(loop["final_depth"] - best) <= 1, "own_best": own_best,
                         "stop_reason": loop["stop_reason"], "start_test_loss": loop["start_test_loss"],
                         "final_test_loss": final_test, "rounds": loop["rounds"], "seconds": loop["seconds"]})
    return rows


# -- decision rules tried ------------------------------------------------------------------------------------
def _with(fitter, **changes):
    return lambda insts, source, errors: Calibration(**{**fitter(insts, source, errors).to_dict(), **changes})


def _shipped(insts, source, errors):
    return fit(insts, source, error_insts=errors)


def _long(insts):
    return [i for i in insts if i["steps"] in LONG]


# each rule: (insts, source, error_insts: the same sets' trials read on the larger held-out split) -> Calibration
SHIPPED_RULE = "shipped: trend weight by the point's error, long recipes, error model on two held-out sizes"
VARIANTS = {
    SHIPPED_RULE: _shipped,
    "error model on the bench's held-out size only (shipped before)": lambda insts, source, errors: fit(insts, source),
    "everything fitted on two held-out sizes (the bench's and 4 times it)":
        lambda insts, source, errors: fit(insts + errors, source),
    "error model on three held-out sizes (16 times the bench's too)": "x16",
    "trend weight by the decisions' gain": lambda insts, source, errors: fit(insts, source, "gain", error_insts=errors),
    "fitted on every recipe length (30 steps too)":
        lambda insts, source, errors: fit(insts, source, lengths=(30, *LONG), error_insts=errors),
    "trend weight 0.5": lambda insts, source, errors: _fit_at_trend_weight(_long(insts), source, 0.5, _long(errors)),
    "trend weight 1.0": lambda insts, source, errors: _fit_at_trend_weight(_long(insts), source, 1.0, _long(errors)),
    "P(decrease) from the residual quantiles (no logistic)": _with(_shipped, logit_slope=None),
    "P(decrease) threshold 0.7": _with(_shipped, p_threshold=0.7),
    "stop tolerance 0.003 of the held-out loss (shipped before)":
        _with(_shipped, tolerance=0.003, generalization_gap_fraction=0.0),
}


# trial schedules at the same cost (the depth sweeps recorded the even plan's and halving's checkpoints only)
SCHEDULE_VARIANTS = {
    "successive halving: every candidate half a trial, the better half on (its own fit)": "halving",
    # its error model on two held-out sizes as shipped (the compressed SGD trials read on the larger split too)
    "SGD trials time-compressed (lr x S/T; its own fit)": COMPRESSED_SGD,
    "2 trials: the screen's first 2, twice as long": "trials-2",
    "3 trials: the screen's first 3": "trials-3",
}


def variants(out: Path) -> str:
    """Every rule of ``VARIANTS`` fitted leave one model set out and scored on the set left out (long recipes),
    beside the same rule fitted on every set and scored in sample, and the depth sweeps under the rule fitted on
    every insertion set; then the shipped fit under each trial schedule of ``SCHEDULE_VARIANTS``."""
    models, sweeps, _ = load(out)
    models = attach_compressed(models, out.parent / COMPRESSED_FOLDER)
    transfer = out.parent / TRANSFER_FOLDER  # the rules compared on the transfer sets too read them from here
    transfer = attach_compressed(load(transfer)[0], out.parent / COMPRESSED_FOLDER) if transfer.is_dir() else None
    sets = sorted({m["set"] for m in models})
    lines = ["| rule | fitted on | within-model Spearman | best picked | pick gain / best | decision gain (% of test "
             "loss) | harms flagged | sign right (clear) | Brier skill | max reliability gap | 95% coverage | sweeps "
             "within one block |", "|---" * 12 + "|"]
    rules = [(name, fitter, SHIPPED_SCHEDULE) for name, fitter in VARIANTS.items()]
    rules += [(name, _shipped, schedule) for name, schedule in SCHEDULE_VARIANTS.items()]
    for name, fitter, schedule in rules:
        if schedule == COMPRESSED_SGD and not all("compressed" in m for m in models):
            continue  # not recorded
        insts = instances(models, schedule)
        errors = larger_heldout(out, schedule)
        if fitter == "x16":  # the shipped fit with the 16-times split's trials in its error model too
            errors, fitter = errors + larger_heldout(out, schedule, 16), _shipped
        long = [i for i in insts if i["steps"] in LONG]
        full = fitter(insts, "every bench model set", errors)
        held = {s: fitter([i for i in insts if i["set"] != s], f"bench sets other than {s}",
                          [i for i in errors if i["set"] != s]) for s in sets}
        sw = sweep_scores(sweeps, full, schedule) if schedule in ("halving", "even") else None
        within = "-" if sw is None else f"{sum(x['within_one'] for x in sw)} of {len(sw)}"
        scored = [("other sets (held out)", long, held), ("every set (in sample)", long, {s: full for s in sets})]
        if (schedule == COMPRESSED_SGD or name == SHIPPED_RULE) and transfer is not None:
            # the pair compared, also on the transfer sets
            far = [i for i in instances(transfer, schedule) if i["steps"] == 300 and not i["column"].endswith("_1000")]
            scored.append(("transfer sets, 300 steps (the every-set fit)", far, {i["set"]: full for i in far}))
        for label, chosen, cals in scored:
            r = score(chosen, cals, "decide")
            lines.append(f"| {name} | {label} | {_f(r['spearman_within'])} | {_f(r['best_picked'], True)} | "
                         f"{_f(r['pick_gain_ratio'], True)} | "
                         f"{100 * r['decision_gain']:+.2f} | {r['harms_flagged']}/{r['harms']} | "
                         f"{_f(r['sign_right'], True)} | {_f(r['brier_skill'], True)} | "
                         f"{_f(r['reliability_max_gap'])} | {_f(r['coverage_95'], True)} | "
                         f"{within if label.startswith('every') else '-'} |")
    return "\n".join(lines)


# -- stop rules tried: stopping short where the realized gain is clear ------------------------------------------
CLEAR_GAIN_NOISE = 3  # a realized best gain is clear beyond this many seed standard deviations


def stops_over_noise(insts, calibrations: dict, decider=_decide) -> tuple[int, int]:
    """``(stops, decisions)``: of the decisions whose realized best gain (the best candidate's target decrease)
    exceeds :data:`CLEAR_GAIN_NOISE` times the seed noise (the standard deviation over every trial seed of that
    candidate's realized test change at the recipe's length), how many stop."""
    stops = clear = 0
    for inst in insts:
        best = min(inst["rows"], key=lambda r: r["target"])
        if -best["target"] > CLEAR_GAIN_NOISE * best["seed_sd"]:
            clear += 1
            stops += decider(inst, calibrations[inst["set"]]).choice is None
    return stops, clear


def _heldout_fraction(inst, candidate, fraction, x) -> float:
    return fraction * abs(inst["base_heldout"])


def _gap_fraction(inst, candidate, fraction, x) -> float:
    return fraction * max(0.0, inst["base_heldout"] - inst["base_train"])


def _where(signature):
    """The held-out fraction where ``signature(inst, trial, x)`` says the model or trial over-fits, else 0."""
    return lambda inst, c, fraction, x: _heldout_fraction(inst, c, fraction, x) if signature(inst, c.trial, x) else 0.0


def _last_doubling_share(trial: TrialCurve, which: str) -> float:
    """The share of the trial's change made in its last doubling, ``(d(T) - d(T/2)) / d(T)`` (0 where d(T) >= 0)."""
    end = (trial.heldout_change if which == "heldout" else trial.training_change)[-1]
    return trial.trend(which) / end if end < 0 else 0.0


# each rule: (stop tolerance in loss units of (inst, chosen candidate, fraction, x), the grid of x); the fraction is
# fitted on TOLERANCES, the threshold on P_THRESHOLDS (fit_stop_rule)
STOP_RULES = {
    "shipped: a fraction of the generalization gap (held-out minus training loss before insertion)":
        (_gap_fraction, (None,)),
    "a fraction of the held-out loss (shipped before)": (_heldout_fraction, (None,)),
    "none: stop only without a credible decrease": (lambda inst, c, fraction, x: 0.0, (None,)),
    "the held-out fraction where the model's training loss is below x times its held-out loss":
        (_where(lambda inst, trial, x: inst["base_train"] < x * inst["base_heldout"]), (0.5, 0.7, 0.8, 0.9, 0.95)),
    "the held-out fraction where the trial's training decrease exceeds x times its held-out decrease":
        (_where(lambda inst, trial, x: trial.training_change[-1] < x * trial.heldout_change[-1]), (1.5, 2, 3, 4, 6)),
    "the held-out fraction where the held-out decrease of the trial's last doubling is below x d(T), training falling":
        (_where(lambda inst, trial, x: trial.trend() > x * trial.heldout_change[-1] and trial.trend("training") < 0),
         (0.0, 0.1, 0.2, 0.3, 0.5)),
    "the held-out fraction where the held-out share of the last doubling trails the training share by more than x":
        (_where(lambda inst, trial, x: _last_doubling_share(trial, "heldout")
                < _last_doubling_share(trial, "training") - x), (-0.5, -0.25, 0.0, 0.25, 0.5)),
}


def _stop_rule_decider(rule: str, params: dict):
    """:func:`_decide` with ``rule``'s stop tolerance (:data:`STOP_RULES`) in place of the calibration's;
    ``params``: ``(fraction, x)`` by model set (key None: a sweep's decisions)."""
    tolerance_of = STOP_RULES[rule][0]

    def decide_with(inst, calibration):
        d = _decide(inst, dataclasses.replace(calibration, tolerance=0.0, generalization_gap_fraction=0.0))
        if d.choice is None:
            return d
        chosen = d.candidates[d.choice]
        tolerance = tolerance_of(inst, chosen, *params[inst.get("set")])
        if -chosen.predicted_heldout_change < tolerance:
            return dataclasses.replace(d, choice=None, stop_reason="gain_below_tolerance", stop_tolerance=tolerance)
        return dataclasses.replace(d, stop_tolerance=tolerance)

    return decide_with


def fit_stop_rule(insts, calibration, rule: str) -> tuple:
    """``(p_threshold, fraction, x)`` of ``rule`` fitted as :func:`fit` fits the shipped threshold and tolerance:
    the largest mean realized gain of the decisions of ``insts`` (long recipes), ties to the lower threshold and
    fraction, then the first ``x``; the error model is ``calibration``'s."""
    insts = [i for i in insts if i["steps"] in LONG]
    scored = []
    for p in P_THRESHOLDS:
        cal = dataclasses.replace(calibration, p_threshold=p)
        for fraction in TOLERANCES:
            for k, x in enumerate(STOP_RULES[rule][1]):
                decider = _stop_rule_decider(rule, {i["set"]: (fraction, x) for i in insts})
                scored.append((_mean_decision_gain(insts, cal, decider), -p, -fraction, -k, (p, fraction, x)))
    return max(scored, key=lambda s: s[:4])[4]


STOP_RULE_TARGETS = ("spearman_pooled", "spearman_within", "best_picked", "pick_gain_ratio", "harms_flagged",
                     "sign_right", "brier_skill", "reliability_max_gap", "coverage_95")


# per optimizer family (the recipe's optimizer, which the decision knows): the stop's constants, or the whole calibration,
# fitted on each family's decisions
LOW_P_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, *P_THRESHOLDS)


def fit_thresholds_by_family(insts, calibration, thresholds: tuple = P_THRESHOLDS) -> dict:
    """``{family: calibration}``: ``calibration`` with a ``P(decrease)`` threshold per optimizer family (on
    ``thresholds``) and one stop tolerance fraction (on :data:`TOLERANCES`), fitted as :func:`fit` fits the shipped
    pair: the largest mean realized gain of the decisions of ``insts`` (long recipes; a family's threshold moves only
    its own decisions), ties to the lower threshold and fraction."""
    insts = [i for i in insts if i["steps"] in LONG]
    best = None
    for fraction in TOLERANCES:
        chosen, total = {}, 0.0
        for family in OPTIMIZER_FAMILIES:
            group = [i for i in insts if i["optimizer_family"] == family]
            scored = [(len(group) * _mean_decision_gain(group, cal), -cal.p_threshold, cal) for cal in
                      (dataclasses.replace(calibration, p_threshold=p, generalization_gap_fraction=fraction)
                       for p in thresholds)]
            gain, _, chosen[family] = max(scored, key=lambda s: s[:2])
            total += gain
        if best is None or total > best[0]:  # TOLERANCES increase: ties stay with the lower fraction
            best = (total, chosen)
    return best[1]


def fit_by_family(insts, error_insts, source: str = "bench model sets") -> dict:
    """``{family: calibration}``: the whole calibration (:func:`fit`: trend weight, error model, logistic, threshold,
    stop tolerance fraction) fitted on each optimizer family's decisions alone."""
    return {family: fit([i for i in insts if i["optimizer_family"] == family], f"{source}, {family} recipes",
                        error_insts=[i for i in error_insts if i["optimizer_family"] == family])
            for family in OPTIMIZER_FAMILIES}


# each rule: (insts, the shared calibration, error_insts) -> {family: calibration}
OPTIMIZER_RULES = {
    "the P(decrease) threshold per optimizer family (SGD; Adam and AdamW)":
        lambda insts, calibration, errors: fit_thresholds_by_family(insts, calibration),
    "the same, the threshold also below 0.5 (0.1-0.4)":
        lambda insts, calibration, errors: fit_thresholds_by_family(insts, calibration, LOW_P_THRESHOLDS),
    "the whole calibration per optimizer family (trend weight, error model, logistic, threshold, fraction)":
        lambda insts, calibration, errors: fit_by_family(insts, errors),
    "SGD's own whole calibration, Adam's and AdamW's the shared one":
        lambda insts, calibration, errors: {"adam": calibration, "sgd": fit_by_family(insts, errors)["sgd"]},
}


COMPRESSED_SGD_RULE = "SGD trials time-compressed (lr x S/T), the whole calibration fitted on them"


def _family_decider(calibrations: dict):
    """:func:`_decide` with ``calibrations[(model set, optimizer family)]`` (set None: a sweep's decisions) in place of
    the calibration passed."""
    return lambda inst, calibration: _decide(inst, calibrations[(inst.get("set"), inst["optimizer_family"])])


def _family_constants(calibrations: dict) -> dict:
    return {f: (c.p_threshold, c.generalization_gap_fraction) for f, c in calibrations.items()}


def _stop_rule_setting(out: Path, schedule: str = SHIPPED_SCHEDULE) -> dict:
    """What :func:`stop_rule_scores` reads, the trials read as ``schedule`` reads them: the bench's decisions and
    their leave-one-set-out calibrations, the every-set fit, the four scored columns (bench at 300 steps and the
    1000-step recordings no fit reads, transfer sets at 300 and 1000 steps), the transfer sets' names, and both
    groups of depth sweeps (the even plan's: their recipes are Adam's and AdamW's, which no schedule tried changes)."""
    def decisions(folder: Path) -> tuple[list, list, list]:
        models, sweeps, _ = load(folder)
        if schedule == COMPRESSED_SGD:
            models = attach_compressed(models, out.parent / COMPRESSED_FOLDER)
        return instances(models, schedule), sweeps, models

    insts, sweeps, _ = decisions(out)
    errors = larger_heldout(out, schedule)
    transfer, transfer_sweeps, transfer_models = decisions(out.parent / TRANSFER_FOLDER)
    columns = {"bench, 300 steps": [i for i in insts if i["steps"] == 300],
               "bench, 1000": [i for i in decisions(out.parent / BENCH_1000_FOLDER)[0] if i["steps"] == 1000],
               **{f"transfer sets, {steps}": [i for i in transfer if i["steps"] == steps
                                              and i["column"].endswith("_1000") == (steps == 1000)] for steps in LONG}}
    return {"insts": insts, "errors": errors, "cals": lomo_calibrations(insts, errors),
            "full": fit(insts, "every bench model set", error_insts=errors), "columns": columns,
            "transfer_sets": sorted({m["set"] for m in transfer_models}), "sweeps": sweeps,
            "transfer_sweeps": transfer_sweeps}


def _stop_rule_row(setting: dict, decider, bench_cals: dict, transfer_cal: Calibration, sweep_cals: tuple) -> dict:
    """One rule's scores (:func:`stop_rule_scores`): ``decider`` over the four columns (``bench_cals`` by set on the
    bench's, ``transfer_cal`` on the transfer sets'), and the bench's and transfer sets' sweeps under ``sweep_cals``."""
    row = {"columns": {}, "sweeps": sweep_scores(setting["sweeps"], sweep_cals[0], decider=decider),
           "transfer_sweeps": sweep_scores(setting["transfer_sweeps"], sweep_cals[1], decider=decider)}
    for label, chosen in setting["columns"].items():
        column_cals = bench_cals if label.startswith("bench") else {s: transfer_cal for s in setting["transfer_sets"]}
        scored = score(chosen, column_cals, "decide", decider)
        row["columns"][label] = {"stops_over_noise": stops_over_noise(chosen, column_cals, decider),
                                 "decision_gain": scored["decision_gain"], **{k: scored.get(k) for k in STOP_RULE_TARGETS},
                                 "sgd_reliability_max_gap": score([i for i in chosen if i["optimizer_family"] == "sgd"],
                                                                  column_cals, "decide", decider)["reliability_max_gap"]}
    return row


def _auc(scores, labels) -> float | None:
    """The probability that a random positive of ``labels`` scores above a random negative (ties count half)."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    n1, n0 = int(labels.sum()), int((~labels).sum())
    if not n1 or not n0:
        return None
    return float((rankdata(scores)[labels].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def optimizer_evidence(setting: dict) -> dict:
    """Per column and optimizer family, what a per-family rule could read: the trialled candidates' share whose
    realized change is a decrease (target < 0), how well the trial's held-out change in its standard errors
    (``-d(T) / se``) and its training decrease (``-training change at T``) separate them (AUC), and the shipped
    decision's stops for no credible decrease among the decisions whose realized best gain is clear
    (:func:`stops_over_noise`), with how many of them saw every trial raise the held-out loss at its end; and over
    every decision whose trials all rose, how often the candidate of least rise decreased the test loss or raised
    it clearly (by more than its seed range)."""
    from satcore._decisions.calibration import DEFAULT_CALIBRATION

    out = {}
    for label, chosen in setting["columns"].items():
        for family in OPTIMIZER_FAMILIES:
            group = [i for i in chosen if i["optimizer_family"] == family]
            rows = [r for i in group for r in _trialled(i)]
            decreased = [r["target"] < 0 for r in rows]
            floor = []
            for inst in group:
                best = min(inst["rows"], key=lambda r: r["target"])
                cal = setting["cals"][inst["set"]] if label.startswith("bench") else DEFAULT_CALIBRATION
                decision = _decide(inst, cal)
                # a stop for no credible decrease, whether or not the held-out data resolves it
                if (-best["target"] > CLEAR_GAIN_NOISE * best["seed_sd"] and decision.choice is None
                        and not decision.credible_candidates):
                    floor.append(all(r["curve"].heldout_change[-1] > 0 for r in _trialled(inst)))
            # where every trial rose, the candidate a rule inserting anyway would take: the least rise
            least = [min(_trialled(i), key=lambda r: r["curve"].heldout_change[-1]) for i in group
                     if all(r["curve"].heldout_change[-1] > 0 for r in _trialled(i))]
            out[f"{label}/{family}"] = {
                "trialled": len(rows), "decrease_share": float(np.mean(decreased)),
                "auc_heldout_z": _auc([-r["curve"].heldout_change[-1] / max(r["curve"].heldout_se, 1e-12)
                                       for r in rows], decreased),
                "auc_training_decrease": _auc([-r["curve"].training_change[-1] for r in rows], decreased),
                "no_credible_stops": len(floor), "every_trial_rising": int(sum(floor)),
                "decisions_every_trial_rising": len(least),
                "least_rise_decreases": sum(r["target"] < 0 for r in least),
                "least_rise_clear_harm": sum(r["target"] > r["spread"] for r in least)}
    return out


def stop_rule_scores(out: Path) -> dict:
    """Every rule of :data:`STOP_RULES` and :data:`OPTIMIZER_RULES` fitted leave one bench set out (scored on the set
    left out, at 300 steps and on the 1000-step recordings no fit reads) and on every bench set (scored on the transfer
    sets, with the error model ``decide`` ships, or the rule's own, and on the depth sweeps): stops where the realized
    best gain is clear (:func:`stops_over_noise`), sweeps within one block, decision gain, and every other target of
    the tables (:data:`STOP_RULE_TARGETS`; the SGD recipes' largest reliability gap too); beside the rules, what a
    per-optimizer rule could read (:func:`optimizer_evidence`)."""
    from satcore._decisions.calibration import DEFAULT_CALIBRATION

    setting = _stop_rule_setting(out)
    insts, cals, full, transfer_sets = setting["insts"], setting["cals"], setting["full"], setting["transfer_sets"]
    result = {}
    for rule in STOP_RULES:
        held = {s: fit_stop_rule([i for i in insts if i["set"] != s], cals[s], rule) for s in cals}
        every = fit_stop_rule(insts, full, rule)
        params = {**{s: held[s][1:] for s in held}, **{s: every[1:] for s in transfer_sets}, None: every[1:]}
        shipped = dataclasses.replace(DEFAULT_CALIBRATION, p_threshold=every[0])
        row = _stop_rule_row(setting, _stop_rule_decider(rule, params),
                             {s: dataclasses.replace(cals[s], p_threshold=held[s][0]) for s in cals}, shipped,
                             (dataclasses.replace(full, p_threshold=every[0]), shipped))
        result[rule] = {"fitted_left_out": held, "fitted_every_set": every, **row}
    for rule, fitter in OPTIMIZER_RULES.items():
        held = {s: fitter([i for i in insts if i["set"] != s], cals[s],
                          [i for i in setting["errors"] if i["set"] != s]) for s in cals}
        every = fitter(insts, DEFAULT_CALIBRATION, setting["errors"])
        by_set = {**{(s, f): c for s in held for f, c in held[s].items()},
                  **{(s, f): c for s in (*transfer_sets, None) for f, c in every.items()}}
        row = _stop_rule_row(setting, _family_decider(by_set), cals, DEFAULT_CALIBRATION, (full, DEFAULT_CALIBRATION))
        result[rule] = {"fitted_left_out": {s: _family_constants(held[s]) for s in held},
                        "fitted_every_set": _family_constants(every),
                        "calibrations_every_set": {f: c.to_dict() for f, c in every.items()}, **row}
    # the SGD recipes' trials time-compressed (lr x S/T), the calibration fitted on them as the shipped one is
    compressed = _stop_rule_setting(out, COMPRESSED_SGD)
    row = _stop_rule_row(compressed, _decide, compressed["cals"], compressed["full"],
                         (compressed["full"], compressed["full"]))
    result[COMPRESSED_SGD_RULE] = {
        "fitted_left_out": {s: (c.p_threshold, c.generalization_gap_fraction, None) for s, c in compressed["cals"].items()},
        "fitted_every_set": (compressed["full"].p_threshold, compressed["full"].generalization_gap_fraction, None), **row}
    return {"rules": result, "optimizer_evidence": optimizer_evidence(setting)}


def stop_rules(out: Path) -> str:
    """The table of :func:`stop_rule_scores` (``--stop-rules``)."""
    res = stop_rule_scores(out)
    (out.parent / "decision_validity_stop_rules.json").write_text(json.dumps(res, indent=1, default=float))
    shipped = res["rules"][next(iter(STOP_RULES))]
    labels = list(shipped["columns"])
    lines = ["| stop rule | fitted (threshold, fraction, x): left out / every set | stops where the realized best gain "
             "exceeds 3 times the seed noise: " + " / ".join(labels) + " | sweeps within one block: bench / transfer "
             "| decision gain (% of the test loss): " + " / ".join(labels) + " | other targets |",
             "|---" * 6 + "|"]
    for rule, row in res["rules"].items():
        held = ", ".join(f"{s} {_stop_constants(c)}" for s, c in row["fitted_left_out"].items())
        stops = " / ".join(f"{a} of {b} ({100 * a / b:.0f}%)" for a, b in
                           (row["columns"][c]["stops_over_noise"] for c in labels))
        within = " / ".join(f"{sum(w['within_one'] for w in row[k])} of {len(row[k])}"
                            for k in ("sweeps", "transfer_sweeps"))
        gains = " / ".join(f"{100 * row['columns'][c]['decision_gain']:+.2f}" for c in labels)
        same = all(row["columns"][c][k] == shipped["columns"][c][k] for c in labels for k in STOP_RULE_TARGETS)
        others = "as shipped" if same else " / ".join(
            f"harms flagged {r['harms_flagged']}, signs {_f(r['sign_right'], True)}, Brier {_f(r['brier_skill'], True)}, "
            f"gap {_f(r['reliability_max_gap'])} (SGD {_f(r['sgd_reliability_max_gap'])})"
            for r in (row["columns"][c] for c in labels))
        lines.append(f"| {rule} | {held} / {_stop_constants(row['fitted_every_set'])} | {stops} | {within} | {gains} | "
                     f"{others} |")
    lines += ["", "| column / optimizer family | trialled | realized decrease | AUC: -d(T)/se | AUC: training decrease "
              "| stops for no credible decrease, realized best gain clear | of them every trial rising | decisions every "
              "trial rising: the least rise decreases / clearly raises |", "|---" * 8 + "|"]
    lines += [f"| {key} | {e['trialled']} | {_f(e['decrease_share'], True)} | {e['auc_heldout_z']:.2f} | "
              f"{e['auc_training_decrease']:.2f} | {e['no_credible_stops']} | {e['every_trial_rising']} | "
              f"{e['decisions_every_trial_rising']}: {e['least_rise_decreases']} / {e['least_rise_clear_harm']} |"
              for key, e in res["optimizer_evidence"].items()]
    return "\n".join(lines)


def _stop_constants(constants) -> str:
    """A rule's fitted constants as the table prints them: ``threshold, fraction[, x]``, or per optimizer family."""
    if isinstance(constants, dict):
        return "; ".join(f"{family} {_stop_constants(c)}" for family, c in constants.items())
    return ", ".join(f"{v:g}" for v in constants if v is not None)


# -- output -------------------------------------------------------------------------------------------------
def _f(x, pct=False, digits=2):
    if x is None:
        return "-"
    return f"{100 * x:.0f}%" if pct else f"{x:+.{digits}f}"


def _recorded_deviation(models: list, recorded: list) -> float:
    """The largest absolute difference between the held-out, test and training changes of ``models``'s runs and
    the same runs (model, candidate, column, trial seed, checkpoint) in ``recorded``; refused where a run is not
    recorded there."""
    runs = {(m["model"], r["candidate"], r["column"], r["seed"]): r for m in recorded for r in m["runs"]}
    worst = 0.0
    for m in models:
        for r in m["runs"]:
            key = (m["model"], r["candidate"], r["column"], r["seed"])
            if key not in runs:
                raise SystemExit(f"{m.get('file')}: run {key} is not in the bench's recording")
            old = runs[key]
            for split in ("heldout", "test", "train"):
                for step, value in zip(r["steps"], r[split]["change"]):
                    worst = max(worst, abs(value - old[split]["change"][old["steps"].index(step)]))
    return worst


def large_heldout_scores(large: Path, recorded: list) -> dict:
    """The 300-step decisions of the ``--large-heldout`` recording (the bench's models and trials, each trial also
    evaluated on a held-out split 4 times the bench's), read on the bench's held-out split and on the larger one.

    ``decide`` on the larger split is scored twice: with the calibrations fitted (leave one model set out) on the
    bench's split, as a user with more held-out data gets the shipped calibration, and with calibrations fitted the
    same way on the larger split's own trials; the even plan and successive halving, beside the short trial alone and
    the ceilings read on each split."""
    models = load(large)[0]
    result = {"sets": sorted({m["set"] for m in models}), "columns": sorted({r["column"] for m in models
                                                                              for r in m["runs"]}),
              "max_deviation_from_recording": _recorded_deviation(models, recorded), "rows": {}}
    rows = result["rows"]
    for schedule in ("even", "halving"):
        bench = instances(models, schedule)
        larger = instances(models, schedule, "heldout_large")
        # the shipped procedure (its error model on both sizes) beside a fit on the larger split's trials alone
        bench_cals, larger_cals = lomo_calibrations(bench, larger), lomo_calibrations(larger)
        bench, larger = [i for i in bench if i["steps"] == 300], [i for i in larger if i["steps"] == 300]
        name = "decide" if schedule == "even" else 'decide, `schedule="halving"`'
        rows[f"{name} (bench's held-out split)"] = score(bench, bench_cals, "decide")
        rows[f"{name} (held-out x4, the shipped procedure's calibrations)"] = score(larger, bench_cals, "decide")
        rows[f"{name} (held-out x4, calibrated on that split)"] = score(larger, larger_cals, "decide")
        if schedule == "even":
            for method, label in (("short trial alone", "short trial alone"), (HELDOUT_CEILING, "held-out ceiling")):
                rows[f"{label} (bench's held-out split)"] = score(bench, bench_cals, method)
                rows[f"{label} (held-out x4)"] = score(larger, larger_cals, method)
            rows[SEED_CEILING] = score(bench, bench_cals, SEED_CEILING)
    return result


def larger_size_scores(out: Path, cals: dict, factor: int = 16) -> dict | None:
    """The shipped procedure's decisions (``cals``: its leave-one-set-out calibrations, fitted on the bench's split
    and the 4x one) read on a held-out split ``factor`` times the bench's (``--large-heldout factor``), which no
    fit reads, beside the same decisions read on the bench's split and on the 4x one, over the same model sets;
    None where it is not recorded."""
    larger = large_heldout_folder(out, factor)
    if not larger.is_dir():
        return None
    models = load(larger)[0]
    sets = sorted({m["set"] for m in models})
    four = [i for i in larger_heldout(out) if i["set"] in sets]
    result = {"sets": sets, "factor": factor, "max_deviation_from_recording": _recorded_deviation(models, load(out)[0]),
              "rows": {}}
    for label, insts in (("bench's held-out split", instances(models)), ("held-out x4", four),
                         (f"held-out x{factor}", instances(models, SHIPPED_SCHEDULE, "heldout_large"))):
        long = [i for i in insts if i["steps"] == 300]
        result["rows"][f"decide ({label})"] = score(long, cals, "decide")
        result["rows"][f"held-out ceiling ({label})"] = score(long, cals, HELDOUT_CEILING)
    return result


TRANSFER_FOLDER = "decision_validity_transfer"  # studies/decision_validity.py TRANSFER's recordings, beside ``out``
BENCH_1000_FOLDER = "decision_validity_1000"  # the bench's 1000-step columns (no fit reads them), beside ``out``
# the transfer sets' 1000-step columns read on a larger held-out split (--large-heldout with a 1000-step column) are
# recorded to large_heldout_folder(out.parent / TRANSFER_1000_FOLDER), apart from the 300-step ones
TRANSFER_1000_FOLDER = "decision_validity_transfer_1000"


def transfer_scores(out: Path) -> dict | None:
    """The transfer sets (other architectures on other data, which no fit reads) decided with the calibrations
    ``decide`` ships (fitted on every bench model set), as a user gets them: at 300 steps (the 300-step columns) and
    at 1000 (the 1000-step columns), every column and set pooled beside the baselines, per set and per column; the
    even plan and successive halving; and the transfer depth sweeps' per-depth decisions.  None where nothing is
    recorded."""
    from satcore._decisions.calibration import DEFAULT_CALIBRATION, HALVING_CALIBRATION

    folder = out.parent / TRANSFER_FOLDER
    if not folder.is_dir():
        return None
    models, sweeps, _ = load(folder)
    models = attach_sensitivity(models, out.parent / SENSITIVITY_FOLDER)
    result = {"sets": sorted({m["set"] for m in models}), "models": sorted({m["model"] for m in models}),
              "base": {m["model"]: m["base"] for m in models}, "lengths": {},
              "sweeps": sweep_scores(sweeps, DEFAULT_CALIBRATION), "loops": loop_scores(folder, sweeps)}
    large = large_heldout_folder(folder)
    if large.is_dir():  # the 300-step runs again, each trial also read on a held-out split 4 times the sets' own
        recorded = load(large)[0]
        cals = {s: DEFAULT_CALIBRATION for s in result["sets"]}
        result["large_heldout"] = {"max_deviation_from_recording": _recorded_deviation(recorded, models), "rows": {}}
        for label, split in (("held-out split as recorded", "heldout"), ("held-out x4", "heldout_large")):
            insts = [i for i in instances(recorded, SHIPPED_SCHEDULE, split) if i["steps"] == 300]
            result["large_heldout"]["rows"][f"decide ({label})"] = score(insts, cals, "decide")
            result["large_heldout"]["rows"][f"held-out ceiling ({label})"] = score(insts, cals, HELDOUT_CEILING)
    for schedule, calibration in (("even", DEFAULT_CALIBRATION), ("halving", HALVING_CALIBRATION)):
        insts = instances(models, schedule)
        cals = {s: calibration for s in result["sets"]}
        for steps in LONG:
            # a 1000-step column's first 300 steps are its own runs of the 300-step recipe: each length is read on
            # the columns recorded for it, so no run is counted twice
            sel = [i for i in insts if i["steps"] == steps and i["column"].endswith("_1000") == (steps == 1000)]
            if not sel:
                continue
            rows = result["lengths"].setdefault(str(steps), {"columns": sorted({i["column"] for i in sel})})
            if schedule == "even":
                rows["every set"] = {m: score(sel, cals, m) for m in scored_methods(sel)}
                rows["by set"] = {s: score([i for i in sel if i["set"] == s], cals, "decide") for s in result["sets"]}
                rows["by column"] = {c: score([i for i in sel if i["column"] == c], cals, "decide")
                                     for c in rows["columns"]}
            else:
                rows["halving"] = score(sel, cals, "decide")
    return result


COMPRESSED_FOLDER = "decision_validity_compressed"  # studies/decision_validity.py --compressed, beside ``out``


def compressed_scores(out: Path) -> dict | None:
    """Time-compressed trials (``--compressed``: the even plan's ``T`` steps at ``lr * S / T``) against the even
    plan's trial (``T`` steps at the recipe's ``lr``, read from the recorded runs of the same models and seeds), as
    rankings of a model's candidates: per recipe length, column and group of sets (the bench's, the transfer
    sets), the mean within-model Spearman of each trial's held-out change at ``T`` with the target (the other trial
    seeds' realized test change after the recipe's ``S`` steps at ``lr``) and the share of decisions whose lowest
    reading is the realized best.  None where nothing is recorded."""
    folder = out.parent / COMPRESSED_FOLDER
    if not folder.is_dir():
        return None
    recorded, transfer = {}, set()
    for path in (out, out.parent / BENCH_1000_FOLDER, out.parent / TRANSFER_FOLDER):
        for m in load(path)[0] if path.is_dir() else []:
            entry = recorded.setdefault(m["model"], {"base": m["base"], "runs": {}})
            for r in m["runs"]:
                steps = 1000 if r["column"].endswith("_1000") else 300
                entry["runs"][(steps, r["column"].removesuffix("_1000"), r["candidate"], r["seed"])] = r
            if path.name == TRANSFER_FOLDER:
                transfer.add(m["model"])
    cells, deviation = {}, 0.0
    for m in load(folder)[0]:
        rec = recorded[m["model"]]
        # the same trained model as the recording's: its losses before any insertion
        deviation = max(deviation, max(abs(m["base"][k] - rec["base"][k]) for k in m["base"]))
        runs = {(r["steps_recipe"], r["column"], r["candidate"], r["seed"]): r for r in m["runs"]}
        for steps, column, seed in sorted({(k[0], k[1], k[3]) for k in runs}):
            T = runs[(steps, column, m["candidates"][0], seed)]["T"]
            even, compressed, target = [], [], []
            for c in m["candidates"]:
                others = [r for k, r in rec["runs"].items() if k[:3] == (steps, column, c) and k[3] != seed]
                even.append(_at(rec["runs"][(steps, column, c, seed)], "heldout", T))
                compressed.append(_at(runs[(steps, column, c, seed)], "heldout", T))
                target.append(float(np.mean([_at(r, "test", steps) for r in others])))
            group = "transfer sets" if m["model"] in transfer else "bench sets"
            for key in (f"{steps}/{column}/{group}", f"{steps}/every column/{group}"):
                cell = cells.setdefault(key, {"within": {"even": [], "compressed": []},
                                              "best": {"even": [], "compressed": []}})
                for name, pred in (("even", even), ("compressed", compressed)):
                    if (w := _spearman(pred, target)) is not None:
                        cell["within"][name].append(w)
                    cell["best"][name].append(float(np.argmin(pred) == np.argmin(target)))
    rows = {key: {"n_decisions": len(cell["best"]["even"]),
                  **{f"{k}_{name}": float(np.mean(v[name])) if v[name] else None for k, v in cell.items() for name in v}}
            for key, cell in sorted(cells.items(), key=lambda kv: (int(kv[0].split("/")[0]), kv[0]))}
    return {"max_base_deviation": deviation, "rows": rows}


def all_scores(out: Path) -> dict:
    models, sweeps, meta = load(out)
    models = attach_sensitivity(models, out.parent / SENSITIVITY_FOLDER)
    insts = instances(models)
    errors = larger_heldout(out)
    cals = lomo_calibrations(insts, errors)
    targets = sorted({(i["column"], i["steps"]) for i in insts})
    by_target = {f"{c}/{s}": {m: score([i for i in insts if (i["column"], i["steps"]) == (c, s)], cals, m)
                              for m in scored_methods(insts)} for c, s in targets}
    long = [i for i in insts if i["steps"] in LONG]
    full = fit(insts, "every bench model set", error_insts=errors)
    result = {"meta": meta, "sets": sorted({i["set"] for i in insts}),
              "models": sorted({i["model"] for i in insts}),
              "calibrations_lomo": {s: c.to_dict() for s, c in cals.items()},
              "calibration_all": full.to_dict(),
              "by_target": by_target,
              "long": {m: score(long, cals, m) for m in scored_methods(long)}, "long_steps": sorted({i["steps"] for i in long}),
              "long_by_set": {s: score([i for i in long if i["set"] == s], cals, "decide") for s in cals},
              "in_sample_long": score(long, {s: full for s in cals}, "decide"),
              "sweeps": sweep_scores(sweeps, full), "loops": loop_scores(out, sweeps)}
    if (sized := larger_size_scores(out, cals)) is not None:
        result["larger_size"] = sized
    if (transfer := transfer_scores(out)) is not None:
        result["transfer_sets"] = transfer
    if (compressed := compressed_scores(out)) is not None:
        result["compressed_trials"] = compressed
    large = large_heldout_folder(out)
    if large.is_dir() and len({m["set"] for m in load(large)[0]}) >= 2:
        result["large_heldout"] = large_heldout_scores(large, models)
    longer = out.parent / BENCH_1000_FOLDER
    if longer.is_dir():  # 1000-step runs, kept out of every fit: each set scored with the calibration of the others
        models_1000 = attach_sensitivity(load(longer)[0], out.parent / SENSITIVITY_FOLDER)
        insts_1000 = [i for i in instances(models_1000) if i["steps"] == 1000]
        result["transfer_1000"] = {m: score(insts_1000, cals, m) for m in scored_methods(insts_1000)}
        result["transfer_1000_sets"] = sorted({i["set"] for i in insts_1000})
        result["transfer_1000_by_column"] = {c: score([i for i in insts_1000 if i["column"] == c], cals, "decide")
                                             for c in sorted({i["column"] for i in insts_1000})}
        # successive halving at 1000 steps, with its own leave-one-set-out calibrations (fitted on its 300-step trials)
        halving_cals = lomo_calibrations(instances(models, "halving"), larger_heldout(out, "halving"))
        halving_1000 = [i for i in instances(load(longer)[0], "halving") if i["steps"] == 1000]
        result["transfer_1000_halving_by_column"] = {
            "every column": score(halving_1000, halving_cals, "decide"),
            **{c: score([i for i in halving_1000 if i["column"] == c], halving_cals, "decide")
               for c in sorted({i["column"] for i in halving_1000})}}
    return result


def tables(out: Path) -> str:
    res = all_scores(out)
    (out.parent / "decision_validity_scores.json").write_text(json.dumps(res, indent=1, default=float))
    lines = [f"Model sets: {', '.join(res['sets'])} ({len(res['models'])} models). Calibration fitted leave one "
             "model set out; every number below is on the set left out.\n"]
    head = ("| method | pooled Spearman | within-model Spearman | best picked | pick gain / best | mean pick gain / "
            "mean best | decision gain (% of test loss) | harms flagged | sign right (clear) | Brier skill | "
            "max reliability gap |")
    rule = "|---" * 11 + "|"

    def row(name, s):
        return (f"| {name} | {_f(s['spearman_pooled'])} | {_f(s['spearman_within'])} | {_f(s['best_picked'], True)} | "
                f"{_f(s['pick_gain_ratio'], True)} | {_f(s['pick_gain_of_means'], True)} | "
                f"{100 * s['decision_gain']:+.2f} | {s['harms_flagged']}/{s['harms']} | {_f(s['sign_right'], True)} of {s['clear']} | "
                f"{_f(s.get('brier_skill'), True)} | {_f(s.get('reliability_max_gap'))} |")

    lines += [f"**Long recipes ({', '.join(map(str, res['long_steps']))} steps), every column "
              "pooled**\n", head, rule]
    lines += [row(m, v) for m, v in res["long"].items()]
    for target, scores in res["by_target"].items():
        n = scores["decide"]
        lines += [f"\n**{target}** ({n['n_decisions']} decisions, {n['n_insertions']} insertions)\n", head, rule]
        lines += [row(m, v) for m, v in scores.items()]
    if "transfer_1000" in res:
        n = res["transfer_1000"]["decide"]
        columns = ", ".join(res["transfer_1000_by_column"])
        lines += [f"\n**1000 steps ({columns}), {', '.join(res['transfer_1000_sets'])}** ({n['n_decisions']} "
                  f"decisions, {n['n_insertions']} insertions; runs kept out of every fit, each set scored with the "
                  "calibration fitted on the other sets' 300-step runs)\n", head, rule]
        lines += [row(m, v) for m, v in res["transfer_1000"].items()]
        lines += ["\n**1000 steps by column (decide)**\n", head, rule]
        lines += [row(c, v) for c, v in res["transfer_1000_by_column"].items()]
        lines += ["\n**1000 steps with `schedule=\"halving\"`** (its own calibrations, fitted leave one model set out on "
                  "halving's 300-step trials)\n", head, rule]
        lines += [row(c, v) for c, v in res["transfer_1000_halving_by_column"].items()]
    if "large_heldout" in res:
        lh = res["large_heldout"]
        lines += [f"\n**A held-out split 4 times the bench's** (`--large-heldout`; 300 steps, "
                  f"{', '.join(lh['columns'])}; {', '.join(lh['sets'])}; the same models and trials, each read on the "
                  "bench's held-out split and on one 4 times larger, its first quarter the bench's; calibrations "
                  "fitted leave one model set out; the largest difference of a recorded "
                  f"change from the bench's recording: {lh['max_deviation_from_recording']:.1e})\n", head, rule]
        lines += [row(name, v) for name, v in lh["rows"].items()]
        lines += ["\nClose calls (`InsertionDecision.close_call`: the choice leads its runner-up by less than the "
                  "standard error of the difference, paired over the held-out samples; recorded with `--large-heldout`)"
                  "\n", *_close_call_table({n: v for n, v in lh["rows"].items() if v.get("choices_with_paired_margin")})]
    if "larger_size" in res:
        ls = res["larger_size"]
        lines += [f"\n**A held-out split {ls['factor']} times the bench's** (`--large-heldout {ls['factor']}`; 300 steps; "
                  f"{', '.join(ls['sets'])}: digits has too few images; no fit reads this split: every set scored "
                  "with the shipped procedure's calibration fitted on the other sets at the bench's size and 4 times "
                  f"it; the largest difference of a recorded change from the bench's recording: "
                  f"{ls['max_deviation_from_recording']:.1e})\n", head, rule]
        lines += [row(name, v) for name, v in ls["rows"].items()]
        lines += ["", *_close_call_table({n: v for n, v in ls["rows"].items() if n.startswith("decide")},
                                         coverage=True)]
    if "transfer_sets" in res:
        ts = res["transfer_sets"]
        for steps, rows in ts["lengths"].items():
            n = rows["every set"]["decide"]
            lines += [f"\n**Transfer sets, {steps} steps** ({', '.join(ts['sets'])}: architectures and data no fit "
                      f"reads; {', '.join(rows['columns'])}; {n['n_decisions']} decisions, {n['n_insertions']} "
                      "insertions; decided with the calibrations `decide` ships, fitted on every bench model set)\n",
                      head, rule]
            lines += [row(m, v) for m, v in rows["every set"].items()]
            lines += [row('decide, `schedule="halving"`', rows["halving"])]
            lines += [row(f"decide: {k}", v) for k, v in {**rows["by set"], **rows["by column"]}.items()]
        if "large_heldout" in ts:
            lh = ts["large_heldout"]
            lines += ["\n**Transfer sets with a held-out split 4 times theirs** (`--large-heldout`; 300 steps; the "
                      "same models and trials, each also read on a split 4 times larger, its first quarter the "
                      "recorded one; the shipped calibration; the largest difference of a recorded change from the "
                      f"transfer recording: {lh['max_deviation_from_recording']:.1e})\n", head, rule]
            lines += [row(name, v) for name, v in lh["rows"].items()]
        if ts["sweeps"]:
            lines += ["\n**Transfer depth sweeps** (residual MLPs and GPT-2 decoders of 1-6 blocks trained from "
                      "scratch, `--part sweeps-transfer-*`; the per-depth decision with the calibration `decide` "
                      "ships)\n", *_sweep_table(ts["sweeps"])]
        if ts["loops"]:
            lines += ["\n**Transfer growth loops** from each transfer sweep's depth-1 model (`--part loops-transfer-*`; "
                      "the GPT-2 loops insert the model's own layer, the residual MLP loops the `auto` family's "
                      "zero-output residual)\n", *_loop_table(ts["loops"])]
    if "compressed_trials" in res:
        ct = res["compressed_trials"]
        lines += ["\n**Time-compressed trials** (`--compressed`, an experiment: the even plan's `T` steps trained at "
                  "`lr * S / T` instead of `lr`, the same models, seeds and targets; the largest difference of a "
                  f"model's losses from the recording's: {ct['max_base_deviation']:.1e}; rankings only, no "
                  "calibration)\n",
                  "| recipe / column / sets | decisions | within-model: even plan | within-model: compressed | "
                  "best picked: even plan | best picked: compressed |", "|---|---|---|---|---|---|"]
        lines += [f"| {key} | {v['n_decisions']} | {_f(v['within_even'])} | {_f(v['within_compressed'])} | "
                  f"{_f(v['best_even'], True)} | {_f(v['best_compressed'], True)} |" for key, v in ct["rows"].items()]
    lines += ["\n**Per model set, long recipes (decide)**\n", head, rule]
    lines += [row(s, v) for s, v in res["long_by_set"].items()]
    rel = res["long"]["decide"].get("reliability", [])
    lines += ["\n**Reliability of P(decrease), long recipes** (bin: mean P, realized frequency, n)\n",
              "| bin | mean P(decrease) | share that decreased | bootstrap 95% interval of the share | n |",
              "|---|---|---|---|---|"]
    lines += [f"| {b['bin'][0]:.1f}-{b['bin'][1]:.1f} | {b['mean_p']:.2f} | {b['frequency']:.2f} | "
              f"{b['frequency_95'][0]:.2f}-{b['frequency_95'][1]:.2f} | {b['n']} |" for b in rel]
    lines += [f"\n95% interval coverage (long recipes): {_f(res['long']['decide'].get('coverage_95'), True)}\n",
              "**Depth sweeps** (calibration fitted on every insertion set; no sweep model is in it)\n",
              *_sweep_table(res["sweeps"])]
    if res["loops"]:
        lines += ["\n**The growth loop** from each sweep's depth-1 model (`--part loops-*`; the text loops insert the "
                  "model's own layer, the image loops the `conv` family's zero-output residual; rounds: where the block "
                  "went, the held-out change after training the grown model, kept or rolled back)\n",
                  *_loop_table(res["loops"])]
    return "\n".join(lines)


def _loop_table(loops: list) -> list:
    """Markdown lines: each growth loop's rounds and stop beside its scratch sweep, and the tally."""
    lines = ["| loop | rounds | stops at (why) | scratch sweep's best | within one block | best of the loop's own "
             "models | test loss, start -> end (scratch best's) |", "|---|---|---|---|---|---|---|"]
    for lp in loops:
        rounds = "; ".join(f"{r['inserted_at']} {r['heldout_change']:+.3f} "
                           f"({'rolled back' if r['rolled_back'] else 'kept'})"
                           for r in lp["rounds"] if r["inserted_at"] is not None) or "none inserted"
        lines.append(f"| {lp['loop']} | {rounds} | {lp['final_depth']} ({lp['stop_reason']}) | {lp['scratch_best']} | "
                     f"{'yes' if lp['within_one'] else 'no'} | {lp['own_best']} | "
                     f"{lp['start_test_loss']:.3f} -> {lp['final_test_loss']:.3f} ({lp['scratch_best_test_loss']:.3f}) |")
    shallow = [lp for lp in loops if lp["scratch_best"] == 1]
    lines.append(f"\nWithin one block of the scratch sweep's best: {sum(lp['within_one'] for lp in loops)} "
                 f"of {len(loops)} loops; of the {len(shallow)} whose scratch best is the shallowest, "
                 f"{sum(lp['within_one'] for lp in shallow)}.")
    return lines


def _close_call_table(rows: dict, coverage: bool = False) -> list:
    """Markdown lines: per decision row, its close calls among the choices with a runner-up and how often each kind
    chose the best candidate (``coverage``: its 95% interval coverage first)."""
    lines = [f"| decision |{' 95% coverage |' if coverage else ''} close calls / choices with a runner-up | "
             "best chosen: close calls | best chosen: the others |", "|---" * (5 if coverage else 4) + "|"]
    for name, v in rows.items():
        cover = f" {_f(v.get('coverage_95'), True)} |" if coverage else ""
        lines.append(f"| {name} |{cover} {v['close_calls']} / {v['choices_with_paired_margin']} | "
                     f"{_f(v['best_chosen_close'], True)} | {_f(v['best_chosen_clear'], True)} |")
    return lines


def _sweep_table(sweeps: list) -> list:
    """Markdown lines: each sweep's test losses by depth, realized best depth and stop, and the tally."""
    lines = ["| sweep | test loss by depth | realized best depth | decide stops at | within one block |",
             "|---|---|---|---|---|"]
    for sw in sweeps:
        losses = ", ".join(f"{d['test_loss']:.3f}" for d in sw["depths"])
        lines.append(f"| {sw['sweep']} | {losses} | {sw['best_depth']} | {sw['stop_depth']} | "
                     f"{'yes' if sw['within_one'] else 'no'} |")
    shallow = [sw for sw in sweeps if sw["best_is_shallowest"]]
    lines.append(f"\nWithin one block: {sum(sw['within_one'] for sw in sweeps)} of {len(sweeps)} sweeps; "
                 f"of the {len(shallow)} whose best depth is the shallowest, {sum(sw['within_one'] for sw in shallow)}.")
    return lines


CALIBRATION_PROVENANCE = {
    "written_by": "python -m studies.decision_validity --fit",
    "fitted_on": "the long recipes (300 steps) of every model set of the decision bench, one calibration per trial "
                 "schedule of decide: 'default' on the even plan's trials, 'halving' on successive halving's; the "
                 "error model (scale, residual quantiles, logistic) on the same trials read at two held-out sizes, "
                 "the bench's and 4 times it",
    "stop_tolerance": "generalization_gap_fraction fitted (the stop tolerance's share of the model's held-out minus "
                      "training loss before insertion); tolerance (a share of the held-out loss) 0: a user's",
    "evidence": "docs/predictive-validity.md scores the same fitting procedure leave one model set out and on "
                "transfer sets no fit reads",
}
# what the bench's held-out scores say of a recipe's optimizer, printed under such decisions (docs/predictive-validity.md)
SHIPPED_OPTIMIZER_NOTES = {
    "sgd": "on the decision bench and its transfer sets the short trials of SGD recipes ranked the candidates worst "
           "and their P(decrease) was the least reliable of the recipes tried (docs/predictive-validity.md): read "
           "P(decrease) as a ranking there",
}


def heldout_sample_range(out: Path) -> tuple[int, int]:
    """The fewest and most held-out samples a fitted trial was read on: each model set part's probe split (images,
    or windows), at the bench's size in ``out`` and times the factor in the ``--large-heldout`` folder next to it."""
    counts = set()
    for folder in (out, large_heldout_folder(out)):
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            data = json.loads(path.read_text())
            if not data.get("models"):
                continue
            sizes, part = data["sizes"], data["part"]
            n = sizes["images"][part][2] if part in sizes["images"] else sizes["llama"]["windows"][1]
            counts.add(n * sizes.get("large_heldout_factor", 1))
    return min(counts), max(counts)


def fit_and_write(out: Path, target: Path) -> dict:
    """The shipped calibrations, one per trial schedule (each fitted on the long recipes of every model set under
    its own schedule, the error model on the trials read at both held-out sizes), written to ``target``."""
    models, _, _ = load(out)
    sets = ", ".join(sorted({m["set"] for m in models}))
    cals = {name: fit(instances(models, schedule), f"studies/decision_validity.py, the long recipes of every model "
                                                   f"set ({sets}), {schedule} trials; the error model also on "
                                                   "their trials read on a held-out split 4 times the bench's",
                      error_insts=larger_heldout(out, schedule))
            for name, schedule in (("default", "even"), ("halving", "halving"))}
    low, high = heldout_sample_range(out)
    entries = {}
    for name, cal in cals.items():
        entry = cal.to_dict()
        # the file keeps six decimals of the residual quantiles (the fit's own resolution), as it always has
        entry.update(quantiles=[round(q, 6) for q in cal.quantiles], heldout_samples=[low, high],
                     optimizer_notes=dict(SHIPPED_OPTIMIZER_NOTES))
        entries[name] = entry
    document = {"format": CALIBRATION_FORMAT, "provenance": CALIBRATION_PROVENANCE, "calibrations": entries}
    target.write_text(json.dumps(document, indent=1) + "\n")
    return cals
