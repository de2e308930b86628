"""What a callback's ``dump_dir`` adds to an evaluation: writing its dump against probing it.

Usage: ``python -m bench.bench_callback_dump [--quick] [--threads N] [--repeats R]``.

For two models (the digits ResNet of the Lightning callback test, 2 batches of 8 images and 4 candidates, and
:mod:`_workloads`' GPT-2 of d = 256 and 8 blocks, 4 sequences of 128 tokens and 9 candidates) it times, on one thread
(``--threads``), CPU seconds (``time.process_time``), medians of rotating runs (:func:`_workloads.interleaved`):

* ``probe``: the callback's probe of its probe data (``probe(model, batches, loss_fn, config=...)``);
* ``dump``: what ``dump_dir`` adds to it, the callback's own writer (:func:`~satcore.adapters.torch.callback_common.
  dump_writer`): the model's fingerprint and the statistics written whole to a new file of the folder;
* ``fingerprint``: the fingerprint alone.

It prints the ratio ``dump / probe`` and the dump's size; nothing is recorded in ``results.json``.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time

from bench._workloads import WORKLOADS, interleaved, parse_bench_args


def measure(name: str, model, batches, loss_fn, config, repeats: int) -> dict:
    from satcore.adapters.callback_dumps import CallbackDumps
    from satcore.adapters.torch import probe
    from satcore.adapters.torch.callback_common import dump_writer
    from satcore.adapters.torch.checkpoint import model_fingerprint

    result = probe(model, batches, loss_fn, config=config)
    steps = itertools.count(1)
    with tempfile.TemporaryDirectory() as folder:
        dumps = CallbackDumps("HFCallback", folder)
        times = interleaved({
            "probe": lambda: probe(model, batches, loss_fn, config=config),
            "dump": lambda: dump_writer(dumps, model, config, step=next(steps))(result),
            "fingerprint": lambda: model_fingerprint(model),
        }, repeats, clock=time.process_time)
        size = os.path.getsize(dumps.written[0])
    row = {**times, "ratio": times["dump"] / times["probe"], "bytes": size}
    print(f"{name}: probe {times['probe'] * 1e3:.1f} ms, dump {times['dump'] * 1e3:.2f} ms "
          f"(fingerprint {times['fingerprint'] * 1e3:.2f} ms), dump/probe {row['ratio']:.3f}, {size / 1e6:.2f} MB")
    return row


def main() -> None:
    args = parse_bench_args(__doc__)
    repeats = args.repeats or (3 if args.quick else 9)
    from satcore.adapters.torch import ProbeConfig
    from zoo import models_torch as mt

    import torch

    torch.manual_seed(0)
    measure("digits ResNet (Lightning test)", mt.DigitsResNet(), mt.digits_batches(8, 2), mt.per_sample_ce,
            ProbeConfig(head=False, split="heldout"), repeats)
    make_model, make_batches, loss_fn = WORKLOADS["gpt2"]
    measure("GPT-2 d=256 x 8 blocks", make_model(), make_batches(4, 1), loss_fn, ProbeConfig(split="heldout"),
            repeats)


if __name__ == "__main__":
    main()
