"""Trained stagewise ResNets, cached on disk so the image scripts share them.

``settings(quick)`` fixes data sizes, widths, epochs and the depth list of a
mode; :func:`trained_resnet` trains ``StagewiseResNet(n_added)`` with a seed
(or loads it from ``examples/out/<mode>/checkpoints``) and returns it in eval
mode with its training time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch

from .data import load_images
from .models import StagewiseResNet
from .output import out_dir
from .training import train_classifier


@dataclass(frozen=True)
class ImageSettings:
    n_train: int
    n_probe: int
    n_test: int
    widths: tuple
    epochs: int
    depths: tuple  # values of N (added blocks)
    data_seed: int = 0


def settings(quick: bool) -> ImageSettings:
    if quick:
        return ImageSettings(n_train=512, n_probe=128, n_test=384, widths=(8, 16, 32), epochs=6, depths=(0, 1, 2))
    return ImageSettings(n_train=6000, n_probe=1000, n_test=3000, widths=(8, 16, 32), epochs=10,
                         depths=(0, 1, 2, 4, 7))


@lru_cache(maxsize=2)
def image_data(quick: bool):
    s = settings(quick)
    return load_images(s.n_train, s.n_probe, s.n_test, seed=s.data_seed)


def trained_resnet(quick: bool, n_added: int, seed: int = 1) -> tuple[StagewiseResNet, float]:
    """``(model, train_seconds)``; trains on the mode's train split or loads the cached weights."""
    s = settings(quick)
    cache = out_dir("checkpoints", quick)
    stem = cache / f"resnet_N{n_added}_seed{seed}"
    torch.manual_seed(seed)
    model = StagewiseResNet(n_added, s.widths)
    key = json.dumps(asdict(s), sort_keys=True)
    meta_path = stem.with_suffix(".json")
    if meta_path.exists() and stem.with_suffix(".pt").exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("settings") == key:
            model.load_state_dict(torch.load(stem.with_suffix(".pt"), weights_only=True))
            return model.eval(), meta["train_seconds"]
    data = image_data(quick)
    seconds = train_classifier(model, *data.train, epochs=s.epochs, seed=seed)
    torch.save(model.state_dict(), stem.with_suffix(".pt"))
    meta_path.write_text(json.dumps({"settings": key, "train_seconds": seconds}))
    return model.eval(), seconds
