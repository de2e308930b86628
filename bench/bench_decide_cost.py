"""The decision's own cost: ``decide`` with a 300-step recipe beside ``probe`` and the floor.

Usage: ``python -m bench.bench_decide_cost [--quick] [--threads N] [--repeats R]``.

On the probe benches' ResNet-8 (digits 32x32, :mod:`_workloads`), with the
training split ``train`` (``batches`` of 64 images) and a held-out split of
half as many, in the same process and rotating order (``repeats`` times):

* ``floor``: a plain forward + backward over ``train`` and ``heldout`` (what
  the probe of both splits cannot do with less);
* ``probe``: ``probe(model, train + heldout)`` over every residual block and
  the head (default options);
* ``train_block``: training one zero-output block (the first candidate's,
  inserted in a copy) with the recipe for all its ``recipe.steps`` steps,
  with no evaluation: what a user pays to try one insertion by hand;
* ``decide``: ``satcore.adapters.torch.decide(model, train, heldout,
  recipe=...)``: the probe of both splits, the screen, and the trials
  (``cost_block_steps`` optimizer steps of one block in all, with held-out
  and training evaluations at the trials' checkpoints).

Reported as ratios of medians: ``decide / floor``, ``decide / probe``,
``decide / train_block`` (below 1: the decision costs less than training one
block by hand), ``probe / floor``, with ``cost_block_steps`` and the seconds.
Writes section ``decide_cost`` and keys ``decide_cost_vs_floor``,
``decide_cost_vs_probe``, ``decide_cost_vs_train_block``, ``decide_cost_block_steps``.
"""

from __future__ import annotations

from bench._results import record
from bench._workloads import WORKLOADS, floor_pass, interleaved, parse_bench_args, probe_pass, versions

from satcore import Recipe
from satcore.adapters.torch import decide
from satcore.adapters.torch.decide import TorchTrials, trial_losses

SIZES = {"quick": {"batches": 4, "steps": 60}, "full": {"batches": 8, "steps": 300}}
BATCH = 64


def measure(size: str, repeats: int) -> dict:
    build, make_batches, loss_fn = WORKLOADS["resnet8"]
    model = build()
    n = SIZES[size]["batches"]
    train = make_batches(BATCH, n)
    heldout = make_batches(BATCH, max(1, n // 2), start=n * BATCH)
    both = train + heldout
    recipe = Recipe("adam", lr=1e-3, steps=SIZES[size]["steps"], batch_size=BATCH)
    first = probe_pass(model, train[:1], loss_fn)  # warm-up, and the candidate the by-hand training inserts
    at = next(iter(first.statistics))
    decisions = []
    runs = {
        "floor": lambda: floor_pass(model, both, loss_fn),
        "probe": lambda: probe_pass(model, both, loss_fn),
        "train_block": lambda: trial_losses(TorchTrials(model, first, recipe, train, {}, loss_fn, 0), at, (recipe.steps,)),
        "decide": lambda: decisions.append(decide(model, train, heldout, loss_fn, recipe=recipe)),
    }
    seconds = interleaved(runs, repeats)
    decision = decisions[-1]
    row = {
        "workload": "resnet8",
        "batch_size": BATCH,
        "train_batches": len(train),
        "heldout_batches": len(heldout),
        "recipe": {"optimizer": recipe.optimizer, "lr": recipe.lr, "steps": recipe.steps,
                   "batch_size": recipe.batch_size, "trainable": recipe.trainable},
        "candidates": len(first.statistics),
        "seconds": seconds,
        "cost_block_steps": decision.cost_block_steps,
        "choice": decision.choice,
        "stop_reason": decision.stop_reason,
        "ratio": {
            "decide_vs_floor": seconds["decide"] / seconds["floor"],
            "decide_vs_probe": seconds["decide"] / seconds["probe"],
            "decide_vs_train_block": seconds["decide"] / seconds["train_block"],
            "probe_vs_floor": seconds["probe"] / seconds["floor"],
            "train_block_vs_floor": seconds["train_block"] / seconds["floor"],
        },
    }
    print(f"resnet8, {len(train)}+{len(heldout)} batches of {BATCH}, recipe adam {recipe.steps} steps: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
          + f"; cost_block_steps {decision.cost_block_steps}, choice {decision.choice} ({decision.stop_reason})",
          flush=True)
    print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio"].items()), flush=True)
    return row


def main():
    args = parse_bench_args(__doc__)
    size = "quick" if args.quick else "full"
    repeats = args.repeats or 1  # a full run is minutes per contender on 2 shared cores
    row = measure(size, repeats)
    summary = {
        "decide_cost_vs_floor": row["ratio"]["decide_vs_floor"],
        "decide_cost_vs_probe": row["ratio"]["decide_vs_probe"],
        "decide_cost_vs_train_block": row["ratio"]["decide_vs_train_block"],
        "decide_cost_block_steps": row["cost_block_steps"],
    }
    record("decide_cost", {"quick": args.quick, "repeats": repeats, "versions": versions(), "resnet8": row},
           summary)


if __name__ == "__main__":
    main()
