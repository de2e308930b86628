"""Function-preserving growth vs training from scratch (paper Table 1).

For a reference depth N: train ``StagewiseResNet(N)`` (the sweep's recipe),
insert ONE zero-output BasicBlock where the cyclic rule puts block N+1
(``bn2`` gain and bias zero: the grown network computes exactly the reference
function, checked below) and train the grown network with the same recipe;
against it, ``StagewiseResNet(N + 1)`` trained from random initialisation
with the same recipe.  Several seeds; mean and sample standard deviation.
Like the paper, this compares solution quality, not compute (Growth inherits
the reference's training).

    python -m examples.growth_vs_scratch [--quick]
"""

from __future__ import annotations

import time

import numpy as np
import torch

from zoo.command import quick_main
from zoo.models import grow_zero_block
from zoo.output import figure, results_dir, save_figure, write_results
from zoo.resnets import image_data, settings, trained_resnet
from zoo.training import classifier_loss, train_classifier

COLUMNS = [
    ("model", "final model"), ("seeds", "seeds"),
    ("scratch_train", "train: scratch"), ("growth_train", "train: growth"),
    ("scratch_test", "test: scratch"), ("growth_test", "test: growth"),
    ("growth_wins_test", "growth lower test (seeds)"), ("max_preserve_err", "max |f_grown - f_ref| at insertion"),
]


def config(quick: bool):
    return ((0,), (1, 2)) if quick else ((0, 1), (1, 2, 3))


def run(quick: bool) -> dict:
    torch.set_num_threads(1)  # one thread: on a shared 2-core machine two threads ran 10x slower
    s = settings(quick)
    data = image_data(quick)
    references, seeds = config(quick)
    rows, runs, start = [], [], time.time()
    for n_ref in references:
        per_seed = []
        for seed in seeds:
            reference, _ = trained_resnet(quick, n_ref, seed=seed)
            grown = grow_zero_block(reference).eval()
            with torch.no_grad():
                x = torch.as_tensor(data.test[0][:256])
                preserve = float((grown(x) - reference(x)).abs().max())
            train_classifier(grown, *data.train, epochs=s.epochs, seed=seed)
            scratch, _ = trained_resnet(quick, n_ref + 1, seed=seed)
            result = {"seed": seed, "preserve_err": preserve}
            for name, model in (("growth", grown), ("scratch", scratch)):
                result[f"{name}_train"], _ = classifier_loss(model, *data.train)
                result[f"{name}_test"], result[f"{name}_acc"] = classifier_loss(model, *data.test)
            per_seed.append(result)
            print(f"N={n_ref}->{n_ref + 1} seed {seed}: " + ", ".join(f"{k} {v:.4g}" for k, v in result.items()
                                                                         if k != "seed") + f" ({time.time() - start:.0f}s)")
        row = {"model": f"{3 + n_ref + 1} blocks (grown from {3 + n_ref})", "seeds": len(seeds),
               "max_preserve_err": max(r["preserve_err"] for r in per_seed),
               "growth_wins_test": f"{sum(r['growth_test'] < r['scratch_test'] for r in per_seed)}/{len(seeds)}"}
        for key in ("scratch_train", "growth_train", "scratch_test", "growth_test", "scratch_acc", "growth_acc"):
            values = np.array([r[key] for r in per_seed])
            row[key] = f"{values.mean():.4f} +- {values.std(ddof=1):.4f}" if len(values) > 1 else f"{values[0]:.4f}"
            row[key + "_mean"], row[key + "_values"] = float(values.mean()), values.tolist()
        rows.append(row)
        runs.append({"reference": n_ref, "runs": per_seed})
    results = results_dir(quick)
    notes = [f"mean +- sample sd over seeds {list(seeds)}; loss = mean per-sample cross-entropy, eval mode, "
             f"{len(data.train[1])} training and {len(data.test[1])} test images; recipe: SGD momentum 0.9, lr 0.1 "
             f"cosine over {s.epochs} epochs, weight decay 5e-4, batch 128 (both arms)."]
    meta = {"data": data.source, "settings": s.__dict__, "runs": runs, "seconds": time.time() - start}
    write_results(results, "growth_vs_scratch", rows, COLUMNS, meta=meta, notes=notes)
    plot(rows, results / "growth_vs_scratch.png")
    return {"rows": rows}


def plot(rows, path):
    fig, axes = figure(2)
    for ax, split in zip(axes, ("train", "test")):
        for i, row in enumerate(rows):
            for j, arm in enumerate(("scratch", "growth")):
                values = row[f"{arm}_{split}_values"]
                ax.plot([i + 0.15 * (2 * j - 1)] * len(values), values, "os"[j], color=f"C{j}",
                        label=arm if i == 0 else None, alpha=0.8)
        ax.set_xticks(range(len(rows)), [r["model"].split(" (")[0] for r in rows])
        ax.set_xlabel("final architecture")
        ax.set_ylabel(f"{split} loss (nats)")
        ax.set_title(f"{split} loss after training, one point per seed")
        ax.legend()
    save_figure(fig, path)


def main():
    quick_main(__doc__, run, "one tiny configuration, two seeds (smoke test)")


if __name__ == "__main__":
    main()
