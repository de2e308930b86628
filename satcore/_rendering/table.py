"""Plain-text display of a :class:`~satcore.DepthReport` (``print(report)``, ``satcore score``).

Display only: every number shown is computed elsewhere.  Names that came from
a file are shown escaped (:func:`display_name`); JSON keeps them exact.
"""

from __future__ import annotations

import math

from .._shared.display import NOT_VERIFIED, display_name
from .._decisions.criteria import Verdict
from .._decisions.resolution import samples_at_one_standard_error

LEGEND = (
    "columns: AG = activation-gradient norm; V = growth value (first-order gain per unit block size, the raw "
    "estimate); V_floor = V's sampling-noise floor, in V's units (JSON growth_noise_floor); V2_unb = unbiased "
    "V^2 (may be < 0); V_interval = interval for the population V; p_adj = Holm-adjusted sign-flip p-value of "
    "H0: V = 0; first-order = the first-order verdict of the paper's criterion; real. = V / AG; ||C||_F = "
    "cross-gradient norm (Prop. 1's quantity); C_floor = its sampling-noise floor, in ||C||_F's units (JSON "
    "noise_floor); formulas: docs/core.md, Quantities; the fold test, interval and verdicts: docs/verdicts.md"
)


# how to read the first-order screen's unverified values: a linear extrapolation of the step, whose size can exceed
# the held-out loss itself (a decrease larger than a loss bounded below by 0 allows)
SCREEN_READING = "read them as a direction and a ranking, not an amount"


def screen_beyond_loss_note(candidates, heldout_loss: float | None) -> str | None:
    """The note under a decision's table where some row no trial verified predicts a held-out change larger in size
    than the held-out loss itself (``candidates``: name -> ``CandidateDecision``); None where none does or the
    decision states no held-out loss (None)."""
    if heldout_loss is None:
        return None
    over = [n for n, c in candidates.items()
            if not getattr(c, "verified", False) and abs(c.predicted_heldout_change) > abs(heldout_loss)]
    if not over:
        return None
    return (f"note: {len(over)} {NOT_VERIFIED} row(s) ({', '.join(map(display_name, over))}) predict a held-out "
            f"change larger in size than the held-out loss {num(heldout_loss)} itself: the screen's first-order "
            f"extrapolations; {SCREEN_READING}")


def interval_beyond_loss_note(candidates, heldout_loss: float | None, alpha: float = 0.05) -> str | None:
    """The note under a decision's table where some trialled row's ``1 - alpha`` interval reaches below minus the
    held-out loss (``candidates``: name -> ``CandidateDecision``): a decrease larger than a loss bounded below by 0
    allows.  The interval is the point plus the calibrated error scale times the bench's residual quantiles
    (docs/predictive-validity.md), which the loss does not bound; without the note its lower end reads as a gain the
    block could make.  None where no row's does or the decision states no held-out loss (None)."""
    if heldout_loss is None:
        return None
    below = [n for n, c in candidates.items()
             if getattr(c, "verified", False) and c.interval[0] < -abs(heldout_loss)]
    if not below:
        return None
    return (f"note: {', '.join(map(display_name, below))}: the {1 - alpha:.0%} interval reaches below minus the "
            f"held-out loss (-{num(abs(heldout_loss))}), a decrease larger than the loss itself: its ends are the "
            "calibrated error scale times the bench's residual quantiles, which the loss does not bound; read that "
            "end as how uncertain the prediction is, not as a gain the block can make")


def stop_tolerance_note(decision) -> str:
    """The note under a tolerance stop: the stop tolerance in loss units, the term that set it with its numbers
    (:attr:`~satcore.InsertionDecision.stop_tolerance_rule`) and, since a share of a loss does not say what the
    held-out data resolves, its size in the best credible trial's standard errors; unless a practical tolerance
    set it, how to state one."""
    rule, cal = decision.stop_tolerance_rule, decision.calibration
    if rule == "generalization gap":
        source = (f"the calibration's {cal.generalization_gap_fraction:g} of the generalization gap: held-out loss "
                  f"{num(decision.heldout_loss)} minus training loss {num(decision.training_loss)}")
    elif rule == "held-out loss":
        source = f"the practical tolerance, {cal.tolerance:g} of the held-out loss {num(decision.heldout_loss)}"
    else:  # both terms 0: the best credible candidate predicts no decrease
        source = "no decrease predicted"
    in_se = decision.stop_tolerance_se
    # where to state one, runnable as printed: the decision's own calibration (the schedule's shipped one), since
    # another (the even plan's, TrialSettings()'s, under schedule="halving") would swap the error model
    how = ("" if rule == "held-out loss" else "; state a practical one as a share of the held-out loss with "
           "policy=DecisionPolicy(recipe, trials=TrialSettings(calibration=decision.calibration, tolerance=...))")
    return (f"note: stopped below the tolerance of {num(decision.stop_tolerance)} ({source}"
            + ("" if in_se is None else f"; {num(in_se)} standard errors of the best credible trial") + ")" + how)


def heldout_samples_words(heldout_samples: int | None, heldout_samples_needed: int | None,
                          at_tolerance: str = "the change of the trial it rests on sits within one standard error of "
                                              "minus the tolerance, so this split cannot size the held-out data that "
                                              "would settle it") -> str:
    """What would resolve a ``"heldout_too_small"`` stop, read off the decision's own fields
    (:attr:`~satcore.InsertionDecision.heldout_samples`, :attr:`~satcore.InsertionDecision.heldout_samples_needed`):
    the count it names; where it names none on a known split (the binding change within one standard error of minus
    the tolerance, :attr:`~satcore.HeldoutResolution.at_tolerance`), ``at_tolerance`` (why) and the two ways on: a
    larger split, whose first step is ``ceil(z_{0.975}^2 n)`` samples (:func:`samples_at_one_standard_error`), or a
    practical tolerance.  One text for decide's note and ``satcore expand``'s stop line and model card."""
    if heldout_samples_needed is not None:
        return (f"about {heldout_samples_needed} held-out samples would resolve it (the half-width shrinks as "
                "1/sqrt(n); a planning number that assumes the trials' changes stay put)")
    if heldout_samples is None:
        return "no number of held-out samples named"
    first_step = samples_at_one_standard_error(heldout_samples)
    return (f"{at_tolerance} and no count is named; decide again on a larger held-out split (about {first_step} "
            "samples would resolve it were the change one standard error from the tolerance: a first step, not a "
            "count) or state a practical tolerance the data resolves (TrialSettings(..., tolerance=...), a share of "
            "the held-out loss)")


def heldout_resolution_note(decision) -> str:
    """The note under a ``"heldout_too_small"`` stop: the stop tolerance, which term ruled it (fitted: a share of the
    generalization gap; stated: a share of the held-out loss) and its size in the binding trial's half-widths; that
    trial (:attr:`~satcore.InsertionDecision.heldout_binding_candidate`), whose 95% interval from the held-out data
    alone still reaches past minus the tolerance; and about how many held-out samples would resolve it, or, where
    its change sits within one standard error of the tolerance, that no count is named
    (:attr:`~satcore.HeldoutResolution.at_tolerance`)."""
    name, eps, half = decision.heldout_binding_candidate, decision.stop_tolerance, decision.heldout_resolution
    trial = decision.candidates[name].trial
    change = trial.heldout_change[-1]
    read_on = "" if decision.heldout_samples is None else f" on {decision.heldout_samples} held-out samples"
    # where no count is named, why: the distance the count divides by, against its standard error
    at_tolerance = (f"its change is {num(abs(change + eps))} from -{num(eps)}, within its standard error "
                    f"{num(trial.heldout_se)}, so this split cannot size the held-out data that would settle it")
    would = heldout_samples_words(decision.heldout_samples, decision.heldout_samples_needed, at_tolerance)
    # a tolerance of 0 (the held-out loss not above the training loss, no share stated) asks whether any decrease
    # shows: "a gain of the tolerance (0)" and "reaches past -0" said that in words a user could not act on
    if eps > 0:
        cal, rule = decision.calibration, decision.stop_tolerance_rule
        ruled = (f"stated: {cal.tolerance:g} of the held-out loss" if rule == "held-out loss" else
                 f"fitted: {cal.generalization_gap_fraction:g} of the generalization gap")
        in_half = "" if not half else f"; {num(eps / half)} half-widths"
        gain, bound = f"a gain of the tolerance ({num(eps)}; {ruled}{in_half})", f"reaches past -{num(eps)}"
    else:
        gain, bound = "a decrease of any size (the stop tolerance is 0)", "reaches below 0"
    share = decision.heldout_resolved_share
    stated = ""
    if share:  # the practical tolerance the advice offers, sized: rounded up to 2 significant digits, still resolving
        step = 10.0 ** (math.floor(math.log10(share)) - 1)
        rounded = f"{math.ceil(share / step) * step:.2g}"
        stated = (f"; this split resolves a stated tolerance of {rounded} of the held-out loss or more "
                  f"(TrialSettings(..., tolerance={rounded}): a stop, resolved)")
    return (f"note: the held-out data cannot resolve {gain}: "
            f"{display_name(name)}'s trial changed the held-out loss by {num(change)} +- {num(half)} (95%, "
            f"from its paired standard error{read_on}), which {bound}; {would}{stated}; "
            "no block is inserted, and none is shown not to pay")


def num(x) -> str:
    """Compact number for tables: 4 significant digits, '-' for missing."""
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{x:.4g}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned first column, right-aligned others."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def line(cells):
        first = cells[0].ljust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

    return "\n".join([line(header)] + [line(r) for r in rows])


def _interval(iv) -> str:
    return "-" if iv is None else f"[{num(iv[0])}, {num(iv[1])}]"


# Statistics alone (a dump, a probe) make no insertion decision: on the decision bench the first-order ranking picked
# the best place in 35% of the 300-step decisions (17% on the transfer sets) and flagged 58% of the harms. Said before
# the table, so that the verdict's "best candidate" is not read as advice to insert there.
NO_DECISION = ("insertion decision: none from statistics alone: the first-order verdict below says whether a "
               "zero-output block has a descent direction, not whether one trained with your recipe lowers the "
               "held-out loss; to decide, verify by short trials (satcore.adapters.torch.decide or "
               "satcore.adapters.tensorflow.decide, or satcore expand --blocks auto; docs/predictive-validity.md)")


def render_report(report, label: str | None = None) -> str:
    """The table ``satcore score`` prints: a decision block when the report carries one, then one row per
    candidate, the first-order verdict, Prop. 1, warnings."""
    tests = {t.name: t for t in report.tests}
    header = ["candidate", "n", "r", "AG", "V", "V_floor", "V2_unb", "V_interval", "p_adj", "first-order",
              "real.", "rank", "||C||_F", "C_floor"]
    rows = []
    for c in report.candidates:
        t = tests.get(c.name)
        rows.append([display_name(c.name), num(c.n_samples), num(c.n_features), num(c.ag), num(c.growth_value),
                     num(c.growth_noise_floor), num(None if t is None else t.growth_value_sq_unbiased),
                     _interval(None if t is None else t.growth_value_interval),
                     num(None if t is None else t.p_value_adjusted), "-" if t is None else t.verdict,
                     num(c.realizability), num(c.feature_rank), num(c.cross_gradient_norm), num(c.noise_floor)])
    head = f"{display_name(label)}: " if label else ""
    lines = [f"{head}{len(report.candidates)} candidate(s), probe split: {display_name(report.split or 'not stated')}"]
    decision = getattr(report, "decision", None)
    if decision is not None:
        lines.append(render_decision(decision))
    else:
        lines.append(NO_DECISION)
    if report.predictions is not None:
        lines.append(render_predictions(report.predictions))
    lines += [table(header, rows), LEGEND]
    lines += [f"note: {n}" for n in table_notes(report)]
    lines.append(f"largest growth value (the raw estimate, not a recommendation): V {num(report.growth_value_max)} "
                 f"at {display_name(report.argmax)}; AG_max {num(report.ag_max)} at {display_name(report.ag_argmax)}")
    if report.verdict is not None:
        lines.append(render_verdict(report.verdict, report.tests, decided=decision is not None))
    if report.prop1 is not None:
        lines.append(render_prop1(report.prop1))
    lines += [f"warning: {display_name(w)}" for w in report.warnings]
    return "\n".join(lines)


def table_notes(report) -> list[str]:
    """Why a row's numbers look as they do where they seem to disagree.

    ``V`` is the raw estimate, whose square exceeds the population ``V^2`` by
    the noise floor's (``E V^2 = V_pop^2 + V_floor^2``), so it may lie above
    the interval for the population ``V``; and the sign-flip test (exact under
    symmetry) may reject ``V = 0`` where the jackknife interval (approximate)
    still reaches 0.  Candidate names in the notes are shown escaped.
    """
    tests = {t.name: t for t in report.tests}
    above, reaching = [], []
    for c in report.candidates:
        t = tests.get(c.name)
        if t is None or t.growth_value_interval is None:
            continue
        lo, hi = t.growth_value_interval
        if not lo <= c.growth_value <= hi:
            above.append(display_name(c.name))
        if t.verdict == Verdict.IMPROVABLE and lo <= 0:
            reaching.append(display_name(c.name))
    notes = []
    if above:
        notes.append(f"V lies outside V_interval at {', '.join(above)}: V is the raw estimate, biased up by the "
                     "noise (E V^2 = V_pop^2 + V_floor^2); V_interval is for the population V, from V2_unb")
    if reaching:
        notes.append(f"improvable with V_interval reaching 0 at {', '.join(reaching)}: the sign-flip test (exact "
                     "when fold means are symmetric under H0) rejects V = 0; the jackknife interval is approximate "
                     "and wider")
    return notes


def render_decision(decision) -> str:
    """The decision a user acts on (an ``InsertionDecision``), shown above the first-order table; one that neither
    chose nor stopped (the torch adapter's ``ScreenDecision``: no trial verified a place) is the screen's ranking,
    its head naming the place it ranks first."""
    choice, order = decision.choice, list(decision.candidates)  # a decision's candidates are in the screen's order
    if choice is not None:
        head = f"decision: insert a block at {display_name(choice)}"
    elif decision.stop_reason is not None:
        head = f"decision: stop ({display_name(decision.stop_reason)})"
    else:  # the screen alone holds its candidates in depth order: its rows are put in its ranking, as a decision's
        order.sort(key=lambda n: decision.candidates[n].predicted_heldout_change)
        head = (f"decision: none: the first-order screen ranks {display_name(order[0]) if order else None} first, "
                f"{NOT_VERIFIED} by a trial")
    cost = getattr(decision, "cost_block_steps", None)
    rows = [[display_name(name), *_evidence_cells(decision.candidates[name]), _trial_cell(decision.candidates[name])]
            for name in order]
    lines = [head + ("" if cost is None else f" (decision cost: {num(cost)} block-steps)")]
    if trained := trial_family_line(decision):
        lines.append(trained)
    if rows:
        lines += [table(["candidate", "held-out change", "interval", "P(decrease)", "trial"], rows),
                  decision_legend(getattr(decision, "recipe", None), _screen_ranked(decision.candidates, order))]
        # without these a row with a better prediction than the choice reads as a wrong decision
        lines += never_chosen_notes(decision.candidates)
        heldout_loss = getattr(decision, "heldout_loss", None)
        lines += [note for note in (screen_beyond_loss_note(decision.candidates, heldout_loss),
                                    interval_beyond_loss_note(decision.candidates, heldout_loss)) if note]
        lines += [f"note: {n}" for n in decision_interval_notes(decision.candidates)]
        lines += calibration_notes(decision)
        stop = getattr(decision, "stop_reason", None)
        # an unresolved stop with a credible candidate stopped below the tolerance too: both notes say why
        if getattr(decision, "stop_tolerance", None) is not None and (stop == "gain_below_tolerance" or (
                stop == "heldout_too_small" and decision.stop_tolerance_se is not None)):
            lines.append(stop_tolerance_note(decision))
        if stop == "heldout_too_small":
            lines.append(heldout_resolution_note(decision))
        if getattr(decision, "close_call", False):
            difference, se = decision.margin
            runner_up = display_name(decision.runner_up)
            if difference < 0:  # the runner-up predicts more; its P(decrease) kept it from being chosen
                lines.append(f"note: close call: {runner_up} predicts a held-out decrease larger by {num(-difference)} "
                             "than the choice's, but its P(decrease) is below the threshold: the choice is the "
                             "credible one, not the one predicted best")
            else:
                lines.append(f"note: close call: {runner_up} is {num(difference)} behind the choice in held-out "
                             f"change, within the standard error of the difference ({num(se)}): the held-out data "
                             "does not tell them apart (they may be as good as each other; on the decision bench "
                             "close calls picked the best candidate less often, docs/predictive-validity.md)")
    return "\n".join(lines)


def _screen_ranked(candidates, order) -> bool:
    """Whether the rows ``order`` lists are in the first-order screen's ranking (its largest decrease first)."""
    screen = [getattr(candidates[name], "screen_heldout_change", None) for name in order]  # a decision's rows have it
    return None not in screen and all(a <= b for a, b in zip(screen, screen[1:]))


def decision_legend(recipe, screen_ranked: bool = False) -> str:
    """The line under a decision's table that says what its columns are, as ``satcore score``'s legend does: without
    it "held-out change" beside a trial of 75 steps reads as the change those steps made, where it is the prediction
    for the ``recipe``'s steps (None: a decision that states no recipe).  ``screen_ranked``: the rows are in the
    screen's ranking, as a decision's are, and the line says so (rows in neither depth nor the trials' order read as
    unordered)."""
    after = "" if recipe is None else f" after your {recipe.steps} steps"
    rows = ("; rows: in the first-order screen's ranking (its largest decrease first), which the trials do not "
            "re-sort" if screen_ranked else "")
    return (f"columns: held-out change = the held-out loss{after} minus before, predicted from the trial's curve "
            "(negative: a decrease; a (screen) row: the first-order screen's value, no trial); interval = its 95% "
            "interval; P(decrease) = the calibrated probability that the block trained with the recipe lowers the "
            f"held-out loss; trial = the steps that trial trained (the recipe's steps shared among the trials){rows}")


def trial_family_line(decision) -> str | None:
    """What block the decision's trials trained, in one line: ``"trials trained: conv branch (family auto)"``, each
    family with its candidates where the trials trained several (``CandidateDecision.trial_family``, the requested
    ``InsertionDecision.requested_family`` in brackets); None where no trial recorded its family.  A ``native``
    trial trained the model's own block, the one ``insert_block`` inserts; any other a residual branch of the
    family, the one ``grow(..., zero=True)`` inserts."""
    at = {}
    for name, candidate in decision.candidates.items():
        if (family := getattr(candidate, "trial_family", None)) is not None:
            at.setdefault(family, []).append(display_name(name))
    if not at:
        return None
    blocks = {family: "the model's own block" if family == "native" else f"{family} branch" for family in at}
    trained = (next(iter(blocks.values())) if len(at) == 1 else
               "; ".join(f"{blocks[family]} at {', '.join(names)}" for family, names in at.items()))
    requested = getattr(decision, "requested_family", None)
    return f"trials trained: {trained}" + ("" if requested is None else f" (family {requested})")


def never_chosen_notes(candidates) -> list[str]:
    """The notes naming a decision's rows that can never be chosen (``candidates``: name -> ``CandidateDecision``,
    in table order, the screen's): those successive halving eliminated, and those no trial verified, with why
    these were not verified (the screen ranked them outside the trials; a verified row's screen value is not in
    the table, so without the reason an unverified row with a large screen decrease reads as a place skipped)."""
    notes = []
    eliminated = [display_name(n) for n, c in candidates.items() if getattr(c, "eliminated", False)]
    if eliminated:
        notes.append(f"note: never chosen: {', '.join(eliminated)} eliminated in successive halving's first stage "
                     "(the change shown is its shorter trial's prediction)")
    unverified = [display_name(n) for n, c in candidates.items() if getattr(c, "trial", None) is None]
    if unverified:
        verified = sum(getattr(c, "trial", None) is not None for c in candidates.values())
        why = ("no trial ran" if not verified else
               f"the screen ranked it outside the {verified} place(s) the trials verified (rows are in the screen's "
               "order, by its first-order held-out change, to_dict()'s screen_heldout_change; "
               "TrialSettings(max_trials=...) verifies more)")
        notes.append(f"note: never chosen: {', '.join(unverified)} {NOT_VERIFIED}: {why}; "
                     f"{'its' if len(unverified) == 1 else 'their'} held-out change is "
                     "the first-order screen's, often far off in magnitude, with no interval or P(decrease)")
    return notes


def _evidence_cells(candidate) -> list[str]:
    """A decision row's held-out change, interval and P(decrease) cells; a candidate no trial verified shows the
    screen's change marked as such and the words "not verified" where a trial would give its probability."""
    if getattr(candidate, "verified", False):
        return [num(candidate.predicted_heldout_change), _interval(candidate.interval), num(candidate.p_decrease)]
    return [f"{num(candidate.predicted_heldout_change)} (screen)", "-", NOT_VERIFIED]


def _trial_cell(candidate) -> str:
    """The trial a decision row rests on: its steps, whether halving eliminated it, or none (the screen's)."""
    trial = getattr(candidate, "trial", None)
    if trial is None:
        return f"none: {NOT_VERIFIED} (screen only)"
    return f"{trial.steps[-1]} steps" + (" (eliminated)" if getattr(candidate, "eliminated", False) else "")


def decision_interval_notes(candidates, alpha: float = 0.05) -> list[str]:
    """The lines a decision's table needs where its columns could mislead (``candidates``: name ->
    ``CandidateDecision``, in table order): a trialled candidate whose ``1 - alpha`` interval reaches 0
    beside a ``P(decrease)`` of at least ``1 - alpha / 2``, and a point outside its own interval."""
    trialled = [n for n, c in candidates.items() if getattr(c, "verified", False)]
    notes = []
    disagree = [n for n in trialled if candidates[n].interval[1] >= 0 and candidates[n].p_decrease >= 1 - alpha / 2]
    if disagree:
        notes.append(f"{', '.join(map(display_name, disagree))}: the {1 - alpha:.0%} interval reaches 0 while "
                     f"P(decrease) is at least {1 - alpha / 2:g}: the interval is from the calibrated residual "
                     "quantiles, P(decrease) from the calibrated logistic of the point over its error scale; they "
                     "answer different questions and can disagree near zero")
    outside = [n for n in trialled
               if not candidates[n].interval[0] <= candidates[n].predicted_heldout_change <= candidates[n].interval[1]]
    if outside:
        notes.append(f"{', '.join(map(display_name, outside))}: the point lies outside its {1 - alpha:.0%} interval, "
                     "whose ends are the calibrated residuals' quantiles, not symmetric around the point")
    return notes


def render_predictions(predictions) -> str:
    """The headline when a training split was given: what the stated step is predicted to gain, per candidate.
    No trial verified any of it: the held-out gain is marked as the screen's and the ``P(decrease)`` cell reads
    "not verified", as in a decision's screen-only rows (its fold test's probability was no probability of the
    trained block's decrease on the benches, ``satcore.HeldoutGain``)."""
    step = ", ".join(f"{k} {num(v)}" for k, v in predictions.step.items())
    rows = [[display_name(c.name), num(c.training_gain), num(c.training_gain_second_order),
             f"{num(c.heldout.value)} (screen)", "-", NOT_VERIFIED] for c in predictions.candidates]
    best = max(predictions.candidates, key=lambda c: c.heldout.value)
    return "\n".join([
        f"predicted gains of one inserted block trained by {predictions.optimizer} ({step}); loss units, positive = "
        "the loss falls; training gain from the training split, held-out gain from the probe split's folds:",
        table(["candidate", "train gain", "train gain (2nd order)", "held-out gain", "interval", "P(decrease)"], rows),
        f"note: {NOT_VERIFIED}: first-order extrapolations of the step, no trial of the recipe ran (decide verifies "
        f"by short trials); their size can exceed the held-out loss itself (the probe records no loss to compare them with): "
        f"{SCREEN_READING}; the fold interval and the fold test's probability omit the predictor's own error and "
        "are in the JSON only (predictions.candidates[].predicted_heldout_gain: interval, fold_test_p_positive; "
        "Python: report.predictions.candidates[i].heldout) (docs/predictive-validity.md)",
        f"largest predicted held-out gain: {num(best.heldout.value)} at {display_name(best.name)}"])


def render_verdict(verdict, tests, decided: bool = False) -> str:
    """The first-order verdict line; ``decided``: a trial decision leads the report, and its place, not this
    line's, is the one to act on (the two may differ: the trials train the block with the user's recipe)."""
    tol = verdict.tolerance
    if tol["units"] == "loss":
        tolerance = f"tolerance {num(tol['value'])} (loss units) at rho = {num(tol['rho'])}"
    else:
        tolerance = f"tolerance {num(tol['value'])} (growth-value units)"
    # "best candidate" only where a candidate passed the test; otherwise the name is just the largest unbiased
    # V^2 (not the raw V the line above names), and calling it "best" next to SATURATED or INCONCLUSIVE reads
    # as advice to insert there.
    pick = ("best candidate" if verdict.verdict == Verdict.IMPROVABLE
            else "largest unbiased V^2 (no candidate passed the test)")
    if decided and verdict.verdict == Verdict.IMPROVABLE:  # beside "decision: insert at X", "best" would contradict it
        pick = "largest first-order value (the decision above, from trials of your recipe, may choose elsewhere)"
    text = (f"first-order verdict: {verdict.verdict.upper()} (alpha {num(verdict.alpha)}, {tolerance}; "
            f"{verdict.method}); {pick}: {display_name(verdict.best_candidate)}")
    gains = [t for t in tests if t.predicted_gain is not None]
    for t in gains:
        g = t.predicted_gain
        text += (f"\n  predicted first-order gain at {display_name(t.name)} (rho {num(g.rho)}): {num(g.value)} "
                 f"in [{num(g.interval[0])}, {num(g.interval[1])}]")
    undecided = [t for t in tests if t.verdict == Verdict.INCONCLUSIVE and t.probe_size_to_decide is not None]
    if undecided:
        text += "\n  probe size estimated to decide: " + ", ".join(
            f"{display_name(t.name)} n ~ {t.probe_size_to_decide}" for t in undecided)
    if verdict.reason:
        text += f"\n  note: {display_name(verdict.reason)}"
    return text


def render_prop1(test) -> str:
    """Proposition 1's distribution-free reading, under its own name (never the headline)."""
    vacuous = " (vacuous: a bound above 1 says nothing)" if test.error_bound > 1 else ""
    text = (f"prop1 (distribution-free, Chebyshev + union bound): {test.verdict}: Gamma_hat = max ||C||_F = "
            f"{num(test.gamma_hat)} at {display_name(test.argmax)}, t = {num(test.t)}, delta = {num(test.delta)}, "
            f"P(|Gamma_hat - Gamma| >= t) <= {num(test.error_bound)}{vacuous}")
    if test.interval is not None:
        text += f"; Gamma in [{num(test.interval[0])}, {num(test.interval[1])}] at level {num(test.error_level)}"
    if test.required_probe_size is not None:
        text += (f"\nprop1 probe size for error <= {num(test.error_level)} at t = {num(test.t)}: "
                 f"n >= {test.required_probe_size} (this probe: {test.n_samples})")
    if test.detector_threshold is not None:
        below = "at or below" if test.detector_saturated else "above"
        text += (f"\ndetector (Theorem 3): Gamma_hat is {below} tau_n = S n^-1/4 = {num(test.detector_threshold)}"
                 " (a consistency statement as n grows, not a finite-sample verdict)")
    return text


def calibration_notes(decision) -> list[str]:
    """What the decision's calibration says of itself: the held-out sizes its error model was fitted on,
    and its evidence on the recipe's optimizer (a calibration of the user's own carries neither)."""
    calibration = getattr(decision, "calibration", None)
    if calibration is None:
        return []
    lines = []
    samples, fitted = getattr(decision, "heldout_samples", None), calibration.heldout_samples
    if samples is not None and fitted is not None and samples > fitted[1]:
        lines.append(f"note: {samples} held-out samples, more than the {fitted[1]} the calibration was fitted "
                     "with: the choice and the ranking stand, but read the intervals as too narrow and P(decrease) "
                     "as too close to 0 or 1 (on the decision bench, larger held-out splits made them "
                     "over-confident; docs/predictive-validity.md)")
    optimizer = getattr(getattr(decision, "recipe", None), "optimizer", None)
    lines += [f"note: {optimizer.upper()} recipe: {text}" for name, text in calibration.optimizer_notes
              if name == optimizer]
    return lines
