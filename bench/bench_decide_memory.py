"""The decision's memory with and without a statistics budget (CPU).

Usage: ``python -m bench.bench_decide_memory [--quick] [--threads N]``.

``decide(..., policy=DecisionPolicy(recipe, probe=ProbeConfig(family="native")))`` on a GPT-2 from a config (d 256 x 8 blocks,
T 128; 9 places of ``r = 5 d`` native features) over 8 training and 8
held-out batches of 4 windows, AdamW at LLaMA-Pro's lr, twice: all places in
one probe pass, and with ``max_statistics_bytes`` set to two places' two
splits (the places then go through in groups of two).  Measured side by side
in one process: the resident high-water increase of each call
(:func:`_workloads.peak_rss_increase`), its CPU seconds and the samples it
ran through the model with gradients (the probe passes and the trials), with
the planned sums of both splits beside them, and whether the two decisions
are equal.  Writes ``decide_memory_budget_peak_ratio`` (the budgeted peak over
the one-pass peak) and ``sections.decide_memory``.
"""

from __future__ import annotations

import time

import torch
from bench._results import record
from bench._workloads import gpt2_batches, gpt2_model, parse_bench_args, peak_rss_increase, versions

from satcore import DecisionPolicy, Recipe
from satcore.adapters.torch import ProbeConfig, decide, plan, sequence_loss


def main():
    args = parse_bench_args(__doc__)
    n_batches, batch_size = (2, 2) if args.quick else (8, 4)
    model = gpt2_model()
    train = gpt2_batches(batch_size, n_batches, 0)
    heldout = gpt2_batches(batch_size, n_batches, 10_000)
    recipe = Recipe("adamw", lr=2e-4, steps=8, batch_size=batch_size, trainable="block")
    memory = plan(model, train[0], sequence_loss, family="native")
    per_place = max(c.sums_bytes for c in memory.candidates)
    budget = 2 * 2 * per_place
    groups = memory.passes(budget, splits=2)
    samples = {"grad": 0}

    embedding = model.get_input_embeddings()

    def count(module, inputs):  # the model's token embedding or a trial copy's (copies keep no hooks)
        if isinstance(module, torch.nn.Embedding) and module.weight.shape == embedding.weight.shape:
            samples["grad"] += len(inputs[0]) if torch.is_grad_enabled() else 0

    def run(max_statistics_bytes=None):
        policy = DecisionPolicy(recipe, max_statistics_bytes=max_statistics_bytes, probe=ProbeConfig(family="native"))
        return decide(model, train, heldout, sequence_loss, policy=policy)

    run(max_statistics_bytes=budget)  # warm-up: the kernels and the allocator's first pages
    rows = {}
    for label, options in (("one_pass", {}), ("budget", {"max_statistics_bytes": budget})):
        samples["grad"] = 0
        handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
        out = {}
        start = time.process_time()
        try:
            peak = peak_rss_increase(lambda: out.setdefault("decision", run(**options)))  # noqa: B023
        finally:
            handle.remove()
        rows[label] = {"peak_rss_increase_bytes": peak, "cpu_seconds": time.process_time() - start,
                       "grad_samples": samples["grad"], "decision": out["decision"].to_dict()}
        print(f"{label}: peak +{peak / 2**20:.0f} MiB, {rows[label]['cpu_seconds']:.1f} CPU s, "
              f"{samples['grad']} samples with gradients")
    same = rows["one_pass"]["decision"] == rows["budget"]["decision"]
    ratio = rows["budget"]["peak_rss_increase_bytes"] / rows["one_pass"]["peak_rss_increase_bytes"]
    print(f"budget {budget / 2**20:.0f} MiB ({len(groups)} passes): peak ratio {ratio:.3f}, same decision: {same}")
    record("decide_memory", {
        "model": "GPT-2 from a config, d 256 x 8 blocks, T 128", "places": len(memory.candidates),
        "batches_per_split": n_batches, "batch_size": batch_size, "recipe": recipe.to_dict(),
        "planned_sums_bytes_both_splits": 2 * sum(c.sums_bytes for c in memory.candidates),
        "budget_bytes": budget, "passes": [list(g) for g in groups], "same_decision": same,
        "runs": {k: {n: v for n, v in r.items() if n != "decision"} for k, r in rows.items()},
        "versions": versions()},
        {"decide_memory_budget_peak_ratio": ratio})


if __name__ == "__main__":
    main()
