"""Make the shipped example dump ``examples/digits_resnet.npz``.

A stagewise ResNet (the paper's ResNet-8 backbone, App. B.1, widths 8/16/32,
plus 3 cyclically added blocks) is trained on scikit-learn's digits (1,000
images, 8x8) and probed with ``satcore.adapters.torch.probe`` on the 797
held-out images in 16 batches of 50 (the ``conv`` family, with the per-sample
variance sums and one batch per fold of the per-candidate test), so
``satcore score examples/digits_resnet.npz`` tests every candidate.  Deterministic on CPU: rerun with ``python -m examples.make_example_dump``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits

from zoo.models import StagewiseResNet
from zoo.training import batches, per_sample_ce, train_classifier
from satcore.adapters.torch import probe

HERE = Path(__file__).resolve().parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(HERE / "digits_resnet.npz"))
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    torch.manual_seed(0)
    digits = load_digits()
    x = ((digits.images / 16.0 - 0.3) / 0.4).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    model = StagewiseResNet(n_added=3, widths=(8, 16, 32))
    seconds = train_classifier(model, x[:1000], y[:1000], epochs=args.epochs, seed=0, lr=0.05)
    # 50 images a batch: 16 batches, one per fold of the per-candidate test
    result = probe(model, batches(x[1000:], y[1000:], 50), per_sample_ce, family="conv", variance=True,
                   split="heldout", seed=0)
    result.meta.update(
        model="StagewiseResNet(n_added=3, widths=(8, 16, 32)) on sklearn digits",
        train_samples=1000,
        train_seconds=round(seconds, 1),
        script="examples/make_example_dump.py",
    )
    result.save(args.output)
    report = result.report()
    print(f"wrote {args.output}: {len(report.candidates)} candidates, growth_value_max "
          f"{report.growth_value_max:.3g} at {report.argmax}")


if __name__ == "__main__":
    main()
