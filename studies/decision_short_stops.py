"""Why the decision stops short on the transfer sets, and stop rules scored against it (``python -m
studies.decision_validity --short-stops``).

:func:`anatomy` lists every stop where the realized best gain exceeds 3 seed standard deviations (the must-show's
*short stops*), per trialled candidate: the trial's held-out and training change at its checkpoints with their
paired standard errors, the candidate's realized change (the other seeds' mean test change at the recipe's length),
the seed noise, the trial seed's own full-length run read on the held-out split, the optimizer and the model; and
sorts each stop by what the recordings say caused it (:func:`cause`).

:data:`SHORT_STOP_RULES` are rules that could remove those stops, none of them among the readouts and stop rules
scored before (``--readouts``, ``--stop-rules``): a stop replaced by an insertion where the trials do not show
saturation (the trialled candidate of lowest held-out change, an *unverified gain*), alone or where that candidate's
training loss falls credibly (the trial's training curve as a second reading), on every recipe or on SGD's alone; and
the stop tolerance read against the change carried to the recipe's length (a carry factor fitted on the bench, or
the trial's trend).  Each rule's constant is fitted as the shipped threshold is (the largest mean realized gain of the
decisions, long recipes), leave one bench set out for the bench's columns and on every bench set for the transfer
sets and the depth sweeps, which no fit reads; the predictions, intervals and ``P(decrease)`` are the shipped ones,
so every ranking and calibration score is unchanged under each rule (the table shows them).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from satcore._decisions.calibration import DEFAULT_CALIBRATION
from satcore._decisions.trials import extrapolate
from studies.decision_scores import (CLEAR_GAIN_NOISE, LONG, _decide, _f, _mean_decision_gain, _stop_rule_row,
                                     _stop_rule_setting, _trialled)

Z95 = 1.959963984540054  # the 95% level's normal quantile, as the held-out resolution reads it
SHOCK_TRAINING_SE = 3  # a trial whose training loss rose beyond this many standard errors at its end: unstable


def _column_calibrations(setting: dict, label: str) -> dict:
    """The calibration each decision of a scored column is decided with: its set's leave-one-out fit on the bench,
    the shipped one on the transfer sets."""
    return setting["cals"] if label.startswith("bench") else dict.fromkeys(setting["transfer_sets"],
                                                                          DEFAULT_CALIBRATION)


def _is_clear(inst) -> bool:
    best = min(inst["rows"], key=lambda r: r["target"])
    return -best["target"] > CLEAR_GAIN_NOISE * best["seed_sd"]


def cause(inst, decision) -> str:
    """What the recordings say made a short stop: ``"unstable trial"`` (some trial's training loss rose beyond
    :data:`SHOCK_TRAINING_SE` standard errors while the realized change at its place is a decrease: the first
    steps of an SGD trial), ``"held-out split disagrees"`` (the trial seed's own run trained the recipe's whole length
    raises the held-out loss at every candidate, so no reading of that run's prefix shows the gain),
    ``"gain below what the split resolves"`` (that run's best held-out decrease is below the stop tolerance or
    within one of its trial's standard errors), else ``"trial too short"`` (the full run shows the gain on the
    held-out split; the trial at a quarter of it does not)."""
    rows = _trialled(inst)
    if any(r["curve"].training_change[-1] > SHOCK_TRAINING_SE * r["train_se"] and r["target"] < 0 for r in rows):
        return "unstable trial"
    full = min(rows, key=lambda r: r["own_heldout"])
    if full["own_heldout"] >= 0:
        return "held-out split disagrees"
    if -full["own_heldout"] < max(decision.stop_tolerance, full["curve"].heldout_se):
        return "gain below what the split resolves"
    return "trial too short"


def anatomy(setting: dict) -> dict:
    """Per scored column, every short stop of the shipped decision (each bench set with its leave-one-out
    calibration, the transfer sets with the shipped one) with its trials' curves and outcomes, and the count per
    :func:`cause`."""
    out = {}
    for label, chosen in setting["columns"].items():
        cals = _column_calibrations(setting, label)
        stops = []
        for inst in chosen:
            d = _decide(inst, cals[inst["set"]])
            if d.choice is not None or not _is_clear(inst):
                continue
            stops.append({
                "model": inst["model"], "column": inst["column"], "seed": inst["seed"], "steps": inst["steps"],
                "optimizer_family": inst["optimizer_family"], "stop_reason": d.stop_reason,
                "stop_tolerance": d.stop_tolerance, "base_heldout": inst["base_heldout"],
                "base_train": inst["base_train"], "cause": cause(inst, d),
                "candidates": [{"candidate": r["candidate"], "checkpoints": list(r["curve"].steps),
                                "heldout_change": list(r["curve"].heldout_change), "heldout_se": r["curve"].heldout_se,
                                "training_change": list(r["curve"].training_change), "training_se": r["train_se"],
                                "p_decrease": d.candidates[r["candidate"]].p_decrease, "realized": r["target"],
                                "seed_sd": r["seed_sd"], "full_run_heldout": r["own_heldout"]}
                               for r in _trialled(inst)]})
        causes = {}
        for s in stops:
            causes[s["cause"]] = causes.get(s["cause"], 0) + 1
        out[label] = {"stops": stops, "causes": causes}
    return out


# -- rules ----------------------------------------------------------------------------------------------------------
def _unresolved(decision) -> bool:
    return decision.stop_reason == "heldout_too_small"


def _decrease_not_excluded(decision) -> bool:
    """Some verified candidate's 95% held-out interval reaches below 0: a stop that does not show saturation at any
    tolerance (the shipped resolution reads it at the stop tolerance)."""
    return any(c.trial is not None and not c.eliminated and c.trial.heldout_change[-1] - Z95 * c.trial.heldout_se < 0
               for c in decision.candidates.values())


def _training_falls(row, x, floor: float = 0.0) -> bool:
    """The trial's training loss fell by more than ``x`` paired standard errors and by more than ``floor`` (loss
    units) at its end (``x`` None: no gate)."""
    return x is None or row["curve"].training_change[-1] < -max(x * row["train_se"], floor)


def _insert_unverified(which_stops, families=("adam", "sgd"), material: bool = False):
    """A rule replacing a stop by the insertion of the trialled candidate of lowest held-out change (an unverified
    gain) among those whose training loss falls by more than ``x`` standard errors (:func:`_training_falls`; with
    ``material``, by more than the stop tolerance too: a block whose training gain is below it would not pay even on
    the training split), at the stops ``which_stops(decision)`` selects, on the recipes of ``families``."""
    def rule(inst, calibration, x):
        d = _decide(inst, calibration)
        if d.choice is not None or inst["optimizer_family"] not in families or not which_stops(d):
            return d
        floor = d.stop_tolerance if material else 0.0
        rows = [r for r in _trialled(inst) if r["may_choose"] and _training_falls(r, x, floor)]
        if not rows:
            return d
        pick = min(rows, key=lambda r: r["curve"].heldout_change[-1])["candidate"]
        return dataclasses.replace(d, choice=pick, stop_reason=None, heldout_resolution=None,
                                   heldout_samples_needed=None, heldout_binding_candidate=None)
    return rule


def _carried_stop(carry):
    """A rule reading the stop tolerance against the credible candidate's decrease carried to the recipe's length,
    ``carry(inst, row, x)`` (loss units; the choice, the threshold and ``P(decrease)`` unchanged)."""
    def rule(inst, calibration, x):
        d = _decide(inst, calibration)
        if d.choice is not None:
            return d
        credible = [r for r in _trialled(inst) if r["may_choose"]
                    and d.candidates[r["candidate"]].p_decrease >= calibration.p_threshold]
        if not credible:
            return d
        row = min(credible, key=lambda r: d.candidates[r["candidate"]].predicted_heldout_change)
        if -carry(inst, row, x) < d.stop_tolerance:
            return d
        return dataclasses.replace(d, choice=row["candidate"], stop_reason=None, heldout_resolution=None,
                                   heldout_samples_needed=None, heldout_binding_candidate=None)
    return rule


def fit_carry(insts) -> float:
    """The carry from the trial's end to the recipe's length: the median over the long recipes' trialled candidates
    whose trial lowered the held-out loss and whose realized change is a decrease beyond its seed range of the
    realized change over ``d(T)``."""
    ratios = [r["target"] / r["curve"].heldout_change[-1] for i in insts if i["steps"] in LONG for r in _trialled(i)
              if r["curve"].heldout_change[-1] < 0 and -r["target"] > r["spread"]]
    return float(np.median(ratios))


TRAINING_SE = (None, 1.0, 2.0, 3.0, 5.0)  # the training gate's grid (None: no gate)
TREND_WEIGHTS = (0.5, 1.0, 2.0)
SGD = ("sgd",)
SGD_RULE = "the same, SGD recipes (meets the line on the transfer sets)"
# each rule: (decider of (inst, calibration, x), the grid x is fitted on, or a fitter of x on the fit's decisions)
SHORT_STOP_RULES = {
    "unresolved stops: insert the trialled candidate of lowest held-out change (an unverified gain)":
        (_insert_unverified(_unresolved), (None,)),
    "unresolved stops: the same where its training loss falls by more than x SEs":
        (_insert_unverified(_unresolved), TRAINING_SE[1:]),
    "unresolved stops, SGD recipes: training falling by more than x SEs":
        (_insert_unverified(_unresolved, SGD), TRAINING_SE[1:]),
    "unresolved stops: training falling by more than x SEs and the stop tolerance":
        (_insert_unverified(_unresolved, material=True), TRAINING_SE[1:]),
    "unresolved stops, SGD recipes: training falling by more than x SEs and the stop tolerance":
        (_insert_unverified(_unresolved, SGD, material=True), TRAINING_SE[1:]),
    "any stop a 95% held-out interval below 0 leaves open: training falling by more than x SEs (or not gated)":
        (_insert_unverified(_decrease_not_excluded), TRAINING_SE),
    "the same, SGD recipes":
        (_insert_unverified(_decrease_not_excluded, SGD), TRAINING_SE),
    "any stop a 95% held-out interval below 0 leaves open: training falling by more than x SEs and the stop tolerance":
        (_insert_unverified(_decrease_not_excluded, material=True), TRAINING_SE[1:]),
    SGD_RULE: (_insert_unverified(_decrease_not_excluded, SGD, material=True), TRAINING_SE[1:]),
    "stop tolerance against d(T) times the carry to the recipe's length (the median realized change over d(T))":
        (_carried_stop(lambda inst, row, x: x * row["curve"].heldout_change[-1]), fit_carry),
    "stop tolerance against d(T) carried along its trend per doubling, weight x":
        (_carried_stop(lambda inst, row, x: extrapolate(row["curve"], inst["steps"], x)), TREND_WEIGHTS),
}


def fit_rule(insts, calibrations, rule: str):
    """``x`` of ``rule`` fitted as the shipped threshold is: the largest mean realized gain of the long recipes'
    decisions of ``insts`` (each with its set's calibration in ``calibrations``), ties to the first ``x`` of the
    grid; a fitter instead of a grid is called on the decisions."""
    decide_with, grid = SHORT_STOP_RULES[rule]
    insts = [i for i in insts if i["steps"] in LONG]
    if callable(grid):
        return grid(insts)
    scored = [(_mean_decision_gain(insts, None, lambda inst, _, x=x: decide_with(inst, calibrations[inst["set"]], x)),
               -k, x) for k, x in enumerate(grid)]
    return max(scored, key=lambda s: s[:2])[2]


def _outcomes(setting: dict, decider, label: str) -> dict:
    """Of a column's decisions under ``decider``: blocks inserted that raise the test loss beyond their seed range
    (clear harms inserted), and true saturations (realized best gain within one seed standard deviation) that
    insert."""
    cals = _column_calibrations(setting, label)
    harms = saturations = inserting = 0
    for inst in setting["columns"][label]:
        d = decider(inst, cals[inst["set"]])
        if d.choice is None:
            continue
        row = next(r for r in inst["rows"] if r["candidate"] == d.choice)
        harms += row["target"] > row["spread"]
        best = min(inst["rows"], key=lambda r: r["target"])
        saturations += -best["target"] <= best["seed_sd"]
        inserting += 1
    return {"harms_inserted": harms, "saturations_inserting": saturations, "insertions": inserting}


def rule_scores(setting: dict, rule: str) -> dict:
    """One rule fitted (:func:`fit_rule`) and scored as the stop rules are (:func:`studies.decision_scores.
    _stop_rule_row`), with :func:`_outcomes` per column."""
    decide_with = SHORT_STOP_RULES[rule][0]
    insts, cals = setting["insts"], setting["cals"]
    held = {s: fit_rule([i for i in insts if i["set"] != s], cals, rule) for s in cals}
    every = fit_rule(insts, {s: setting["full"] for s in cals}, rule)
    params = {**held, **dict.fromkeys(setting["transfer_sets"], every), None: every}

    def decider(inst, calibration):
        return decide_with(inst, calibration, params[inst.get("set")])

    row = _stop_rule_row(setting, decider, cals, DEFAULT_CALIBRATION, (setting["full"], DEFAULT_CALIBRATION))
    for label in row["columns"]:
        row["columns"][label] |= _outcomes(setting, decider, label)
    return {"fitted_left_out": held, "fitted_every_set": every, **row}


def shipped_scores(setting: dict) -> dict:
    """The shipped decision scored as the rules are."""
    row = _stop_rule_row(setting, _decide, setting["cals"], DEFAULT_CALIBRATION, (setting["full"], DEFAULT_CALIBRATION))
    for label in row["columns"]:
        row["columns"][label] |= _outcomes(setting, _decide, label)
    return {"fitted_left_out": None, "fitted_every_set": None, **row}


def short_stop_scores(out: Path) -> dict:
    """:func:`anatomy` and every rule of :data:`SHORT_STOP_RULES` beside the shipped decision."""
    setting = _stop_rule_setting(out)
    return {"anatomy": anatomy(setting),
            "rules": {"shipped": shipped_scores(setting),
                      **{rule: rule_scores(setting, rule) for rule in SHORT_STOP_RULES}}}


def _constant(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def render(res: dict) -> str:
    """The tables of :func:`short_stop_scores`: the causes of the short stops per column, the transfer sets' short
    stops one by one, and the rules' scores."""
    anat = res["anatomy"]
    labels = list(anat)
    causes = sorted({c for a in anat.values() for c in a["causes"]})
    lines = ["| column | short stops | " + " | ".join(causes) + " |", "|---" * (2 + len(causes)) + "|"]
    for label in labels:
        a = anat[label]
        lines.append(f"| {label} | {len(a['stops'])} | " + " | ".join(str(a["causes"].get(c, 0)) for c in causes) + " |")
    lines += ["", "| column | model | recipe | trial seed | stop | cause | stop tolerance | candidate: held-out change at "
              "the checkpoints (SE) / training change (SE) / realized (seed SD) / full run on the held-out split |",
              "|---" * 8 + "|"]
    for label in labels:
        if not label.startswith("transfer"):
            continue
        for s in anat[label]["stops"]:
            cands = "; ".join(
                f"{c['candidate']}: {', '.join(f'{v:+.4f}' for v in c['heldout_change'])} ({c['heldout_se']:.4f}) / "
                f"{c['training_change'][-1]:+.4f} ({c['training_se']:.4f}) / {c['realized']:+.4f} ({c['seed_sd']:.4f}) / "
                f"{c['full_run_heldout']:+.4f}" for c in s["candidates"])
            lines.append(f"| {label} | {s['model']} | {s['column']} | {s['seed']} | {s['stop_reason']} | {s['cause']} | "
                         f"{s['stop_tolerance']:.4f} | {cands} |")
    lines += ["", "| rule | fitted: left out (digits, fashion, llama-linux, llama-pydoc) / every set | stops over 3 times "
              "the seed noise: " + " / ".join(labels) + " | sweeps within one block: bench / transfer | clear harms "
              "inserted | true saturations inserting | within-model Spearman | best picked | harms flagged | signs | "
              "largest reliability gap | decision gain (% of the test loss) |", "|---" * 12 + "|"]
    for name, row in res["rules"].items():
        cols = [row["columns"][c] for c in labels]
        fitted = ("-" if row["fitted_every_set"] is None else
                  ", ".join(_constant(v) for v in row["fitted_left_out"].values()) + " / "
                  + _constant(row["fitted_every_set"]))
        lines.append(" | ".join([
            f"| {name}", fitted,
            ", ".join(f"{a}/{b} ({100 * a / b:.0f}%)" for a, b in (c["stops_over_noise"] for c in cols)),
            " / ".join(f"{sum(w['within_one'] for w in row[k])}/{len(row[k])}" for k in ("sweeps", "transfer_sweeps")),
            *(", ".join(fmt(c[key]) for c in cols) for key, fmt in (
                ("harms_inserted", str), ("saturations_inserting", str),
                ("spearman_within", lambda v: f"{v:+.2f}"), ("best_picked", lambda v: _f(v, True)),
                ("harms_flagged", str), ("sign_right", lambda v: _f(v, True)), ("reliability_max_gap", _f),
                ("decision_gain", lambda v: f"{100 * v:+.2f}")))]) + " |")
    return "\n".join(lines)


def short_stops(out: Path) -> str:
    """``--short-stops``: :func:`short_stop_scores` written beside ``out`` and rendered."""
    res = short_stop_scores(out)
    (out.parent / "decision_validity_short_stops.json").write_text(json.dumps(res, indent=1, default=float))
    return render(res)
