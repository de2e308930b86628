"""Readouts of the trial curve tried against the decision's short stops (``python -m studies.decision_validity
--readouts``), and what bounds those stops: the trial seed's own full-length run read on the held-out split.

A *readout* turns a trial's recorded curve into the curve the decision prices (:func:`after_first_checkpoint`:
the change after the early shock of an SGD trial; :func:`training_priced`: the held-out change scaled by the
training curve carried to the recipe's length).  Each is scored as the stop rules are
(:func:`studies.decision_scores._stop_rule_row`: stops where the realized best gain is clear, sweeps within one
block, every other target), with the calibration fitted on the readout's trials leave one bench set out (scored on
the set left out, at 300 steps and on the 1000-step recordings no fit reads) and on every bench set (the transfer
sets and the sweeps), or with the shipped calibration kept, or with SGD's own calibration fitted on it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from satcore._decisions.calibration import DEFAULT_CALIBRATION
from satcore._decisions.trials import TrialCurve, extrapolate
from studies.decision_scores import (CLEAR_GAIN_NOISE, _decide, _f, _stop_rule_row,
                                     _stop_rule_setting, _trialled, fit, larger_heldout, lomo_calibrations,
                                     stops_over_noise, TRANSFER_FOLDER)

SHOCK_RISE = 0.0  # an SGD trial "rose at its first checkpoint" where its held-out change there exceeds this
TRAINING_PRICE_CAP = 4.0  # the largest factor the training curve may price a held-out decrease by
TEST_SE_CLEAR = 2  # a realized best gain the test split resolves: beyond this many paired test standard errors


def after_first_checkpoint(curve: TrialCurve, factor: float = 1.0) -> TrialCurve:
    """The trial's change measured from its first checkpoint, times ``factor``.

    ``d'(t) = factor (d(t) - d(t_1))`` for the held-out and the training change alike, ``t_1 = T/4`` the first
    checkpoint; the standard error scales by ``factor`` (that of ``d(T) - d(t_1)`` is not recorded: ``d(T)``'s
    stands in).  An SGD trial's first steps can raise the held-out loss (the shock of the first steps) where the
    recipe's whole length lowers it; this reads only what follows.

    Examples
    --------
    >>> c = TrialCurve((25, 50, 100), (0.004, 0.002, 0.001), (0.01, 0.0, -0.01), 0.002)
    >>> [round(v, 6) for v in after_first_checkpoint(c).heldout_change]
    [0.0, -0.002, -0.003]
    """
    h0, t0 = curve.heldout_change[0], curve.training_change[0]
    return TrialCurve(curve.steps, [factor * (v - h0) for v in curve.heldout_change],
                      [factor * (v - t0) for v in curve.training_change], factor * curve.heldout_se)


def late_priced(curve: TrialCurve, full_steps: int) -> TrialCurve:
    """:func:`after_first_checkpoint` carried to ``full_steps``: its change per doubling over the trial's last two
    doublings times the doublings from the first checkpoint to the recipe's length, ``log2(4 S / T) / 2``."""
    return after_first_checkpoint(curve, math.log2(4 * full_steps / curve.steps[-1]) / 2)


def after_a_rise(curve: TrialCurve) -> TrialCurve:
    """:func:`after_first_checkpoint` where the trial's held-out change rose at its first checkpoint, else the curve."""
    return after_first_checkpoint(curve) if curve.heldout_change[0] > SHOCK_RISE else curve


def training_priced(curve: TrialCurve, full_steps: int) -> TrialCurve:
    """A held-out decrease scaled by the training curve carried to ``full_steps``.

    ``k = min(cap, t(S) / t(T))`` with ``t(S) = t(T) + [t(T) - t(T/2)] log2(S/T)`` (the training change's trend
    per doubling, weight 1) where the training loss falls faster than at ``T``; the held-out curve and its standard
    error times ``k``; a rise, or a training curve that does not fall on, is left as it is."""
    t_end = curve.training_change[-1]
    t_full = extrapolate(curve, full_steps, 1.0, "training")
    if curve.heldout_change[-1] >= 0 or not t_end < 0 or not t_full < t_end:
        return curve
    k = min(TRAINING_PRICE_CAP, t_full / t_end)
    return TrialCurve(curve.steps, [k * v for v in curve.heldout_change], curve.training_change, k * curve.heldout_se)


def _readout(inst: dict, rule: tuple) -> dict:
    """``inst`` with each trial curve replaced by ``rule``'s readout where the recipe's optimizer family is one of
    the rule's (the paired standard errors, recorded for the raw curves, dropped)."""
    read, families = rule[0], rule[1]
    if inst["optimizer_family"] not in families:
        return inst
    return {**inst, "paired_se": None,
            "rows": [r if r["curve"] is None else {**r, "curve": read(r["curve"], inst["steps"])} for r in inst["rows"]]}


SGD, EVERY = ("sgd",), ("adam", "sgd")
# each rule: (readout of (curve, recipe steps), the optimizer families it reads, the calibration: "refit" (the whole
# calibration fitted on the readout's decisions, as the shipped one is), "kept" (the shipped one), "sgd" (SGD's own
# fitted on the readout's SGD decisions, Adam's and AdamW's the shipped))
READOUT_RULES = {
    "shipped: d(T), the shipped calibration": (lambda c, s: c, EVERY, "kept"),
    "SGD: the change after the first checkpoint": (lambda c, s: after_first_checkpoint(c), SGD, "refit"),
    "SGD: the change after the first checkpoint, carried to the recipe's length": (late_priced, SGD, "refit"),
    "SGD: the change after the first checkpoint where the trial rose there": (lambda c, s: after_a_rise(c), SGD, "refit"),
    "every optimizer: the change after the first checkpoint": (lambda c, s: after_first_checkpoint(c), EVERY, "refit"),
    "every optimizer: d(T) priced by the training curve at the recipe's length": (training_priced, EVERY, "refit"),
    "SGD: d(T) priced by the training curve at the recipe's length": (training_priced, SGD, "refit"),
    "SGD: the change after the first checkpoint, the shipped calibration": (lambda c, s: after_first_checkpoint(c), SGD,
                                                                           "kept"),
    "SGD: the change after the first checkpoint, SGD's own calibration": (lambda c, s: after_first_checkpoint(c), SGD,
                                                                         "sgd"),
    "SGD: the change after a rise at the first checkpoint, the shipped calibration": (lambda c, s: after_a_rise(c), SGD,
                                                                                      "kept"),
    "SGD: the change after a rise at the first checkpoint, SGD's own calibration": (lambda c, s: after_a_rise(c), SGD,
                                                                                   "sgd"),
}


def _constants(cal) -> tuple:
    return cal.trend_weight, cal.p_threshold, cal.generalization_gap_fraction


def readout_row(setting: dict, rule: tuple) -> dict:
    """One rule's scores (:func:`studies.decision_scores._stop_rule_row`) and the constants its fits chose
    (``(trend weight, threshold, gap fraction)`` per set left out, and on every set)."""
    mode = rule[2]
    if mode == "kept":
        def decider(inst, calibration):
            return _decide(_readout(inst, rule), calibration)

        return {"fitted_left_out": None, "fitted_every_set": None,
                **_stop_rule_row(setting, decider, setting["cals"], DEFAULT_CALIBRATION,
                                 (setting["full"], DEFAULT_CALIBRATION))}
    read = [_readout(i, rule) for i in setting["insts"]]
    errors = [_readout(i, rule) for i in setting["errors"]]
    if mode == "sgd":
        read = [i for i in read if i["optimizer_family"] == "sgd"]
        errors = [i for i in errors if i["optimizer_family"] == "sgd"]
    cals = lomo_calibrations(read, errors)
    every = fit(read, "every bench model set" + (", SGD recipes" if mode == "sgd" else ""), error_insts=errors)
    if mode == "refit":
        def decider(inst, calibration):
            return _decide(_readout(inst, rule), calibration)

        row = _stop_rule_row(setting, decider, cals, every, (every, every))
    else:
        def decider(inst, calibration):
            if inst["optimizer_family"] != "sgd":
                return _decide(inst, calibration)
            return _decide(_readout(inst, rule), cals.get(inst.get("set"), every))

        row = _stop_rule_row(setting, decider, setting["cals"], DEFAULT_CALIBRATION, (setting["full"], DEFAULT_CALIBRATION))
    return {"fitted_left_out": {s: _constants(c) for s, c in cals.items()}, "fitted_every_set": _constants(every), **row}


def stop_ceiling(setting: dict, large: dict) -> dict:
    """Per scored column, what bounds the shipped decision's stops where the realized best gain is clear
    (:func:`studies.decision_scores.stops_over_noise`): of those stops, how many the trial seed's own run trained the
    recipe's whole length would see as a decrease at some candidate on the held-out split the decision reads (no
    readout of a prefix of that run sees more without inserting where it rises), and on the split 4 times larger
    (``large``: column -> its decisions read there, where recorded); the shipped decision's stops read on that split;
    and the stops among the decisions whose best gain the test split resolves too (beyond :data:`TEST_SE_CLEAR`
    paired test standard errors, the mean over the target's seeds)."""
    out = {}
    for label, chosen in setting["columns"].items():
        cals = setting["cals"] if label.startswith("bench") else dict.fromkeys(setting["transfer_sets"], DEFAULT_CALIBRATION)
        on_large = {(i["model"], i["column"], i["seed"]): i for i in large.get(label, [])}
        stops, seen, seen_large, test_clear, test_clear_stops, gains_in_se = 0, 0, 0, 0, 0, []
        for inst in chosen:
            best = min(inst["rows"], key=lambda r: r["target"])
            if not -best["target"] > CLEAR_GAIN_NOISE * best["seed_sd"]:
                continue
            stopped = _decide(inst, cals[inst["set"]]).choice is None
            resolved = -best["target"] > TEST_SE_CLEAR * best["target_se"]
            test_clear += resolved
            test_clear_stops += stopped and resolved
            if not stopped:
                continue
            stops += 1
            gains_in_se.append(-best["target"] / best["target_se"])
            seen += any(r["own_heldout"] < 0 for r in _trialled(inst))
            twin = on_large.get((inst["model"], inst["column"], inst["seed"]))
            seen_large += twin is not None and any(r["own_heldout"] < 0 for r in _trialled(twin))
        out[label] = {"stops_over_noise": stops_over_noise(chosen, cals), "full_run_heldout_decrease": seen,
                      "larger_split": ({"full_run_heldout_decrease": seen_large,
                                        "stops_over_noise": stops_over_noise(large[label], cals)}
                                       if label in large else None),
                      "best_gain_in_test_se": [float(v) for v in gains_in_se],
                      "test_resolved": (test_clear_stops, test_clear)}
    return out


def readout_scores(out: Path) -> dict:
    """Every rule of :data:`READOUT_RULES` scored (:func:`readout_row`), and :func:`stop_ceiling`."""
    setting = _stop_rule_setting(out)
    transfer_large = larger_heldout(out.parent / TRANSFER_FOLDER)
    large = {"bench, 300 steps": [i for i in setting["errors"] if i["steps"] == 300],
             "transfer sets, 300": [i for i in transfer_large if i["steps"] == 300 and not i["column"].endswith("_1000")]}
    return {"rules": {name: readout_row(setting, rule) for name, rule in READOUT_RULES.items()},
            "ceiling": stop_ceiling(setting, {k: v for k, v in large.items() if v})}


def readouts(out: Path) -> str:
    """The tables of :func:`readout_scores` (``--readouts``), its JSON written beside ``out``."""
    res = readout_scores(out)
    (out.parent / "decision_validity_readouts.json").write_text(json.dumps(res, indent=1, default=float))
    labels = list(res["ceiling"])
    lines = ["| readout | fitted (trend weight, threshold, fraction): every set | stops over 3 times the seed noise: "
             + " / ".join(labels) + " | sweeps within one block: bench / transfer | within-model Spearman | best picked "
             "| harms flagged | signs | largest reliability gap | decision gain (% of the test loss) |", "|---" * 10 + "|"]
    for name, row in res["rules"].items():
        cols = [row["columns"][c] for c in labels]
        every = "shipped" if row["fitted_every_set"] is None else ", ".join(f"{v:g}" for v in row["fitted_every_set"])
        lines.append(" | ".join([
            f"| {name}", every,
            ", ".join(f"{a}/{b} ({100 * a / b:.0f}%)" for a, b in (c["stops_over_noise"] for c in cols)),
            " / ".join(f"{sum(w['within_one'] for w in row[k])}/{len(row[k])}" for k in ("sweeps", "transfer_sweeps")),
            *(", ".join(fmt(c[key]) for c in cols) for key, fmt in (
                ("spearman_within", lambda v: f"{v:+.2f}"), ("best_picked", lambda v: _f(v, True)),
                ("harms_flagged", str), ("sign_right", lambda v: _f(v, True)), ("reliability_max_gap", _f),
                ("decision_gain", lambda v: f"{100 * v:+.2f}")))]) + " |")
    lines += ["", "| column | shipped stops over 3 times the seed noise | of them, the trial seed's full run lowers the "
              "held-out loss somewhere | the same on a split 4 times larger | shipped stops read on that split | best "
              "gain at the stops, in paired test standard errors | stops where the test split resolves the gain too |",
              "|---" * 7 + "|"]
    for label, c in res["ceiling"].items():
        stops, clear = c["stops_over_noise"]
        big = c["larger_split"]
        lines.append(f"| {label} | {stops} of {clear} | {c['full_run_heldout_decrease']} of {stops} | "
                     + (f"{big['full_run_heldout_decrease']} of {stops} | {big['stops_over_noise'][0]} of "
                        f"{big['stops_over_noise'][1]}" if big else "- | -")
                     + f" | {', '.join(f'{v:.1f}' for v in sorted(c['best_gain_in_test_se']))} | "
                       f"{c['test_resolved'][0]} of {c['test_resolved'][1]} |")
    return "\n".join(lines)

