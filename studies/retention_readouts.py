"""Readouts of the general (old-domain) loss change for ``satcore expand``'s frontier, scored leave one pair out.

The frontier predicts, for each block count K of its arms (K = 0: the model as it is, trained with the
planned recipe; K = 1, 2: identity blocks at LLaMA-Pro's uniform places, only they train), the change of
the general held-out loss after the planned ``S`` steps, from a trial of ``T`` steps read at ``T/4``,
``T/2`` and ``T`` (the shipped readout: the least-squares line of the change in ``log2 t`` read at
``log2 S``).  The budget bench (``studies/expansion_budget.py``) recorded, per pair (near, far, perl) and
seed, the trials' mean target and general changes at the three checkpoints and the same arms' realized
changes after the planned training (``none`` and ``uniform-K`` at equal compute).  This study scores
other readouts of the same trials against the realized changes with the bench's must-show rule
(Spearman over every point; the sign where the realized cell's crossed interval over seeds and windows
excludes 0):

* readouts with a fitted number are fitted on two pairs and scored on the third (leave one pair out),
  the 27 held-out predictions pooled; fit-free readouts are scored as they are;
* the 2000-step near recordings (``expansion_long_near*.jsonl``) are a transfer set no fit reads (fits
  there use all three 400-step pairs);
* the controls' cells (:data:`CONTROLS`: one- and two-block bases, 2000 planned steps, trials of two readings,
  every seed) are another (:func:`evaluate_controls`), beside each fit-free readout on the main protocol's 135
  must-show points (every seed of the decision its criteria score).

The comparison reads seeds 0, 1 and 2 (:data:`SEEDS`, the seeds the probe reran), 27 points at 400 steps; the
bench's later seeds (3-5) enter its own must-show, not this table.

Readouts marked *probe* need readings the recordings do not hold; ``--probe`` reruns satcore's frontier
trials of the bench (the same windows, seeds and code: the recorded curves come back to the last digit)
with hooks on the trial loop that also record, at each checkpoint, the trainable parameters'
displacement from the start, the directional derivatives of the target and general held-out losses
along the last step and along the displacement, the cosine of their gradients, and, along the line
``theta0 + lambda (theta_t - theta0)``, both held-out changes at :data:`LINE_STEPS`.

    python -m studies.retention_readouts --probe      # a minute and a half on one core: the probe recording
    python -m studies.retention_readouts              # the table of the lab notes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from studies import expansion_budget as bench

RESULTS = Path(__file__).resolve().parent / "results"
PROBE = RESULTS / "retention_probe.jsonl"
LINE_STEPS = (0.5, 1.5, 2.0)
PAIRS = bench.PAIRS
SEEDS = (0, 1, 2)  # the seeds the readouts were compared on and the probe reran; the bench's later seeds are not read
# the controls (the bench's lab notes: a positive control, a control the rule can reach): each its sweep and the rule
# at the shipped carry error, every seed recorded
CONTROLS = (("1 block, near", ("control_L1_sweep_near", "control_L1_carry_near")),
            ("2 blocks, near", ("control_L2_sweep_near", "control_L2_carry_near")),
            ("1 block, far", ("positive_L1_sweep_far", "positive_L1_carry_far")))


def recorded_points() -> dict:
    """``{"400": [...], "2000": [...]}``: one point per (pair, seed, K) of every satcore row of :data:`SEEDS` with a
    realized sweep row (:func:`_points`)."""
    return {"400": _points("400", bench.main_protocol_files(RESULTS), SEEDS),
            "2000": _points("2000", sorted(RESULTS.glob("expansion_long_near*.jsonl")), SEEDS)}


def _points(tag: str, paths, seeds=None, arm: str = "satcore") -> list:
    """One point per (pair, seed in ``seeds`` (None: every seed), K) of every ``arm`` row in the result files ``paths`` with a realized
    sweep row, holding the trial curves (``h``: target, ``g``: general), the frontier's predictions, the realized
    changes from the base model (``real_g``, and ``general_windows`` for the noise rule) and the arms' step costs
    (``costs``, in planned steps); ``set``: ``tag``."""
    _, _, base, runs = bench._load(paths)
    points = []
    for pair, arms in runs.items():
        base_general = np.asarray(base[pair]["general_windows"])
        for seed, ours in sorted(arms.get(arm, {}).items()):
            if seeds is not None and seed not in seeds:
                continue
            decision = ours["evidence"]["record"]["decision"]
            costs = dict(zip([e["blocks"] for e in decision["frontier"]], decision["plan"]["step_costs"]))
            for entry in ours["evidence"]["frontier"]:
                row = bench._sweep_row(arms, entry["blocks"], seed)
                if row is None:
                    continue
                windows = np.subtract(row["general_windows"], base_general)
                g = np.mean(entry["trial"]["general_change"], 0)
                points.append({  # the checkpoints the trial read (the race may stop it before the last)
                    "set": tag, "pair": pair, "seed": seed, "K": entry["blocks"],
                    "S": decision["plan"]["planned_steps"], "checkpoints": decision["plan"]["checkpoints"][:len(g)],
                    "h": np.mean(entry["trial"]["heldout_change"], 0), "g": g,
                    "pred_t": entry["predicted_heldout_change"], "pred_g": entry["predicted_general_change"],
                    "gap": decision["heldout_loss"] - decision["general_loss"], "costs": costs,
                    "real_g": float(windows.mean()), "general_windows": windows})
    return points


def control_points() -> list:
    """The controls' points (:data:`CONTROLS`, every seed, the shipped rule's frontier), ``set`` naming the control."""
    return [p for label, names in CONTROLS
            for p in _points(label, [RESULTS / f"expansion_budget_{n}.jsonl" for n in names], arm="satcore-carry")]


def main_points() -> list:
    """The main protocol's must-show points: every seed of the decision its criteria score (``satcore-carry``)."""
    return _points("main", bench.main_protocol_files(RESULTS), arm="satcore-carry")


def attach_probe(points: list, path: Path) -> bool:
    """Adds the probe's readings at the trial's end to each point (False: no probe recording)."""
    if not path.exists():
        return False
    rows = {(r["pair"], r["seed"], r["steps"]): r for r in map(json.loads, path.read_text().splitlines())}
    for p in points:
        r = rows[p["pair"], p["seed"], p["S"]]
        trial = r["trials"][[f["blocks"] for f in r["frontier"]].index(p["K"])]
        if not np.allclose(trial["general_change"], p["g"], rtol=0, atol=1e-9):
            raise SystemExit(f"{path}: the rerun trial of {p['pair']} seed {p['seed']} K = {p['K']} is not the "
                             "recorded one")
        p["probe"] = trial
    return True


def _noise_cells(points) -> list[bool]:
    cells = {}
    for p in points:
        cells.setdefault((p["set"], p["pair"], p["K"]), []).append(p["general_windows"])
    above = {c: (lambda i: i["low"] > 0 or i["high"] < 0)(bench.crossed_interval(v)) for c, v in cells.items()}
    return [above[p["set"], p["pair"], p["K"]] for p in points]


def score(predicted, points) -> tuple[float, int, int]:
    """The must-show's numbers: ``(Spearman, signs right, points above seed noise)``."""
    realized = [p["real_g"] for p in points]
    right, counted = bench.sign_agreement(predicted, realized, _noise_cells(points))
    return bench.spearman(predicted, realized), int(right), counted


def _line(checkpoints, values):
    """Intercept and slope of the least-squares line of ``values`` on ``log2`` of the checkpoints."""
    x = np.log2(checkpoints)
    return np.linalg.lstsq(np.stack([np.ones_like(x), x], 1), np.asarray(values, np.float64), rcond=None)[0]


def _ls(values, checkpoints, at: float) -> float:
    """That line read at ``log2 at`` (the shipped readout, at ``at = S``)."""
    intercept, slope = _line(checkpoints, values)
    return float(intercept + slope * np.log2(at))


def _ratio(p) -> float:
    """The trial's general change per unit of target change: least squares through 0 over the checkpoints."""
    return float(p["g"] @ p["h"] / (p["h"] @ p["h"]))


def _integral(p, ratio) -> float:
    """``g(T)`` plus the target's predicted progress from ``T`` to ``S`` weighted by ``ratio`` (per checkpoint,
    extrapolated linearly in ``log2 t``): ``h = a + b x``, ``r = c + e x``, ``x = log2 t``, so
    ``int r dh = b [c (x_S - x_T) + e (x_S^2 - x_T^2) / 2]``."""
    _, b = _line(p["checkpoints"], p["h"])
    c, e = _line(p["checkpoints"], ratio)
    xT, xS = np.log2(p["checkpoints"][-1]), np.log2(p["S"])
    return float(p["g"][-1] + b * (c * (xS - xT) + e * (xS ** 2 - xT ** 2) / 2))


def _half(p) -> float:
    return float(np.interp(np.log(p["checkpoints"][-1] / 2), np.log(p["checkpoints"]), p["g"]))


def _doublings(p) -> float:
    return float(np.log2(p["S"] / p["checkpoints"][-1]))


def _line_quadratic(p) -> float:
    """The probe's general change along the trial's line, ``a lambda + b lambda^2`` fitted over
    ``lambda`` in {0.5, 1, 1.5, 2}, read where the displacement's power law in ``t`` puts step ``S``."""
    probe = p["probe"]
    lam = np.array([0.5, 1.0, 1.5, 2.0])
    g = np.array([probe["line"]["0.5"]["general"], p["g"][-1], probe["line"]["1.5"]["general"],
                  probe["line"]["2.0"]["general"]])
    a, b = np.linalg.lstsq(np.stack([lam, lam ** 2], 1), g, rcond=None)[0]
    gamma = np.polyfit(np.log(p["checkpoints"]), np.log(probe["displacement"]), 1)[0]
    reach = (p["S"] / p["checkpoints"][-1]) ** gamma
    return float(a * reach + b * reach ** 2)


def _directional_ratio(p, along: str) -> np.ndarray:
    return np.array([d["general"][along] / d["heldout"][along] for d in p["probe"]["directional"]])


def _fit_linear(features):
    """A readout ``w . [1, features(p)]`` with ``w`` the least squares of the realized change on the fit pairs."""
    def fit(points):
        design = np.array([[1.0, *features(p)] for p in points])
        return np.linalg.lstsq(design, np.array([p["real_g"] for p in points]), rcond=None)[0]
    return (lambda p, w: float(np.r_[1.0, features(p)] @ w)), fit


def _fit_slope(x, y):
    """A fitted scalar ``sum x y / sum x^2`` over the fit pairs' points (``x``, ``y``: functions of a point)."""
    return lambda points: float(sum(x(p) * y(p) for p in points) / sum(x(p) ** 2 for p in points))


def _k0_shipped(readout):
    """``readout`` for K > 0; K = 0 keeps the shipped prediction (its trial is the full-model shock)."""
    return lambda p, w: p["pred_g"] if p["K"] == 0 else readout(p, w)


def _paired_k0(p, points) -> float:
    """K = 0's last general reading plus the least-squares line of the arm's general curve minus K = 0's."""
    none = next(q for q in points if (q["set"], q["pair"], q["seed"], q["K"]) == (p["set"], p["pair"], p["seed"], 0))
    read = min(len(p["g"]), len(none["g"]))  # the checkpoints both read (the race may stop one arm first)
    return none["g"][read - 1] + _ls(np.subtract(p["g"][:read], none["g"][:read]), p["checkpoints"][:read], p["S"])


def readouts(all_points) -> list[tuple]:
    """``(name, readout(point, fitted), fit(points) or None, needs the probe)``."""
    ratio_beta = _fit_slope(lambda p: p["pred_t"] ** 2, lambda p: p["real_g"] - _ratio(p) * p["pred_t"])
    trend_beta = _fit_slope(lambda p: (p["g"][-1] - _half(p)) * _doublings(p), lambda p: p["real_g"] - p["g"][-1])
    return [
        ("shipped: least squares in log2 t, read at log2 S", lambda p, w: p["pred_g"], None, False),
        ("the same, recomputed from the recorded curves", lambda p, w: _ls(p["g"], p["checkpoints"], p["S"]), None,
         False),
        ("the trial's last reading g(T)", lambda p, w: p["g"][-1], None, False),
        ("least squares in log2 t, read at each arm's equal-compute steps",
         lambda p, w: _ls(p["g"], p["checkpoints"], p["S"] / p["costs"][p["K"]]), None,
         False),
        ("trend per doubling: g(T) + [g(T) - g(T/2)] log2(S/T)",
         lambda p, w: p["g"][-1] + (p["g"][-1] - _half(p)) * _doublings(p), None, False),
        ("trend per doubling, its weight fitted",
         lambda p, w: p["g"][-1] + w * (p["g"][-1] - _half(p)) * _doublings(p),
         trend_beta, False),
        ("ratio to the target: (g.h / h.h) x predicted target change", lambda p, w: _ratio(p) * p["pred_t"], None,
         False),
        ("the same, K = 0 shipped", _k0_shipped(lambda p, w: _ratio(p) * p["pred_t"]), None, False),
        ("ratio extrapolated in log2 t (clipped to [-1, 1]) x predicted target change, K = 0 shipped",
         _k0_shipped(lambda p, w: float(np.clip(_ls(p["g"] / p["h"], p["checkpoints"], p["S"]), -1, 1)) * p["pred_t"]),
         None, False),
        ("g(T) + target progress T..S weighted by the extrapolated ratio g/h, K = 0 shipped",
         _k0_shipped(lambda p, w: _integral(p, p["g"] / p["h"])), None, False),
        ("ratio x predicted target + beta (predicted target)^2, beta fitted, K = 0 shipped",
         _k0_shipped(lambda p, w: _ratio(p) * p["pred_t"] + w * p["pred_t"] ** 2),
         lambda pts: ratio_beta([q for q in pts if q["K"] > 0]), False),
        ("paired to K = 0: K = 0's last reading + least squares of g_K - g_0", lambda p, w: _paired_k0(p, all_points),
         None, False),
        ("fitted a + b predicted + c [K = 0]", *_fit_linear(lambda p: [p["pred_g"], p["K"] == 0]), False),
        ("fitted a + b (decision's target minus general loss) + c [K = 0]",
         *_fit_linear(lambda p: [p["gap"], p["K"] == 0]), False),
        ("probe: directional ratio along the last step at T x predicted target, K = 0 shipped",
         _k0_shipped(lambda p, w: _directional_ratio(p, "step")[-1] * p["pred_t"]), None, True),
        ("probe: g(T) + target progress weighted by the extrapolated directional ratio, K = 0 shipped",
         _k0_shipped(lambda p, w: _integral(p, _directional_ratio(p, "step"))), None, True),
        ("probe: gradient cosine at T x predicted target, K = 0 shipped",
         _k0_shipped(lambda p, w: p["probe"]["directional"][-1]["cos"] * p["pred_t"]), None, True),
        ("probe: displacement x curvature along the trial's line", lambda p, w: _line_quadratic(p), None, True),
    ]


def evaluate(points: dict, probed: bool, draws: int = 2000) -> list[str]:
    """The table: per readout, leave-one-pair-out Spearman and signs at 400 steps (all, near + far, perl) and on
    the 2000-step transfer set; a fit-free readout's Spearman minus the shipped one's over ``draws`` seed
    bootstraps (none: ``-``)."""
    out = ["| readout | held out: Spearman (27 points) | minus shipped (95%, seeds resampled) | sign | near + far "
           "| perl | 2000 steps (transfer): Spearman | sign |", "|---|---|---|---|---|---|---|---|"]
    shipped = [p["pred_g"] for p in points["400"]]
    for name, readout, fit, needs_probe in readouts(points["400"] + points["2000"]):
        if needs_probe and not probed:
            continue
        held = {}
        for pair in PAIRS:
            w = fit([p for p in points["400"] if p["pair"] != pair]) if fit else None
            held.update({id(p): readout(p, w) for p in points["400"] if p["pair"] == pair})
        pts = points["400"]
        rho, right, counted = score([held[id(p)] for p in pts], pts)
        part = {name: bench.spearman([held[id(p)] for p in pts if keep(p)], [p["real_g"] for p in pts if keep(p)])
                for name, keep in (("nf", lambda p: p["pair"] != "perl"), ("perl", lambda p: p["pair"] == "perl"))}
        w = fit(pts) if fit else None
        rho2, right2, counted2 = score([readout(p, w) for p in points["2000"]], points["2000"])
        interval = "-" if fit or not draws else "[{:+.3f}, {:+.3f}]".format(
            *seed_bootstrap(pts, [held[id(p)] for p in pts], shipped, draws))
        out.append(f"| {name} | {rho:+.3f} | {interval} | {right} of "
                   f"{counted} | {part['nf']:+.3f} | {part['perl']:+.3f} | {rho2:+.3f} | {right2} of {counted2} |")
    return out


def evaluate_controls(points: dict, controls: list, main: list) -> list[str]:
    """The controls' points as a transfer set no fit reads (another base, budget and trial length): per readout
    (fitted readouts fitted on the three 400-step pairs, as for the 2000-step set; the probe's need readings the
    controls' rows do not hold), Spearman and signs over every control's points pooled, Spearman per control, and
    beside them a fit-free readout's on ``main`` (the main protocol's must-show points: every seed of the decision
    it scores; fitted readouts are scored there one pair out, in :func:`evaluate`)."""
    labels = [label for label, _ in CONTROLS]
    out = [f"| readout | controls (transfer): Spearman ({len(controls)} points) | sign | " + " | ".join(labels)
           + f" | main protocol ({len(main)} points): Spearman | sign |", "|---|---|---|" + "---|" * len(labels)
           + "---|---|"]
    for name, readout, fit, needs_probe in readouts(points["400"] + points["2000"] + controls + main):
        if needs_probe:
            continue
        w = fit(points["400"]) if fit else None
        predicted = [readout(p, w) for p in controls]
        rho, right, counted = score(predicted, controls)
        each = [bench.spearman(*zip(*[(v, p["real_g"]) for v, p in zip(predicted, controls) if p["set"] == label]))
                for label in labels]
        on_main = "- | -" if fit else "{:+.3f} | {} of {}".format(*score([readout(p, None) for p in main], main))
        out.append(f"| {name} | {rho:+.3f} | {right} of {counted} | " + " | ".join(f"{r:+.3f}" for r in each)
                   + f" | {on_main} |")
    return out


def seed_bootstrap(points, predicted, reference, draws: int = 2000) -> tuple[float, float]:
    """95% interval of ``Spearman(predicted) - Spearman(reference)`` against the realized changes, the seeds drawn
    with replacement within each pair (each draw keeps a seed's points together; a fit-free readout only)."""
    rng = np.random.default_rng(0)
    groups = {}
    for i, p in enumerate(points):
        groups.setdefault(p["pair"], {}).setdefault(p["seed"], []).append(i)
    realized = np.array([p["real_g"] for p in points])
    predicted, reference = np.asarray(predicted), np.asarray(reference)
    differences = []
    for _ in range(draws):
        rows = [i for seeds in groups.values() for s in rng.choice(sorted(seeds), len(seeds)) for i in seeds[s]]
        differences.append(bench.spearman(predicted[rows], realized[rows])
                           - bench.spearman(reference[rows], realized[rows]))
    low, high = np.percentile(differences, [2.5, 97.5])
    return float(low), float(high)


def diagnostics(points: dict) -> list[str]:
    """Where the shipped readout's error lives: each K's predictions replaced by the realized changes, the ranking
    over K within one decision, and the must-show on paired differences to K = 0."""
    out = []
    for name, keep in (("K = 0 realized, K > 0 shipped", lambda p: p["K"] == 0),
                       ("K = 0 shipped, K > 0 realized", lambda p: p["K"] > 0)):
        numbers = [score([p["real_g"] if keep(p) else p["pred_g"] for p in points[s]], points[s])
                   for s in ("400", "2000")]
        out.append(f"* {name}: 400 steps Spearman {numbers[0][0]:+.3f}, sign {numbers[0][1]} of {numbers[0][2]}; "
                   f"2000 steps {numbers[1][0]:+.3f}, {numbers[1][1]} of {numbers[1][2]}")
    for s in ("400", "2000"):
        decisions = sorted({(p["pair"], p["seed"]) for p in points[s]})
        within = [bench.spearman(*zip(*[(p["pred_g"], p["real_g"]) for p in points[s] if (p["pair"], p["seed"]) == d]))
                  for d in decisions]
        paired = [(p["pred_g"] - n["pred_g"], p["real_g"] - n["real_g"]) for p in points[s] if p["K"] > 0
                  for n in points[s] if (n["pair"], n["seed"], n["K"]) == (p["pair"], p["seed"], 0)]
        predicted, realized = zip(*paired)
        out.append(f"* {s} steps: Spearman over K within each decision, mean {np.mean(within):+.2f} over "
                   f"{len(within)}; paired to K = 0 (K > 0 minus K = 0, predicted against realized): Spearman "
                   f"{bench.spearman(predicted, realized):+.3f}, sign "
                   f"{sum(np.sign(predicted) == np.sign(realized))} of "
                   f"{len(realized)}")
    return out


def probe(out: Path) -> None:
    """Reruns satcore's frontier decisions of the bench (400 steps: near, far, perl; 2000 steps: near; :data:`SEEDS`)
    with :class:`_Readings` hooked into the trial loop, and appends one row per decision to ``out``."""
    import torch

    import satcore.adapters.torch.expansion_frontier as frontier
    from studies.expansion import pretrained

    torch.set_num_threads(1)
    args = argparse.Namespace(layers=8, width=48, seq_len=48, batch_size=8, lr=1e-3, pretrain_steps=1500, device="cpu")
    streams = bench.texts()
    base, _ = pretrained(args, streams["general"][0], f"budget-{'+'.join(bench.GENERAL_DIRS)}-", {})
    readings = _Readings(frontier)
    for steps, pairs in ((400, PAIRS), (2000, ("near",))):
        for pair in pairs:
            for seed in SEEDS:
                readings.reset()
                plan = {"steps": steps, "lr": args.lr, "batch_size": args.batch_size, "seq_len": args.seq_len,
                        "decision_windows": None, "general_windows": None, "trial_windows": None}
                decided = bench.satcore_decision(base, streams[pair][0], streams["general"][0], plan, seed)
                row = {"pair": pair, "seed": seed, "steps": steps,
                       "frontier": [{"blocks": e["blocks"], "predicted_general_change": e["predicted_general_change"]}
                                    for e in decided["frontier"]],
                       "trials": [{k: v for k, v in t.items() if k != "pending"} for t in readings.trials]}
                with open(out, "a") as stream:
                    stream.write(json.dumps(row) + "\n")
                print(pair, steps, seed, flush=True)
    readings.close()


class _Readings:
    """Hooks on the frontier's trial loop: its optimizer (to know the trained parameters and their start) and its
    held-out evaluation (after each checkpoint's reading: the probe's readings on the same windows)."""

    def __init__(self, frontier):
        self.frontier, self.optimizer, self.evaluate = frontier, frontier.recipe_optimizer, frontier.per_sample_eval
        frontier.recipe_optimizer, frontier.per_sample_eval = self._optimizer, self._evaluate
        self.trials, self.first = [], {}
        self.reset()

    def reset(self) -> None:
        """Before a decision: its first readings are the model's own."""
        self.trials.clear()
        self.first.clear()
        self.params = self.previous = None

    def close(self) -> None:
        self.frontier.recipe_optimizer, self.frontier.per_sample_eval = self.optimizer, self.evaluate

    def _optimizer(self, recipe, params):
        self.params = list(params)
        self.start = [p.detach().clone() for p in self.params]
        self.previous = None
        self.trials.append({"displacement": [], "directional": [], "line": {}, "general_change": [], "pending": {}})
        optimizer = self.optimizer(recipe, self.params)
        step = optimizer.step

        def tracked(*args, **kwargs):
            self.previous = [p.detach().clone() for p in self.params]
            return step(*args, **kwargs)
        optimizer.step = tracked
        return optimizer

    def _evaluate(self, model, batches, loss_fn, progress=None):
        import torch

        losses = self.evaluate(model, batches, loss_fn, progress)
        if self.params is None or self.previous is None:  # the model's own reading, before any trial step
            self.first[id(batches)] = float(losses.mean())
            return losses
        trial = self.trials[-1]
        split = "heldout" if not trial["pending"] else "general"
        grads = self._gradient(model, batches, loss_fn)
        moves = {"step": [p.detach() - q for p, q in zip(self.params, self.previous)],
                 "displacement": [p.detach() - q for p, q in zip(self.params, self.start)]}
        trial["pending"][split] = {"grads": grads, "losses": losses, "batches": batches, "model": model,
                                   "loss_fn": loss_fn,
                                   **{k: float(sum((g * m).sum() for g, m in zip(grads, v))) for k, v in moves.items()},
                                   "norm": float(torch.sqrt(sum((g * g).sum() for g in grads)))}
        if split == "general":
            self._checkpoint(trial, moves["displacement"])
        return losses

    def _checkpoint(self, trial, displacement) -> None:
        import torch

        pending = trial.pop("pending")
        trial["pending"] = {}
        cosine = float(sum((a * b).sum() for a, b in zip(pending["heldout"]["grads"], pending["general"]["grads"]))
                       / (pending["heldout"]["norm"] * pending["general"]["norm"]))
        trial["directional"].append({"cos": cosine, **{s: {k: pending[s][k] for k in ("step", "displacement", "norm")}
                                                      for s in ("heldout", "general")}})
        trial["displacement"].append(float(torch.sqrt(sum((d * d).sum() for d in displacement))))
        trial["general_change"].append(float(pending["general"]["losses"].mean() - self._before(pending["general"])))
        end = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for lam in LINE_STEPS:
                for p, a, b in zip(self.params, self.start, end):
                    p.copy_(a + lam * (b - a))
                trial["line"][str(lam)] = {
                    s: float(self.evaluate(pending[s]["model"], pending[s]["batches"], pending[s]["loss_fn"]).mean()
                             - self._before(pending[s])) for s in ("heldout", "general")}
            for p, b in zip(self.params, end):
                p.copy_(b)

    def _before(self, pending) -> float:
        """The model's own mean loss on these windows: the first reading of the decision (``read_model``)."""
        return self.first[id(pending["batches"])]

    def _gradient(self, model, batches, loss_fn) -> list:
        import torch

        from satcore.adapters.torch.probe import call_model

        for p in self.params:
            p.grad = None
        count = 0
        with torch.enable_grad():
            for inputs, labels in batches:
                loss = loss_fn(call_model(model, inputs), labels)
                loss.sum().backward()
                count += loss.numel()
        grads = [p.grad.detach() / count for p in self.params]
        for p in self.params:
            p.grad = None
        return grads


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", action="store_true", help="rerun the frontier trials with the extra readings first")
    p.add_argument("--probe-out", type=Path, default=PROBE)
    args = p.parse_args(argv)
    if args.probe:
        args.probe_out.unlink(missing_ok=True)
        probe(args.probe_out)
    points = recorded_points()
    probed = attach_probe(points["400"], args.probe_out) and attach_probe(points["2000"], args.probe_out)
    print("\n".join(evaluate(points, probed) + [""] + diagnostics(points) + [""]
                    + evaluate_controls(points, control_points(), main_points())))


if __name__ == "__main__":
    main()
