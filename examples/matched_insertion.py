"""Gradient-matched insertion on the trained ResNets (paper Appendix H, Table 7).

For each trained stagewise ResNet of the image sweep (trained here if the
sweep has not cached it), in float64 so tiny loss changes are measurable:

1. Probe a TRAINING sample S (the fitting set) at every candidate; pick the
   candidate with the largest growth value (fixed without held-out data).
2. ``satcore.adapters.torch.grow`` inserts ``h = V psi`` with
   ``V = -alpha C K^+`` (the least-squares fit of ``-alpha q``, App. H) for a
   range of relative update sizes ``rho`` (``alpha = rho ||z||_S / V``) and
   the paper's absolute ``alpha = 1e-3``; we measure the change of the mean
   training loss on S and compare it with the first-order prediction
   ``-alpha V^2`` (docs/core.md, Gradient-matched insertion).
3. Test loss: the measured change vs the first-order prediction
   ``-alpha tr(C_test K^+ C_S^T)``.
4. Held-out alignment (docs/core.md, Train/held-out alignment): fit the block instead on the
   held-out probe split P (independent of training, like the test set), and
   predict the test change BEFORE looking at the test set from the U-statistic
   moments of the per-sample gradients on P (in the ``K^+`` metric of the
   fitted block): ``E = -alpha ||mu||^2``, ``sd = alpha sqrt(Var<g_P, g_test>)``
   and Cantelli's bound on ``P(<g_P, g_test> <= 0)``, the chance that the block
   does not lower the test loss to first order.

    python -m examples.matched_insertion [--quick]
"""

from __future__ import annotations

import copy
import math
import time

import torch

from zoo.command import quick_main
from zoo.output import figure, results_dir, save_figure, write_results
from zoo.persample import per_sample_xi, whitened_kernel
from zoo.resnets import image_data, settings, trained_resnet
from zoo.training import batches, classifier_loss, per_sample_ce
from satcore import estimate_alignment, plan_insertion
from satcore.adapters.torch import grow, probe

PAPER_ALPHA = 1e-3
MAIN_RHO = 1e-3  # the relative update size of the table's main row

COLUMNS = [
    ("blocks", "blocks"), ("at", "inserted at"), ("train_before", "train loss (S)"),
    ("d_train", "dTrain measured"), ("d_train_pred", "dTrain predicted"), ("rel_err", "rel. err"),
    ("rel_err_smallest", "rel. err, smallest alpha"), ("test_before", "test loss"),
    ("d_test", "dTest measured"), ("d_test_pred", "dTest predicted (C_test)"),
    ("paper_alpha_d_train", "dTrain @ alpha=1e-3"), ("paper_alpha_d_test", "dTest @ alpha=1e-3"),
]
HELDOUT_COLUMNS = [
    ("blocks", "blocks"), ("at", "inserted at"), ("d_test_heldout", "dTest measured"),
    ("d_test_heldout_first_order", "first-order <g_P, g_test>"),
    ("d_test_align_mean", "predicted mean (alignment)"), ("d_test_align_sd", "predicted sd"),
    ("cantelli_bound", "P(no decrease) <="), ("effective_dimension", "d_eff"),
]


def rhos(quick: bool):
    return (1e-4, 1e-3, 1e-2) if quick else (1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def run(quick: bool) -> dict:
    torch.set_num_threads(1)  # one thread: on a shared 2-core machine two threads ran 10x slower
    s = settings(quick)
    data = image_data(quick)
    n_fit = 256 if quick else 2000
    double = lambda x, y: batches(torch.as_tensor(x).double(), y, 128)  # noqa: E731
    fit_data = double(data.train[0][:n_fit], data.train[1][:n_fit])
    test_data, heldout_data = double(*data.test), double(*data.probe)
    fit_x, fit_y = torch.as_tensor(data.train[0][:n_fit]).double(), torch.as_tensor(data.train[1][:n_fit])
    test_x, test_y = torch.as_tensor(data.test[0]).double(), torch.as_tensor(data.test[1])
    rows, curves, start = [], {}, time.time()
    depths = s.depths if quick else tuple(d for d in s.depths if d in (0, 2, 4, 7)) or s.depths
    for n_added in depths:
        model = copy.deepcopy(trained_resnet(quick, n_added)[0]).double().eval()
        fit = probe(model, fit_data, per_sample_ce, split="train")
        test = probe(model, test_data, per_sample_ce, split="test")
        held = probe(model, heldout_data, per_sample_ce, split="heldout")
        at = fit.report().argmax
        train0, test0 = classifier_loss(model, fit_x, fit_y)[0], classifier_loss(model, test_x, test_y)[0]
        row = {"N": n_added, "blocks": model.n_blocks, "at": at, "train_before": train0, "test_before": test0,
               "growth_value": fit.report()[at].growth_value, "n_fit": n_fit}
        curve = []
        for rho in rhos(quick):
            grown = grow(model, fit, at, rho=rho)
            d_train = classifier_loss(grown.model, fit_x, fit_y)[0] - train0
            d_test = classifier_loss(grown.model, test_x, test_y)[0] - test0
            plan = plan_insertion(fit.statistics[at], grown.alpha, test.statistics[at])
            curve.append({"rho": rho, "alpha": grown.alpha, "d_train": d_train, "d_train_pred": grown.predicted_change,
                          "rel_err": abs(d_train - grown.predicted_change) / abs(grown.predicted_change),
                          "d_test": d_test, "d_test_pred": plan.predicted_change_eval})
        main = next(c for c in curve if c["rho"] == MAIN_RHO)
        row.update({k: main[k] for k in ("alpha", "d_train", "d_train_pred", "rel_err", "d_test", "d_test_pred")})
        row["rel_err_smallest"] = curve[0]["rel_err"]
        row["within_5pct_smallest"] = curve[0]["rel_err"] <= 0.05
        paper = grow(model, fit, at, alpha=PAPER_ALPHA)
        row["paper_alpha_d_train"] = classifier_loss(paper.model, fit_x, fit_y)[0] - train0
        row["paper_alpha_d_train_pred"] = paper.predicted_change
        row["paper_alpha_d_test"] = classifier_loss(paper.model, test_x, test_y)[0] - test0
        row.update(heldout_alignment(model, held, test, at, heldout_data, test_x, test_y, test0))
        rows.append(row)
        curves[model.n_blocks] = curve
        print(f"N={n_added} at {at}: dTrain {row['d_train']:.3e} vs {row['d_train_pred']:.3e} "
              f"(rel err {row['rel_err']:.2e}; smallest alpha {row['rel_err_smallest']:.2e}) ({time.time() - start:.0f}s)")
    results = results_dir(quick)
    meta = {"data": data.source, "settings": s.__dict__, "rhos": rhos(quick), "main_rho": MAIN_RHO, "curves": curves,
            "seconds": time.time() - start}
    notes = [
        f"d = loss after - loss before (negative: the insertion lowered the loss); mean per-sample cross-entropy "
        f"in float64, eval mode. S = {n_fit} training images (the fitting set), test = {len(test_y)} test images.",
        f"main row: relative update rho = {MAIN_RHO} (alpha = rho ||z||_S / V); 'smallest alpha' is rho = "
        f"{rhos(quick)[0]}; the paper's absolute alpha = {PAPER_ALPHA} in the last two columns.",
        "every model within 5% at the smallest alpha: " + ("yes" if all(r["within_5pct_smallest"] for r in rows) else "NO"),
    ]
    write_results(results, "matched_insertion", rows, COLUMNS, meta=meta, notes=notes)
    write_results(results, "matched_insertion_heldout", rows, HELDOUT_COLUMNS, meta=meta, notes=[
        f"block fitted on the held-out probe split P ({len(data.probe[1])} images) at rho = {MAIN_RHO}; "
        "prediction from P alone (U-statistics of the per-sample kernel in the K_P^+ metric, docs/core.md, Train/held-out alignment); "
        "d_eff = tr(Sigma)^2 / tr(Sigma^2).",
    ])
    plot(rows, curves, results / "matched_insertion.png")
    return {"rows": rows, "curves": curves}


def heldout_alignment(model, held, test, at, heldout_data, test_x, test_y, test0) -> dict:
    """Fit on P, predict the test change from P's alignment moments, then measure it."""
    grown = grow(model, held, at, rho=MAIN_RHO)
    measured = classifier_loss(grown.model, test_x, test_y)[0] - test0
    first_order = plan_insertion(held.statistics[at], grown.alpha, test.statistics[at]).predicted_change_eval
    candidate = next(c for c in held.candidates if c.name == at)
    X = per_sample_xi(model, heldout_data, per_sample_ce, candidate, held.families[at])
    estimate = estimate_alignment(whitened_kernel(X, held.statistics[at].feature_gram()))
    mean, var, bound = estimate.predicted(len(X), len(test_y))
    return {"d_test_heldout": measured, "d_test_heldout_first_order": first_order,
            "d_test_align_mean": -grown.alpha * mean, "d_test_align_sd": grown.alpha * math.sqrt(var),
            "cantelli_bound": bound, "effective_dimension": estimate.effective_dimension, "alpha_heldout": grown.alpha}


def plot(rows, curves, path):
    fig, (ax1, ax2) = figure(2)
    for blocks, curve in curves.items():
        ax1.loglog([c["alpha"] for c in curve], [max(c["rel_err"], 1e-16) for c in curve], "o-", label=f"{blocks} blocks")
    ax1.axhline(0.05, color="grey", ls=":", label="5%")
    ax1.set_xlabel("alpha (step of the matched block)")
    ax1.set_ylabel("|measured - predicted| / |predicted|  (train)")
    ax1.set_title("first-order prediction error vs alpha")
    ax1.legend(fontsize=7)
    pred = [r["d_test_align_mean"] for r in rows]
    ax2.errorbar([r["blocks"] for r in rows], pred, yerr=[r["d_test_align_sd"] for r in rows], fmt="s",
                 capsize=3, label="predicted from P (mean +- sd)")
    ax2.plot([r["blocks"] for r in rows], [r["d_test_heldout"] for r in rows], "o", label="measured")
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.set_xlabel("residual blocks of the reference model")
    ax2.set_ylabel("test-loss change (nats)")
    ax2.set_title(f"held-out fitted block, rho = {MAIN_RHO}")
    ax2.legend(fontsize=7)
    save_figure(fig, path)


def main():
    quick_main(__doc__, run, "the quick image models (smoke test)")


if __name__ == "__main__":
    main()
