"""What ``satcore expand`` says about its budgeted decisions: the defaults it assumed, the frontier, the moves, the
answer in plain words, and the frontier's figure (``--plot``; matplotlib optional)."""

from __future__ import annotations

import click

from satcore.adapter_api import MissingDependencyError, atomic_write, heldout_samples_words, num, require, table

from .common import display_name

# the trial decision's stop reasons, as a user reads them
STOP_WORDS = {
    "gain_below_tolerance": "the best predicted decrease of the held-out loss is smaller than the stop tolerance (a "
                            "share of the model's held-out minus training loss before insertion): no place is worth "
                            "a block",
    "no_credible_decrease": "no trialled place's decrease is credible (its P(decrease) is below the calibration's "
                            "threshold)",
    "heldout_too_small": "the held-out data cannot resolve a gain of the stop tolerance at some trialled place (its "
                         "95% interval reaches past it): no place is shown to be worth a block, nor shown not to be",
    "no_candidates": "no place could be trialled",
}


# how well the trials' predicted general change matched the realized one, on the budget bench with the current code
# (satcore-carry in docs/expansion.md's criteria; the max forgetting line cites it)
BENCH_RETENTION = ("on the budget bench, predicted and realized general changes agreed in sign in 56 of 105 cells, "
                   "Spearman +0.44")


# --seq-len's default, as the option's help and the line of defaults say it
SEQ_LEN_RULE = "min(128, the model's context) on a CPU, min(256, the model's context) on a GPU"


def defaults_line(assumed: dict, on_gpu: bool, sized: bool) -> str | None:
    """One line naming the defaults the run relies on (``assumed``: option -> value, those the user left out), with
    the rule of each of those and of no other; ``sized``: this path sizes ``--max-windows`` to its trials
    (``--blocks auto`` with the trial decision)."""
    if not assumed:
        return None
    given = ", ".join(f"{k} {v}" for k, v in assumed.items())
    rules = [f"{'a GPU' if on_gpu else 'no GPU'} found"]
    if assumed.keys() & {"--optimizer", "--steps", "--batch-size", "--lr"}:
        rules.append("the planned training is yours to state with --optimizer, --steps, --batch-size, --lr")
    if "--seq-len" in assumed:
        rules.append(f"--seq-len: {SEQ_LEN_RULE}")
    if "--max-windows" in assumed:
        rules.append("--max-windows: 64 on a CPU, 256 on a GPU" + (", more where --blocks auto's trials would pass "
                                                                    "over theirs more than twice" if sized else ""))
    return f"defaults: {given} ({'; '.join(rules)})"


def stop_line(expansion) -> str | None:
    """Why the decision would add nothing, in plain words, and what ``--blocks K`` did anyway; None without a stop."""
    decision = expansion.decision
    if decision is None or not decision.stop_reason or expansion.budgeted is not None and hasattr(
            expansion.budgeted, "arms"):
        return None
    why = STOP_WORDS.get(decision.stop_reason, decision.stop_reason)
    if decision.stop_reason == "heldout_too_small":  # decide's note's words, from the decision's own fields
        why += f"; {heldout_samples_words(decision.heldout_samples, decision.heldout_samples_needed)}"
    added = len(expansion.new_blocks)
    if added:
        return (f"the decision would add nothing here: {why}; --blocks {expansion.blocks_requested} inserted {added} "
                "anyway, as asked (--blocks auto decides whether to)")
    return f"nothing inserted: {why}; continue training the model as it is"


def _overshoot_notes(frontier) -> list[str]:
    """A note per split whose predicted change, at some arm, is a fall larger than the model's loss there: a
    cross-entropy cannot fall below 0, so the trials' line in log2(steps) overshoots at the planned steps (a
    high lr's trials: a loss of 5.70 predicted to fall by 5.94); the rows still rank the arms, not their amounts."""
    notes = []
    for split, what in (("heldout", "held-out"), ("general", "general")):
        loss = frontier.losses.get(split)
        predictions = {a.blocks: a.target if split == "heldout" else a.general for a in frontier.arms}
        over = [k for k, p in predictions.items() if loss is not None and p is not None and p.point < -loss]
        if over:
            arms = ", ".join(f"K = {k}" for k in over)
            notes.append(f"note: {arms} predict{'s' if len(over) == 1 else ''} a {what} loss fall larger than the {what} loss itself ({num(loss)} "
                         f"nats), below 0 after your {frontier.plan.planned_steps} steps: the trials' line overshoots "
                         "there; read the rows as a ranking, not as amounts")
    return notes


def frontier_report(expansion) -> list[str]:
    """The frontier table, the choice and its cost (``blocks="auto"``)."""
    frontier = expansion.budgeted
    plan, general = frontier.plan, any(a.general is not None for a in frontier.arms)
    # an arm the race stopped is read off its trials up to that step (and K = 0's up to the same step, paired),
    # so its row is marked: beside a row read at the end its numbers would look like the same trial's
    stopped = {int(k): step for k, step in frontier.race["arm_steps"].items() if step < plan.trial_steps}
    rows = []
    for arm in frontier.arms:
        excluded = arm.blocks in frontier.choice.excluded
        mark = f" (to step {stopped[arm.blocks]})" if arm.blocks in stopped else ""
        row = [str(arm.blocks), ", ".join(map(str, arm.places)) or "-", num(arm.target.point) + mark,
               f"[{num(arm.target.interval[0])}, {num(arm.target.interval[1])}]"]
        versus = arm.versus_none
        row.append("-" if versus is None else f"{num(versus.point)} [{num(versus.interval[0])}, {num(versus.interval[1])}]")
        if general:
            row += [num(arm.general.point) + (" (over --max-forgetting)" if excluded else "")]
        rows.append(row + ["yes" if arm.blocks == frontier.choice.chosen_blocks and not excluded else ""])
    header = ["blocks", "places", "predicted held-out change", "95% interval", "minus K = 0, paired (95%)"]
    header += ["general change"] if general else []
    # a race that stopped the trials read its predictions off fewer steps than planned: the header says which
    trials = (f"trials of {plan.trial_steps} steps" if frontier.stopped_at is None else
              f"trials stopped at step {frontier.stopped_at} of {plan.trial_steps} by the race")
    lines = [f"frontier: the held-out loss change predicted after your {plan.planned_steps} steps (K = 0: the model as "
             f"it is, trained the same way); {trials} from {plan.replicates} seed(s), each "
             "window's change fitted linearly in log2(steps) and read at your steps; the interval is the trials' "
             + ("held-out windows' noise" if plan.replicates == 1 else "window and seed noise")
             + f"; the paired column adds the carry error, {frontier.carry_per_doubling:g} nats per doubling from "
             "the trial's last step to yours", "", table(header + ["chosen"], rows), ""]
    lines += _overshoot_notes(frontier)
    chosen = frontier.choice.chosen_blocks
    if chosen:
        lines.append(f"chosen: {chosen} block(s) at LLaMA-Pro's uniform places "
                     f"{list(frontier.chosen_places)}: {frontier.choice.reason}")
    else:
        lines += [f"chosen: no expansion. {frontier.choice.reason[0].upper()}{frontier.choice.reason[1:]}.",
                  f"instead: {frontier.instead}"]
    if not frontier.every_arm_excluded:  # else no tolerance was applied, and the chosen line says why
        lines.append(f"tolerance: {frontier.tolerance:.3g} nats ({frontier.rule})")
        limit = frontier.choice.max_forgetting
        if limit is not None:  # the limit the user gave is applied even where the table marks no arm over it
            over = ", ".join(f"K = {k}" for k in frontier.choice.excluded) or "no arm"
            # what the limit is held against, and what it is not: short trials miss how much the planned training
            # forgets (expansion-decision.md, Retention; the bench's numbers in expansion.md)
            lines.append(f"max forgetting: {limit:.3g} nats (--max-forgetting), held against each arm's predicted "
                         f"general loss change after your {plan.planned_steps} steps (the point the trials' first "
                         f"{plan.trial_steps} steps extrapolate to, not its interval); over it: {over}. It limits that "
                         f"prediction, not the change your training will make, which can be larger ({BENCH_RETENTION})")
    if frontier.warning:
        lines.append(f"warning: {frontier.warning}")
    ceiling = f"the planned {plan.cost_fraction:.1%} was the ceiling, the rest of it is your training's"
    if frontier.stopped_at is not None:
        lines.append(f"race: the trials stopped at step {frontier.stopped_at} of {plan.trial_steps}: no K > 0 could "
                     f"still beat K = 0 credibly; {ceiling}")
    elif stopped:
        arms = ", ".join(f"K = {k} at step {step}" for k, step in stopped.items())
        lines.append(f"race: {arms} of {plan.trial_steps} stopped, no longer able to beat K = 0 credibly: each such "
                     "row (to step N) is read off its trials up to there, its paired difference off K = 0's up to the "
                     f"same step; {ceiling}")
    return lines + [cost_line(expansion)]


def moves_report(expansion) -> list[str]:
    """The placement check's moves (``blocks=K`` with a budget)."""
    check = expansion.budgeted
    lines = [f"placement: LLaMA-Pro's uniform places {list(check.uniform)} unless a trial credibly favours a move"]
    if not check.moves:
        lines.append("  the screen ranks each group's uniform place first: no move to try")
    for move in check.moves:
        d = move.difference
        # why a move stays: credibly worse, uncertain, or (interval below 0) a gain within the tolerance
        why = ("the move is predicted worse: its interval lies above 0" if d.interval[0] > 0 else
               "its interval reaches 0" if d.interval[1] >= 0 else
               f"a gain within the tolerance, {check.tolerance:.3g} nats")
        verdict = f"moved to {move.proposed}" if move.moved else f"stays at {move.uniform} ({why})"
        lines.append(f"  {move.uniform} -> {move.proposed} (the screen's first in its group): predicted held-out "
                     f"change {num(d.point)} [{num(d.interval[0])}, {num(d.interval[1])}] against uniform after "
                     f"{check.plan.planned_steps} steps: {verdict}")
    return lines + [cost_line(expansion)]


def cost_line(expansion) -> str:
    from satcore.adapters.torch.expansion_exports import cost_words

    budgeted = expansion.budgeted
    return "decision cost: " + cost_words(budgeted.cost_steps, budgeted.cost_fraction, budgeted.plan.planned_steps,
                                          getattr(budgeted, "chosen_cost_fraction", None),
                                          getattr(getattr(budgeted, "choice", None), "chosen_blocks", None))


def _points_and_errors(predictions) -> tuple[list, list]:
    """``(points, yerr)`` of :class:`satcore.adapter_api.Prediction` s for ``errorbar``: the 95% interval as the
    distances below and above each point."""
    return ([p.point for p in predictions],
            [[p.point - p.interval[0] for p in predictions], [p.interval[1] - p.point for p in predictions]])


def plot_frontier(expansion, path: str, inputs=()) -> str | None:
    """Draw the frontier (predicted held-out change per K, and the general change, each with its 95% interval) to
    ``path``, and beside it what the choice rests on: each ``K > 0``'s paired difference from ``K = 0`` with its
    interval and minus the tolerance; returns the line to print when matplotlib is missing (the figure is skipped,
    nothing else)."""
    try:
        require("matplotlib", extra="plot", by="--plot")
    except MissingDependencyError as exc:
        return f"{exc}: the figure was skipped"
    from .plot import _pyplot, _silent_matplotlib, plot_format

    fmt = plot_format(path)
    with _silent_matplotlib():
        plt = _pyplot()
        arms = expansion.budgeted.arms
        ks = [a.blocks for a in arms]
        # two panels: the arms' own intervals overlap where the paired differences (one set of windows) separate
        figure, (axis, paired) = plt.subplots(1, 2, figsize=(9, 3.5))
        axis.errorbar(ks, *_points_and_errors([a.target for a in arms]), marker="o", capsize=3,
                      label="target held-out (95% interval)")
        choice = expansion.budgeted.choice
        if all(a.general is not None for a in arms):  # expansion.json's general_interval, as the target's
            axis.errorbar(ks, *_points_and_errors([a.general for a in arms]), marker="s", linestyle="--", capsize=3,
                          label="general held-out (95% interval)")
            if choice.max_forgetting is not None:  # the limit the general points are held to
                axis.axhline(choice.max_forgetting, color="C1", linestyle=":", linewidth=0.8,
                             label=f"--max-forgetting {choice.max_forgetting:.3g}")
        if not expansion.budgeted.every_arm_excluded:  # no arm chosen: no line marks one
            # labelled: unlabelled, the line at K = 0 read as the plot's axis
            axis.axvline(choice.chosen_blocks, color="grey", linewidth=0.8, label=f"chosen: K = {choice.chosen_blocks}")
        axis.axhline(0, color="black", linewidth=0.5)
        axis.set_xlabel("new blocks K (0: the model as it is)")
        axis.set_ylabel(f"loss change after {expansion.budgeted.plan.planned_steps} steps (nats)")
        axis.set_xticks(ks)
        axis.legend(fontsize=8)
        expanded = [a for a in arms if a.versus_none is not None]
        paired.errorbar([a.blocks for a in expanded], *_points_and_errors([a.versus_none for a in expanded]),
                        marker="o", color="C2", capsize=3, label="minus K = 0, paired (95%)")
        paired.axhline(-choice.tolerance, color="C2", linestyle=":", linewidth=0.8,
                       label=f"minus the tolerance ({choice.tolerance:.3g}): credible below it and 0")
        paired.axhline(0, color="black", linewidth=0.5)
        paired.set_xlabel("new blocks K")
        paired.set_ylabel("held-out change minus K = 0's (nats)")
        paired.set_xticks([a.blocks for a in expanded])
        paired.legend(fontsize=8)
        figure.tight_layout()
        atomic_write(path, lambda stream: figure.savefig(stream, format=fmt), inputs=inputs)
        plt.close(figure)
    click.echo(f"wrote {display_name(path)}")
    return None
