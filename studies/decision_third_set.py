"""The third transfer set (issue 39): rules fixed before it was recorded, scored on it alone and pooled with the two
transfer sets (``python -m studies.decision_validity --third-set``).

The set (:data:`studies.decision_validity.THIRD`: byte-level GPT-2 decoders of hidden 48 and 3 layers on the Linux
documentation with their own window seeds, residual MLPs of width 96 on sklearn digits drawn with data seed 7) is
recorded to ``studies/results/decision_validity_third/``, a folder that no fit and no earlier rule choice reads. The
rules scored on it and their constants were fixed from the recorded sets before any of it was recorded
(studies/decision-validity.md, "A third transfer set, recorded after the rules were fixed"), and are pinned here:

* the shipped decision (the shipped calibration, ``DEFAULT_CALIBRATION``);
* :data:`studies.decision_short_stops.SGD_RULE`, its training gate fitted on every bench set:
  :data:`SGD_RULE_TRAINING_SE` standard errors;
* the carry-factor rule, its carry fitted on every bench set: :data:`CARRY_FACTOR`.

Nothing here is fitted on the third set.
"""

from __future__ import annotations

import json
from pathlib import Path

from satcore._decisions.calibration import DEFAULT_CALIBRATION
from studies.decision_scores import LONG, TRANSFER_FOLDER, _decide, _f, _stop_rule_row, instances, load, score
from studies.decision_short_stops import SGD_RULE, SHORT_STOP_RULES, _outcomes, anatomy

SGD_RULE_TRAINING_SE = 1.0  # SGD_RULE's x as fitted on every bench set (results/decision_validity_short_stops.json)
CARRY_FACTOR = 2.9911422150145235  # the carry-factor rule's constant as fitted on every bench set (the same file)
CARRY_RULE = ("stop tolerance against d(T) times the carry to the recipe's length (the median realized change over "
              "d(T))")
THIRD_FOLDER = "decision_validity_third"  # studies/decision_validity.py OUT_THIRD, beside the bench's folder
# the shipping criterion, decided in advance: SGD_RULE ships where, on the third set at 300 and at 1000 steps each, it
# stops in at most this share of the decisions whose realized best gain exceeds 3 seed standard deviations (at least
# one such decision at each length: a length with none does not test the line, and the criterion is not met), inserts
# no more clear harms than the shipped decision, and keeps harms flagged, signs right and best picked no worse
SHORT_STOP_LINE = 0.10

RULES = {  # name: (decider of (inst, calibration), the constant fixed before the third set was recorded)
    "shipped": (_decide, None),
    SGD_RULE: (lambda inst, cal: SHORT_STOP_RULES[SGD_RULE][0](inst, cal, SGD_RULE_TRAINING_SE), SGD_RULE_TRAINING_SE),
    CARRY_RULE: (lambda inst, cal: SHORT_STOP_RULES[CARRY_RULE][0](inst, cal, CARRY_FACTOR), CARRY_FACTOR),
}
THIRD_LABEL, POOLED_LABEL = "third set", "transfer sets and third set"


def _by_length(insts: list) -> dict:
    """A folder's decisions per recipe length, each read on the columns recorded for it (a 1000-step column's first
    300 steps are its own runs of the 300-step recipe, never counted twice)."""
    return {steps: [i for i in insts if i["steps"] == steps and i["column"].endswith("_1000") == (steps == 1000)]
            for steps in LONG}


def third_setting(out: Path) -> dict:
    """What :func:`third_set_scores` reads: the third set's decisions alone and pooled with the two transfer sets', at
    300 and 1000 steps (each decided with the shipped calibration, as a user gets it), the sets' names, and the depth
    sweeps (the third set's, and pooled with the transfer sets')."""
    third_models, third_sweeps, meta = load(out.parent / THIRD_FOLDER)
    transfer_models, transfer_sweeps, _ = load(out.parent / TRANSFER_FOLDER)
    third, transfer = _by_length(instances(third_models)), _by_length(instances(transfer_models))
    columns = {**{f"{THIRD_LABEL}, {s}": third[s] for s in LONG},
               **{f"{POOLED_LABEL}, {s}": transfer[s] + third[s] for s in LONG}}
    return {"columns": columns, "transfer_sets": sorted({m["set"] for m in (*third_models, *transfer_models)}),
            "third_sets": sorted({m["set"] for m in third_models}), "sweeps": third_sweeps,
            "transfer_sweeps": transfer_sweeps + third_sweeps,
            "recorded": {part: {k: m[k] for k in ("seconds", "written", "columns")} for part, m in meta.items()}}


def criterion(columns: dict) -> dict:
    """The shipping criterion decided in advance, per length of the third set: ``SGD_RULE`` stops in at most
    :data:`SHORT_STOP_LINE` of the decisions whose realized best gain is clear (at least one such decision), inserts
    no more clear harms than the shipped decision, and keeps harms flagged, signs right and best picked no worse."""
    out = {}
    for steps in LONG:
        label = f"{THIRD_LABEL}, {steps}"
        if label not in columns["shipped"]:
            out[str(steps)] = {"met": False, "why": ["not recorded"]}
            continue
        rule, shipped = columns[SGD_RULE][label], columns["shipped"][label]
        stops, clear = rule["stops_over_noise"]
        why = []
        if not clear:
            why.append("no decision with a clear best gain: the line is not tested")
        elif stops > SHORT_STOP_LINE * clear:
            why.append(f"stops short in {stops} of {clear}")
        if rule["harms_inserted"] > shipped["harms_inserted"]:
            why.append(f"inserts {rule['harms_inserted']} clear harms against {shipped['harms_inserted']}")
        for key in ("harms_flagged", "sign_right", "best_picked"):
            if rule[key] is not None and shipped[key] is not None and rule[key] < shipped[key]:
                why.append(f"{key} {rule[key]} against {shipped[key]}")
        out[str(steps)] = {"met": not why, "why": why}
    return {"lengths": out, "met": all(v["met"] for v in out.values())}


def third_set_scores(out: Path) -> dict:
    """Each rule of :data:`RULES` on the third set alone and pooled with the transfer sets (:func:`third_setting`):
    the scores of the stop rules' table (:func:`studies.decision_scores._stop_rule_row`: stops where the realized
    best gain is clear, harms flagged, signs, best picked, within-model Spearman, decision gain, sweeps within one
    block) with the clear harms inserted and true saturations inserting (:func:`studies.decision_short_stops.
    _outcomes`), and the shipping criterion (:func:`criterion`)."""
    setting = third_setting(out)
    setting["columns"] = {k: v for k, v in setting["columns"].items() if v}
    rules = {}
    for name, (decider, constant) in RULES.items():
        row = _stop_rule_row(setting, decider, {}, DEFAULT_CALIBRATION, (DEFAULT_CALIBRATION, DEFAULT_CALIBRATION))
        for label in row["columns"]:
            row["columns"][label] |= _outcomes(setting, decider, label)
        rules[name] = {"constant": constant, **row}
    by_rule = {name: rule["columns"] for name, rule in rules.items()}
    third_only = {**setting, "columns": {k: v for k, v in setting["columns"].items() if k.startswith(THIRD_LABEL)}}
    cals = dict.fromkeys(setting["transfer_sets"], DEFAULT_CALIBRATION)
    harms = {label: score(chosen, cals, "decide")["harms"] for label, chosen in setting["columns"].items()}
    return {"sets": setting["third_sets"], "transfer_sets": setting["transfer_sets"], "recorded": setting["recorded"],
            "harms": harms, "rules": rules, "criterion": criterion(by_rule), "anatomy": anatomy(third_only)}


def render(res: dict) -> str:
    """The table of :func:`third_set_scores` and the criterion's verdict per length."""
    labels = list(res["rules"]["shipped"]["columns"])
    lines = ["| rule | constant (fixed before recording) | column | stops over 3 times the seed noise | clear harms "
             "inserted | true saturations inserting | harms flagged | signs right (clear) | best picked | within-model "
             "Spearman | decision gain (% of the test loss) |", "|---" * 11 + "|"]
    for name, row in res["rules"].items():
        for label in labels:
            c = row["columns"][label]
            stops, clear = c["stops_over_noise"]
            share = f" ({100 * stops / clear:.0f}%)" if clear else ""
            lines.append(f"| {name} | {'-' if row['constant'] is None else format(row['constant'], '.3g')} | {label} | "
                         f"{stops}/{clear}{share} | {c['harms_inserted']} | {c['saturations_inserting']} | "
                         f"{c['harms_flagged']}/{res['harms'][label]} | {_f(c['sign_right'], True)} | {_f(c['best_picked'], True)} | "
                         f"{_f(c['spearman_within'])} | {100 * c['decision_gain']:+.2f} |")
    lines += ["", "| rule | sweeps within one block: third set / transfer sets and third set |", "|---|---|"]
    for name, row in res["rules"].items():
        lines.append(f"| {name} | " + " / ".join(
            f"{sum(w['within_one'] for w in row[k])}/{len(row[k])}" for k in ("sweeps", "transfer_sweeps")) + " |")
    anat = res["anatomy"]
    lines += ["", "| third set's short stops (shipped decision) | model | recipe | trial seed | stop | cause | candidate: "
              "held-out change at the trial's end (SE) / training change (SE) / realized (seed SD) |", "|---" * 7 + "|"]
    for label, a in anat.items():
        for s in a["stops"]:
            cands = "; ".join(f"{c['candidate']}: {c['heldout_change'][-1]:+.2g} ({c['heldout_se']:.2g}) / "
                              f"{c['training_change'][-1]:+.2g} ({c['training_se']:.2g}) / {c['realized']:+.2g} "
                              f"({c['seed_sd']:.2g})" for c in s["candidates"])
            lines.append(f"| {label} | {s['model']} | {s['column']} | {s['seed']} | {s['stop_reason']} | {s['cause']} | "
                         f"{cands} |")
    verdict = res["criterion"]
    lines += ["", "Shipping criterion for SGD_RULE (decided in advance): " + "; ".join(
        f"{steps} steps {'met' if v['met'] else 'not met (' + ', '.join(v['why']) + ')'}"
        for steps, v in verdict["lengths"].items()) + f"; overall {'met' if verdict['met'] else 'not met'}."]
    return "\n".join(lines)


def third_set(out: Path) -> str:
    """``--third-set``: :func:`third_set_scores` written beside ``out`` and rendered."""
    res = third_set_scores(out)
    (out.parent / "decision_validity_third_set.json").write_text(json.dumps(res, indent=1, default=float))
    return render(res)
