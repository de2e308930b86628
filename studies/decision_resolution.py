"""Which of the decision's stops the held-out data resolves, scored on the recordings (``python -m
studies.decision_validity --resolution``), and whether the held-out samples it says would resolve one do.

A stop claims that no trialled candidate lowers the held-out loss by the stop tolerance; ``decide`` names it
``"heldout_too_small"`` where some trial's 95% interval from its paired standard error still reaches past minus the
tolerance (:func:`satcore.heldout_resolution`), with the samples factor ``n' / n = (h / |d + eps|)^2`` that would
resolve it.  Nothing here is fitted: the rule reads the decision's own stop tolerance (the calibration's, fitted leave
one bench set out as the other scores are) and the trials' standard errors.  Per scored column (bench at 300 and 1000
steps, transfer sets at 300 and 1000), :func:`resolution_column` counts the stops by what the realized outcome says of
them (a *short stop*: the best candidate's realized gain beyond :data:`CLEAR_GAIN_NOISE` seed standard deviations; a
*true saturation*: not beyond :data:`SATURATION_NOISE` of them) and by what the rule says (unresolved or a claimed
saturation); :func:`factor_validity` reads the unresolved stops again on the held-out split 4 times the bench's (the
``--large-heldout`` recordings: the same trials), where it is recorded (4 and 16 times at 300 steps, 4 times at 1000);
:func:`follow_advice` scores a user who decides again on the samples a stop names (:data:`ADVICE`: the counts
``decide`` names, every count, or those and ``z^2`` times the split where the change sits at the tolerance) on the
recorded larger splits, counting every stop of the two steps; :func:`larger_split_scores` reads the other must-shows
of the 1000-step decisions on the 4x split (a larger held-out split than the bench's, the same trials).
"""

from __future__ import annotations

import json
from pathlib import Path

from satcore._decisions.calibration import DEFAULT_CALIBRATION
from satcore._decisions.resolution import SAMPLES_FACTOR_NAMED, stop_resolution
from studies.decision_scores import (BENCH_1000_FOLDER, CLEAR_GAIN_NOISE, LARGE_HELDOUT, TRANSFER_1000_FOLDER,
                                     TRANSFER_FOLDER, _decide, _recorded_deviation, _stop_rule_setting,
                                     large_heldout_folder, larger_heldout, load, score, stops_over_noise)

# the larger held-out splits recorded (--large-heldout 4 and 16), as factors, per recipe length: at 1000 steps the 4x
# split only (--large-heldout with a 1000-step --column)
ADVICE_SPLITS = {300: (LARGE_HELDOUT, 16), 1000: (LARGE_HELDOUT,)}
SATURATION_NOISE = 1  # a true saturation: the realized best gain is not beyond this many seed standard deviations


def outcome(inst: dict) -> str:
    """``"short"`` where the best candidate's realized gain exceeds :data:`CLEAR_GAIN_NOISE` seed standard deviations,
    ``"saturated"`` where it does not exceed :data:`SATURATION_NOISE` of them (a harm included), else ``"between"``."""
    best = min(inst["rows"], key=lambda r: r["target"])
    gain, noise = -best["target"], best["seed_sd"]
    if gain > CLEAR_GAIN_NOISE * noise:
        return "short"
    return "saturated" if gain <= SATURATION_NOISE * noise else "between"


def read_stop(inst: dict, calibration) -> dict | None:
    """The decision on ``inst`` (:func:`studies.decision_scores._decide`): None where it inserts, else whether the
    held-out data resolves its stop and the samples factor that would (None where resolved)."""
    d = _decide(inst, calibration)
    if d.choice is not None:
        return None
    read = stop_resolution(d.candidates.values(), d.stop_tolerance)[1]
    assert (d.stop_reason == "heldout_too_small") != read.resolved  # the decision's label is the rule's
    return {"resolved": read.resolved, "samples_factor": read.samples_factor, "at_tolerance": read.at_tolerance}


def resolution_column(chosen: list, cals: dict) -> dict:
    """Per outcome (:func:`outcome`), the stops, the unresolved among them with the samples factors they name, and
    the decisions; with
    ``stops_over_noise`` the must-show count (stops where the realized best gain is clear, every stop counted, out of
    the decisions where it is clear) split into claimed saturations and unresolved stops."""
    counts = {k: {"decisions": 0, "stops": 0, "unresolved": 0, "samples_factors": []}
              for k in ("short", "between", "saturated")}
    for inst in chosen:
        kind = outcome(inst)
        counts[kind]["decisions"] += 1
        stop = read_stop(inst, cals[inst["set"]])
        if stop is not None:
            counts[kind]["stops"] += 1
            counts[kind]["unresolved"] += not stop["resolved"]
            if not stop["resolved"]:
                counts[kind]["samples_factors"].append(float(stop["samples_factor"]))
    short = counts["short"]
    return {"outcomes": counts, "stops_over_noise": (short["stops"], short["decisions"]),
            "claimed_over_noise": short["stops"] - short["unresolved"], "unresolved_over_noise": short["unresolved"]}


def factor_validity(chosen: list, large: list, cals: dict, factor: int = LARGE_HELDOUT) -> dict:
    """The unresolved stops of ``chosen`` whose twin (the same model, recipe column and trial seed) ``large`` reads
    on a held-out split ``factor`` times larger, split by whether the samples they need are within it
    (``samples_factor <= factor``): how many resolve there (the decision inserts, or its stop is resolved), how many
    of the short stops among them no longer stop, and the samples factors."""
    twins = {(i["model"], i["column"], i["seed"]): i for i in large}
    out = {side: {"stops": 0, "resolved_there": 0, "inserts_there": 0, "short": 0, "short_inserts_there": 0,
                  "samples_factors": []} for side in ("within", "beyond")}
    for inst in chosen:
        twin = twins.get((inst["model"], inst["column"], inst["seed"]))
        stop = read_stop(inst, cals[inst["set"]])
        if twin is None or stop is None or stop["resolved"]:
            continue
        row = out["within" if stop["samples_factor"] <= factor else "beyond"]
        there = read_stop(twin, cals[inst["set"]])
        short = outcome(inst) == "short"
        row["stops"] += 1
        row["resolved_there"] += there is None or there["resolved"]
        row["inserts_there"] += there is None
        row["short"] += short
        row["short_inserts_there"] += short and there is None
        row["samples_factors"].append(float(stop["samples_factor"]))
    return out


# the two-step protocols :func:`follow_advice` scores: which unresolved stops the user decides again on, and on how
# many samples (a factor of the split read): the counts ``decide`` names; every count, the ones no longer named
# included; and, besides the named counts, the stops at the tolerance on ``z^2`` times the split (the count were the
# change one standard error from the tolerance)
ADVICE = {"named counts": lambda stop: None if stop["at_tolerance"] else stop["samples_factor"],
          "every count (none withheld)": lambda stop: stop["samples_factor"],
          "named counts, at the tolerance z^2 times": lambda stop: (SAMPLES_FACTOR_NAMED if stop["at_tolerance"]
                                                                    else stop["samples_factor"])}


def follow_advice(chosen: list, larger: dict, cals: dict, advice) -> dict:
    """A user who, on an unresolved stop whose ``advice(stop)`` (a samples factor, or None: nothing to follow) is
    within a recorded larger split, decides again on the smallest such split (``larger``: factor -> the decisions
    of ``chosen``'s twins read on it; the recordings hold whole splits, not prefixes, so the user reads at least the
    samples named), and acts on that second decision.  Counts every stop of the protocol: ``stops_over_noise``
    (stops where the realized best gain is clear, out of those decisions, as :func:`resolution_column`), how many
    stops were followed (by outcome) and how many true saturations end in an insertion (``saturated_inserts``,
    against ``saturated_inserts_single``: the single decision's)."""
    twins = {factor: {(i["model"], i["column"], i["seed"]): i for i in insts} for factor, insts in larger.items()}
    out = {"stops_over_noise": [0, 0], "followed": {"short": 0, "between": 0, "saturated": 0},
           "saturated_inserts": 0, "saturated_inserts_single": 0}
    for inst in chosen:
        kind, calibration = outcome(inst), cals[inst["set"]]
        stop = read_stop(inst, calibration)
        out["saturated_inserts_single"] += kind == "saturated" and stop is None
        factor = None if stop is None or stop["resolved"] else advice(stop)
        key = (inst["model"], inst["column"], inst["seed"])
        split = None if factor is None else min((f for f in twins if f >= factor and key in twins[f]), default=None)
        if split is not None:
            out["followed"][kind] += 1
            stop = read_stop(twins[split][key], calibration)
        out["saturated_inserts"] += kind == "saturated" and stop is None
        if kind == "short":
            out["stops_over_noise"][0] += stop is not None
            out["stops_over_noise"][1] += 1
    out["stops_over_noise"] = tuple(out["stops_over_noise"])
    return out


def larger_split_scores(chosen: list, large: list, cals: dict) -> dict:
    """The decisions of ``chosen`` that ``large`` reads again on a larger held-out split (the same models, recipe
    columns, lengths and trial seeds), scored on the bench's split and on the larger one: the must-shows other than
    the stop counts' protocols (stops where the realized best gain is clear, :func:`studies.decision_scores.
    stops_over_noise`; best picked; within-model Spearman, :func:`studies.decision_scores.score`).  The targets are
    the same on both splits (the other trial seeds' test change), so only the split the decision reads differs."""
    keys = {(i["model"], i["column"], i["seed"], i["steps"]) for i in large}
    bench = [i for i in chosen if (i["model"], i["column"], i["seed"], i["steps"]) in keys]
    out = {}
    for split, insts in (("bench's held-out split", bench), (f"held-out x{LARGE_HELDOUT}", large)):
        scored = score(insts, cals, "decide")
        out[split] = {"stops_over_noise": stops_over_noise(insts, cals), "best_picked": scored["best_picked"],
                      "spearman_within": scored["spearman_within"], "n_decisions": scored["n_decisions"]}
    return out


def resolution_scores(out: Path) -> dict:
    """:func:`resolution_column` on the four scored columns (the bench's with each set's calibration fitted on the
    others, the transfer sets' with the shipped one), and where a larger split is recorded :func:`factor_validity`,
    :func:`follow_advice` and (1000 steps) :func:`larger_split_scores` with the largest difference of its recorded
    changes from the column's own recording (the same models and trials)."""
    setting = _stop_rule_setting(out)

    def at(steps: int, insts: list) -> list:
        # a 1000-step column's decisions at 300 steps read its own runs' prefixes: each length reads its own columns
        return [i for i in insts if i["steps"] == steps and i["column"].endswith("_1000") == (steps == 1000)]

    # per scored column: its recipe length, the folder of its recording and the folder whose larger splits
    # (large_heldout_folder) hold its trials read again
    folders = {"bench, 300 steps": (300, out, out), "bench, 1000": (1000, *(out.parent / BENCH_1000_FOLDER,) * 2),
               "transfer sets, 300": (300, *(out.parent / TRANSFER_FOLDER,) * 2),
               "transfer sets, 1000": (1000, out.parent / TRANSFER_FOLDER, out.parent / TRANSFER_1000_FOLDER)}
    res = {"columns": {}, "validity": {}, "advice": {}, "larger_split": {}}
    for label, chosen in setting["columns"].items():
        cals = (setting["cals"] if label.startswith("bench") else dict.fromkeys(setting["transfer_sets"],
                                                                                 DEFAULT_CALIBRATION))
        res["columns"][label] = resolution_column(chosen, cals)
        steps, recording, larger = folders[label]
        recorded = {factor: insts for factor in ADVICE_SPLITS[steps]
                    if (insts := at(steps, larger_heldout(larger, factor=factor)))}
        if recorded.get(LARGE_HELDOUT):
            res["validity"][label] = factor_validity(chosen, recorded[LARGE_HELDOUT], cals)
        if recorded:
            res["advice"][label] = {"splits": sorted(recorded), **{
                name: follow_advice(chosen, recorded, cals, advice) for name, advice in ADVICE.items()}}
        if steps == 1000 and recorded:
            res["larger_split"][label] = {
                "sets": sorted({i["set"] for i in recorded[LARGE_HELDOUT]}),
                "decisions": (len(recorded[LARGE_HELDOUT]), len(chosen)),
                "max_deviation_from_recording": _recorded_deviation(load(large_heldout_folder(larger))[0],
                                                                    load(recording)[0]),
                **larger_split_scores(chosen, recorded[LARGE_HELDOUT], cals)}
    return res


def _share(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else f"{a}/0"


def _spread(factors: list) -> str:
    """``median (least-most)`` of samples factors, '-' for none."""
    factors = sorted(factors)
    return f"{factors[len(factors) // 2]:.3g} ({factors[0]:.3g}-{factors[-1]:.3g})" if factors else "-"


def resolution(out: Path) -> str:
    """The tables of :func:`resolution_scores` (``--resolution``), its JSON written beside ``out``."""
    res = resolution_scores(out)
    (out.parent / "decision_validity_resolution.json").write_text(json.dumps(res, indent=1, default=float))
    lines = ["| column | stops where the realized best gain exceeds 3 seed SDs (every stop) | of them, claimed "
             "saturations | of them, unresolved | short stops the rule calls unresolved | true saturations (best gain "
             "within 1 seed SD) it calls unresolved | stops between | every stop unresolved | samples needed over "
             "the split's, short stops / true saturations (median, range) |", "|---" * 9 + "|"]
    for label, c in res["columns"].items():
        o = c["outcomes"]
        stops = sum(v["stops"] for v in o.values())
        lines.append(f"| {label} | {_share(*c['stops_over_noise'])} | {c['claimed_over_noise']} | "
                     f"{c['unresolved_over_noise']} | {_share(o['short']['unresolved'], o['short']['stops'])} | "
                     f"{_share(o['saturated']['unresolved'], o['saturated']['stops'])} | "
                     f"{_share(o['between']['unresolved'], o['between']['stops'])} | "
                     f"{_share(sum(v['unresolved'] for v in o.values()), stops)} | "
                     f"{_spread(o['short']['samples_factors'])} / {_spread(o['saturated']['samples_factors'])} |")
    lines += ["", f"| column | samples needed | unresolved stops | resolved on the split {LARGE_HELDOUT} times larger "
              "| of them, the decision inserts there | short stops among them | of those, no longer stopping "
              "there | samples needed over the split's (median, range) |", "|---" * 8 + "|"]
    for label, v in res["validity"].items():
        for side, words in (("within", f"within {LARGE_HELDOUT} times the split"),
                            ("beyond", f"beyond {LARGE_HELDOUT} times")):
            r = v[side]
            lines.append(f"| {label} | {words} | {r['stops']} | {_share(r['resolved_there'], r['stops'])} | "
                         f"{r['inserts_there']} | {r['short']} | {_share(r['short_inserts_there'], r['short'])} | "
                         f"{_spread(r['samples_factors'])} |")
    lines += ["", "| column | larger splits recorded | protocol | stops where the realized best gain exceeds 3 seed SDs "
              "(every stop of the protocol) | stops decided again: short / between / true saturations | true "
              "saturations that end inserting (single decision's) |", "|---" * 6 + "|"]
    for label, columns in res["advice"].items():
        splits = ", ".join(f"{f}x" for f in columns["splits"])
        lines.append(f"| {label} | {splits} | single decision (the must-show) | "
                     f"{_share(*res['columns'][label]['stops_over_noise'])} | - | - |")
        for name in ADVICE:
            a = columns[name]
            followed = a["followed"]
            lines.append(f"| {label} | {splits} | follow {name} | {_share(*a['stops_over_noise'])} | "
                         f"{followed['short']} / {followed['between']} / {followed['saturated']} | "
                         f"{a['saturated_inserts']} ({a['saturated_inserts_single']}) |")
    lines += ["", "| column | decisions read again, of the column's (sets) | held-out split read | stops where the realized "
              "best gain exceeds 3 seed SDs | best picked | within-model Spearman | largest difference from the "
              "recording |", "|---" * 7 + "|"]
    for label, v in res["larger_split"].items():
        for split in ("bench's held-out split", f"held-out x{LARGE_HELDOUT}"):
            r = v[split]
            lines.append(f"| {label} | {v['decisions'][0]} of {v['decisions'][1]} ({', '.join(v['sets'])}) | {split} | "
                         f"{_share(*r['stops_over_noise'])} | {100 * r['best_picked']:.0f}% | "
                         f"{'-' if r['spearman_within'] is None else format(r['spearman_within'], '+.2f')} | "
                         f"{v['max_deviation_from_recording']:.1e} |")
    return "\n".join(lines)
