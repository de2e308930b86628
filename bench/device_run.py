"""Everything a lent GPU should measure, in one run sized to finish in under 8 minutes (setup included).

Usage (on the device, from the repository root; ``bench/device_run.sh`` wraps it)::

    python -m bench.device_run --out $OUT/device_run.json
    python -m bench.device_run --dry-run --out /tmp/device_run.json    # tiny sizes, on the CPU

Three parts, each a ratio or a count measured side by side in this one process:

1. ``probe_cost``: the probe benches' GPT-2 (decoder, ``mlp`` route) and
   ResNet-8 (``conv`` route) at GPU-sized batches against a plain forward +
   backward (the floor), interleaved: ``default`` (per-batch sums in
   float64), ``float32`` (per-batch products in float32, totals float64) and
   ``float32_tf32`` (the same with TF32 matrix products, against a floor with
   TF32 on too), with each option's largest relative error against the
   float64 sums and whether the verdicts (``report()``) stay the same.
2. ``decoder_1b``: a Llama-style decoder from a config (d 2048, 22 layers,
   32 heads, 4 key-value heads: TinyLlama-1.1B's shape, random bf16 weights)
   probed at every block: ``plan()`` against the measured peak above the
   floor's (within 10% is the goal), tokens per second of the probe and of
   the floor, and the projected time of a full depth report on 10^6 tokens
   (fixed cost + per-batch cost x batches + scoring).  ``n_features`` is
   ``--llama-features`` (default d = 2048: the default 4d = 8192 makes the
   scoring's ``r x r`` eigendecompositions on the host, 23 of them, alone
   longer than the device budget).
3. ``decide_1b``: ``decide`` on the same model with a ``--recipe-steps``
   Adam recipe: seconds, ``cost_block_steps``, and seconds per block-step.

Each part is skipped (and says so) when the time already spent passes
``--budget-s`` less what the part needs (estimated from the parts before).
Writes one JSON file (``--out``) with the device, versions and every
figure; ``bench/results.json`` is left alone (the file comes back through
the device tool, and a session merges it with ``--merge FILE``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench._results import record
from bench._workloads import WORKLOADS, floor_pass, interleaved, versions

from satcore import DecisionPolicy, Recipe
from satcore.adapters.torch import ProbeConfig, decide, plan, probe, sequence_loss
from satcore.adapters.torch.probe import to_device

SIZES = {
    "device": {"probe": {"gpt2": (64, 16), "resnet8": (512, 16)}, "repeats": 5,
               "llama": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                             num_key_value_heads=4, vocab_size=32000),
               "tokens": (8, 512), "llama_batches": 4, "decide_batches": (8, 4)},
    "dry": {"probe": {"gpt2": (1, 2), "resnet8": (2, 2)}, "repeats": 1,
            "llama": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=256),
            "tokens": (2, 16), "llama_batches": 2, "decide_batches": (4, 2)},
}
FIELDS = ("sum_cross", "sum_gram", "sum_xi_sq", "sum_q_sq")


class TF32:
    """TF32 matrix products and convolutions on (``on``) or off inside the block, restored after."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.on

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def synced(fn, device, tf32=None):
    def run():
        if tf32 is None:
            out = fn()
        else:
            with TF32(tf32):
                out = fn()
        synchronize(device)
        return out

    return run


def verdicts(result) -> dict:
    report = result.report()
    return {"depth": str(report.verdict.verdict) if report.verdict else None, "best": report.best_candidate,
            **{t.name: str(t.verdict) for t in report.tests}}


def max_rel_error(fast, exact) -> dict:
    """Largest relative (Frobenius) error of each field over the candidates."""
    return {field: max(float(np.linalg.norm(np.subtract(getattr(fast[n], field), getattr(exact[n], field)))
                             / np.linalg.norm(getattr(exact[n], field))) for n in exact) for field in FIELDS}


OPTIONS = {"default": ({}, None), "float32": ({"batch_dtype": torch.float32}, False),
           "float32_tf32": ({"batch_dtype": torch.float32}, True)}


def probe_cost(device, sizes, repeats) -> dict:
    return {workload: probe_cost_row(device, workload, batch_size, n_batches, repeats)
            for workload, (batch_size, n_batches) in sizes.items()}


def probe_cost_row(device, workload, batch_size, n_batches, repeats) -> dict:
    build, make_batches, loss_fn = WORKLOADS[workload]
    model = build().to(device)
    batches = to_device(make_batches(batch_size, n_batches), device)
    runs = {"floor": synced(lambda: floor_pass(model, batches, loss_fn), device),
            "floor_tf32": synced(lambda: floor_pass(model, batches, loss_fn), device, True)}
    for option, (kwargs, tf32) in OPTIONS.items():
        runs[option] = synced(lambda kwargs=kwargs: probe(model, batches, loss_fn, **kwargs), device, tf32)
    results = {name: fn() for name, fn in runs.items()}  # warm-up (autotuning, handles), and the sums
    seconds = interleaved(runs, repeats)
    exact = results["default"]
    row = {"batch_size": batch_size, "batches": n_batches, "seconds": seconds,
           "ratio": {option: seconds[option] / seconds["floor_tf32" if tf32 else "floor"]
                     for option, (_, tf32) in OPTIONS.items()},
           "max_rel_error": {o: max_rel_error(results[o].statistics, exact.statistics) for o in OPTIONS},
           "verdicts": {o: verdicts(results[o]) for o in OPTIONS}}
    row["verdicts_unchanged"] = {o: row["verdicts"][o] == row["verdicts"]["default"] for o in OPTIONS}
    print(f"{workload} {batch_size}x{n_batches}: floor {seconds['floor'] * 1e3:.1f} ms; "
          + ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio"].items())
          + "; max rel error " + ", ".join(f"{o} {max(e.values()):.1e}" for o, e in row["max_rel_error"].items())
          + f"; verdicts unchanged {row['verdicts_unchanged']}", flush=True)
    return row


def llama(device, config_overrides, dtype=torch.bfloat16):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(max_position_embeddings=4096, use_cache=False, bos_token_id=0, eos_token_id=0,
                         attn_implementation="sdpa", **config_overrides)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval(), config


def token_batches(config, batch_size, seq_len, n_batches, seed, device):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=g)
        out.append(to_device(({"input_ids": ids}, ids), device))
    return out


def peak_rise(fn, device) -> int:
    """Rise of the device's allocated peak during ``fn`` (0 on the CPU: the dry run does not measure it)."""
    if device.type != "cuda":
        fn()
        return 0
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def decoder_1b(device, size, n_features) -> tuple:
    model, config = llama(device, size["llama"])
    batch_size, seq_len = size["tokens"]
    n = size["llama_batches"]
    batches = token_batches(config, batch_size, seq_len, n, 0, device)
    options = {"n_features": n_features or config.hidden_size}
    planned = plan(model, batches[0], sequence_loss, **options)
    floor = synced(lambda: floor_pass(model, batches, sequence_loss), device)
    one = synced(lambda: probe(model, batches[:1], sequence_loss, **options), device)
    every = synced(lambda: probe(model, batches, sequence_loss, **options), device)
    floor(), one()  # warm-up
    floor_peak = peak_rise(lambda: floor_pass(model, batches[:1], sequence_loss), device)
    probe_peak = peak_rise(one, device)
    seconds = interleaved({"floor": floor, "probe_1": one, "probe_n": every}, 2)
    start = time.perf_counter()
    result = every()
    report = result.report()
    score_seconds = time.perf_counter() - start - seconds["probe_n"]
    tokens = batch_size * seq_len
    per_batch = (seconds["probe_n"] - seconds["probe_1"]) / (n - 1)
    fixed = seconds["probe_1"] - per_batch
    batches_1e6 = 1e6 / tokens
    row = {
        "config": {**size["llama"], "dtype": "bfloat16"},
        "parameters": sum(p.numel() for p in model.parameters()),
        "candidates": len(planned.candidates),
        "n_features": planned.candidates[0].n_features,
        "tokens_per_batch": tokens,
        "batches": n,
        "seconds": seconds,
        "probe_tokens_per_s": n * tokens / seconds["probe_n"],
        "floor_tokens_per_s": n * tokens / seconds["floor"],
        "probe_vs_floor": seconds["probe_n"] / seconds["floor"],
        "plan_peak_bytes": planned.peak_bytes,
        "measured_peak_above_floor_bytes": probe_peak - floor_peak,
        "measured_over_planned": (probe_peak - floor_peak) / planned.peak_bytes if probe_peak else None,
        "score_seconds": score_seconds,
        "projected_report_seconds_1e6_tokens": fixed + per_batch * batches_1e6 + score_seconds,
        "verdict": str(report.verdict.verdict) if report.verdict else None,
    }
    print(f"llama {row['parameters'] / 1e9:.2f}B, {row['candidates']} candidates, r {row['n_features']}: probe "
          f"{row['probe_tokens_per_s']:.0f} tokens/s ({row['probe_vs_floor']:.2f}x the floor's time), plan "
          f"{planned.peak_bytes / 2**30:.2f} GiB, measured {(probe_peak - floor_peak) / 2**30:.2f} GiB above the "
          f"floor; scoring {score_seconds:.1f} s; 10^6 tokens projected "
          f"{row['projected_report_seconds_1e6_tokens']:.0f} s", flush=True)
    return row, model, config


def decide_1b(device, size, model, config, n_features, steps) -> dict:
    batch_size, seq_len = size["tokens"]
    n_train, n_held = size["decide_batches"]
    train = token_batches(config, batch_size, seq_len, n_train, 1, device)
    heldout = token_batches(config, batch_size, seq_len, n_held, 2, device)
    recipe = Recipe("adam", lr=1e-4, steps=steps, batch_size=batch_size)
    start = time.perf_counter()
    decision = decide(model, train, heldout, sequence_loss, policy=DecisionPolicy(recipe, probe=ProbeConfig(n_features=n_features or config.hidden_size)))
    synchronize(device)
    seconds = time.perf_counter() - start
    row = {"seconds": seconds, "recipe_steps": steps, "cost_block_steps": decision.cost_block_steps,
           "seconds_per_block_step": seconds / max(1, decision.cost_block_steps), "train_batches": n_train,
           "heldout_batches": n_held, "choice": decision.choice, "stop_reason": decision.stop_reason}
    print(f"decide on the llama: {seconds:.1f} s, cost_block_steps {decision.cost_block_steps}, choice "
          f"{decision.choice} ({decision.stop_reason})", flush=True)
    return row


def device_info(device) -> dict:
    if device.type != "cuda":
        return {"name": "cpu (dry run)"}
    return {"name": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "cuda": torch.version.cuda, "memory_bytes": torch.cuda.get_device_properties(0).total_memory,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}


def merge(path: Path) -> None:
    """Record a device run's file in ``bench/results.json`` (section ``device_run``) with its summary keys."""
    data = json.loads(path.read_text())
    summary = {f"probe_overhead_{option}_{workload}_device_run": ratio
               for workload, row in data["probe_cost"].items() for option, ratio in row["ratio"].items()}
    if "decoder_1b" in data:
        summary["decoder_1b_projected_report_seconds_1e6_tokens"] = data["decoder_1b"][
            "projected_report_seconds_1e6_tokens"]
        summary["decoder_1b_measured_over_planned"] = data["decoder_1b"]["measured_over_planned"]
    if "decide_1b" in data:
        summary["decide_1b_seconds"] = data["decide_1b"]["seconds"]
    record("device_run", data, summary)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, on the CPU; nothing is timed seriously")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file to write")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds this script may take (default 400; no limit with --dry-run)")
    parser.add_argument("--llama-features", type=int, default=None, help="n_features of the 1B probe (default d)")
    parser.add_argument("--recipe-steps", type=int, default=None, help="decide's recipe steps (default 300)")
    parser.add_argument("--merge", type=Path, default=None, help="record a device run's file in results.json")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge)
        return
    start = time.perf_counter()
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        sys.exit("device_run: no CUDA device (use --dry-run on a CPU)")
    device = torch.device("cpu" if dry else "cuda")
    size = SIZES["dry" if dry else "device"]
    steps = args.recipe_steps or (4 if dry else 300)
    budget = args.budget_s or (float("inf") if dry else 400.0)
    out = {"dry_run": dry, "device": device_info(device), "versions": versions(), "skipped": []}

    def spent():
        return time.perf_counter() - start

    def save():
        out["seconds"] = spent()
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=2, sort_keys=True, default=str) + "\n")

    out["probe_cost"] = probe_cost(device, size["probe"], size["repeats"])
    save()
    part = spent()
    if spent() + 2 * part < budget:  # the 1B model costs about what the probe benches did, twice over
        out["decoder_1b"], model, config = decoder_1b(device, size, args.llama_features)
        save()
        if spent() + out["decoder_1b"]["seconds"]["probe_n"] * 4 + steps * 0.1 < budget:
            out["decide_1b"] = decide_1b(device, size, model, config, args.llama_features, steps)
        else:
            out["skipped"].append("decide_1b")
    else:
        out["skipped"] += ["decoder_1b", "decide_1b"]
    save()
    print(f"device_run: {spent():.0f} s; skipped: {out['skipped'] or 'nothing'}", flush=True)


if __name__ == "__main__":
    main()
