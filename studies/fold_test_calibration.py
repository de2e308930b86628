"""Calibration of the per-candidate fold test: size under H0, power beside Proposition 1, interval coverage.

Monte Carlo on synthetic per-sample gradients (Gaussian, heavy-tailed, rank-one
heteroscedastic, high effective dimension, unequal folds) and on real per-sample
``(q, psi)`` of a ResNet on scikit-learn's digits, where flipping the sign of
each sample's ``q`` makes ``H0`` exact.  Every probe goes through
:class:`satcore.CandidateStatistics` in 16 batches (one per fold), so the
feature Gram ``K`` is estimated as in a real probe.  Writes the
``calibration`` section (``--looks``: ``calibration_looks``) of
``studies/results/fold_test_calibration.json``; docs/verdicts.md and docs/growth.md show the tables.

Usage: ``python -m studies.fold_test_calibration [--quick] [--reps N] [--looks]``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

import satcore
from bench._results import record

RESULTS = Path(__file__).resolve().parent / "results" / "fold_test_calibration.json"
ALPHA = 0.05
N_HIDDEN, FOLDS = 4, 16


def stats_in_batches(q, psi, sizes):
    s = satcore.CandidateStatistics(q.shape[2], psi.shape[2], q.shape[1])
    start = 0
    for size in sizes:
        s.update(q[start : start + size], psi[start : start + size])
        start += size
    return s.score("c")


def null_setting(kind):
    """``(M, r, draw(rng) -> (q, psi), uneven)`` of one H0 setting."""

    def draw(rng, M, r):
        psi = rng.standard_normal((M, 2, r))
        if kind == "heavy":
            q = rng.standard_t(2.5, size=(M, 2, N_HIDDEN))
        elif kind == "rank_one":
            q = rng.standard_normal((M, 2, 1)) * (1 + np.abs(psi[..., :1])) * np.ones((1, 1, N_HIDDEN))
        else:
            q = rng.standard_normal((M, 2, N_HIDDEN))
        return q, psi

    return draw


NULLS = {  # name: (kind, M, r, uneven folds)
    "gaussian": ("gaussian", 96, 6, False),
    "heavy_tailed_t2.5_unequal_folds": ("heavy", 96, 6, True),
    "rank_one_heteroscedastic": ("rank_one", 96, 6, False),
    "high_dim_Nr160_M96": ("gaussian", 96, 40, True),
    "gaussian_M1024": ("gaussian", 1024, 6, False),
}


def fold_sizes(rng, M, uneven):
    if uneven:
        return list(rng.multinomial(M - FOLDS, np.ones(FOLDS) / FOLDS) + 1)
    return [M // FOLDS] * FOLDS


def size_table(reps, rng):
    rows = {}
    for name, (kind, M, r, uneven) in NULLS.items():
        draw = null_setting(kind)
        p = []
        prop1 = 0
        for _ in range(reps):
            q, psi = draw(rng, M, r)
            score = stats_in_batches(q, psi, fold_sizes(rng, M, uneven))
            p.append(score.fold_test.p_value)
            prop1 += prop1_improvable(score, M)
        rows[name] = rates(np.array(p), reps, prop1)
    rows["real_digits_resnet_sign_flipped"] = real_null(reps, rng)
    return rows


def rates(p, reps, prop1):
    return {"reps": reps, "reject_0.05": float(np.mean(p < 0.05)), "reject_0.01": float(np.mean(p < 0.01)),
            "mc_se_0.05": math.sqrt(0.05 * 0.95 / reps), "prop1_improvable": prop1 / reps}


def prop1_improvable(score, M) -> bool:
    return satcore.saturation_test(["c"], [score.cross_gradient_norm], [score.sigma_sq], [M],
                                   error=ALPHA).verdict == "improvable"


def real_gradients():
    """Per-sample ``(Q, Psi)`` at the input of the second stage of a ResNet on digits (linear family)."""
    import torch
    from sklearn.datasets import load_digits

    from zoo.models import StagewiseResNet
    from zoo.training import train_classifier

    torch.manual_seed(0)
    digits = load_digits()
    x = ((digits.images / 16.0 - 0.3) / 0.4).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    model = StagewiseResNet(n_added=1, widths=(8, 16, 32))
    train_classifier(model, x[:1000], y[:1000], epochs=5, seed=0, lr=0.05)
    model = model.double().eval()
    xs, ys = torch.as_tensor(x[1000:1160]).double(), torch.as_tensor(y[1000:1160])
    stream = {}
    block = dict(model.named_modules())["layer2.0"]
    handle = block.register_forward_pre_hook(lambda _m, inputs: stream.update(z=inputs[0]) or inputs[0].retain_grad())
    torch.nn.functional.cross_entropy(model(xs), ys, reduction="sum").backward()
    handle.remove()
    z = stream["z"]
    return satcore._formulas.families.positions(z.grad.numpy()), satcore._formulas.families.positions(z.detach().numpy())


def real_null(reps, rng):
    Q, Psi = real_gradients()
    sizes = [Q.shape[0] // FOLDS] * FOLDS
    p, prop1 = [], 0
    for _ in range(reps):
        signs = rng.choice((-1.0, 1.0), size=(Q.shape[0], 1, 1))
        score = stats_in_batches(Q * signs, Psi, sizes)
        p.append(score.fold_test.p_value)
        prop1 += prop1_improvable(score, Q.shape[0])
    out = rates(np.array(p), reps, prop1)
    unflipped = stats_in_batches(Q, Psi, sizes).fold_test.p_value
    out["unflipped_p_value"] = unflipped
    return out


def power_table(reps, rng, shifts=(0.05, 0.1, 0.2, 0.35)):
    """q = noise + s psi[:N]: V_pop^2 = s^2 N exactly (K_pop = I)."""
    rows = {}
    M, r = 128, 6
    for s in shifts:
        hits = prop1 = covered = 0
        truth = s * s * N_HIDDEN
        needed = []
        for _ in range(reps):
            psi = rng.standard_normal((M, 1, r))
            q = rng.standard_normal((M, 1, N_HIDDEN)) + s * psi[..., :N_HIDDEN]
            score = stats_in_batches(q, psi, [M // FOLDS] * FOLDS)
            ft = score.fold_test
            hits += ft.p_value < ALPHA
            prop1 += prop1_improvable(score, M)
            lo, hi = ft.interval(ALPHA)
            covered += lo <= truth <= hi
            needed.append(satcore.required_probe_size(score.sigma_sq, math.sqrt(truth) / 2, ALPHA))
        rows[f"shift_{s}"] = {"V_pop": math.sqrt(truth), "n": M, "reps": reps, "fold_power": hits / reps,
                              "prop1_power": prop1 / reps, "interval_coverage": covered / reps,
                              "prop1_n_to_detect_median": int(np.median(needed))}
    return rows


def looks_sequence(rng, schedule, shift=0.0, batch=2, r=4):
    """One probe enlarged by ``schedule`` on ``q = noise + shift psi[:, :4]`` (``V_pop = 2 shift``), one
    candidate, ``batch`` samples a batch: ``(verdict, batches used, looks taken)``."""
    n = schedule.total * batch
    psi = rng.standard_normal((n, 1, r))
    q = rng.standard_normal((n, 1, N_HIDDEN)) + shift * psi[..., :N_HIDDEN]
    stats = satcore.CandidateStatistics(N_HIDDEN, r, 1, True)
    done = [0]

    def report_at(n_batches, alpha):
        for b in range(done[0], n_batches):  # batch b goes to fold b mod 16, as in a probe
            stats.update(q[b * batch : (b + 1) * batch], psi[b * batch : (b + 1) * batch])
        done[0] = n_batches
        return satcore.DepthStatistics({"z": stats}).report(alpha=alpha)

    report, used, looks = schedule.enlarge(report_at)
    return report.verdict.verdict, used, looks


def looks_table(reps, rng, initial=16, total=128, shifts=(0.0, 0.1, 0.2, 0.35)):
    """Probes enlarged until they decide (``look_schedule``: looks at 16, 32, 64, 128 batches of 2),
    with half of alpha at the whole probe (the default) and with alpha / 4 at every look, beside the first
    look alone and the whole probe at alpha, and under H0 beside the same looks each at alpha: rate of
    'improvable' and mean batches probed."""
    from dataclasses import replace

    from satcore._decisions.verdicts import look_schedule

    half = look_schedule(initial, total, ALPHA)
    modes = {"enlarged": half, "enlarged, alpha / L each": look_schedule(initial, total, ALPHA, final_share=None),
             "first look only": look_schedule(initial, initial, ALPHA), "whole probe": look_schedule(total, total, ALPHA)}
    rows = {}
    for shift in shifts:
        run = dict(modes)
        if shift == 0:
            run["enlarged, alpha at every look"] = replace(half, alpha_early=ALPHA, alpha_final=ALPHA)
        for mode, schedule in run.items():
            out = [looks_sequence(rng, schedule, shift) for _ in range(reps)]
            rows[f"V_pop_{2 * shift:g} {mode}"] = {
                "V_pop": 2 * shift, "mode": mode, "reps": reps, "looks_planned": schedule.looks,
                "alpha_early": schedule.alpha_early, "alpha_final": schedule.alpha_final,
                "improvable": float(np.mean([o[0] == "improvable" for o in out])),
                "mean_batches": float(np.mean([o[1] for o in out])), "mean_looks": float(np.mean([o[2] for o in out]))}
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 repetitions instead of 1000.")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--looks", action="store_true",
                        help="only the probes enlarged until they decide (section calibration_looks; 500 repetitions)")
    args = parser.parse_args()
    reps = args.reps or (100 if args.quick else 1000)
    rng = np.random.default_rng(2026)
    if args.looks:
        start = time.perf_counter()
        values = {"alpha": ALPHA, "batch": 2, "looks": looks_table(args.reps or 500, rng)}
        values["seconds"] = round(time.perf_counter() - start, 1)
        record("calibration_looks", values, path=RESULTS)
        for name, row in values["looks"].items():
            print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
        return
    start = time.perf_counter()
    values = {"alpha": ALPHA, "folds": FOLDS, "size": size_table(reps, rng), "power": power_table(reps // 2, rng)}
    values["seconds"] = round(time.perf_counter() - start, 1)
    record("calibration", values, path=RESULTS)
    for table in ("size", "power"):
        for name, row in values[table].items():
            print(table, name, {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})


if __name__ == "__main__":
    main()
