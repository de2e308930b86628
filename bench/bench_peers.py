"""Peers: BackPACK and GroMo against satcore on the same GPT-2 blocks and batches.

Usage: ``python bench/bench_peers.py [--quick] [--threads N] [--repeats R]``.

The peers get what a user of each would build: at the input of every block
``transformer.h.i`` a zero-output branch ``z -> z + V psi(z)`` is inserted
with a forward pre-hook, ``psi`` being satcore's own ``mlp`` feature map (the
same seeded weights, ``r = 4d``; computed without a graph, as the peers only
need ``V``'s gradient) and ``V`` a zero ``Linear(r, d, bias=False)``:

* BackPACK (``backpack.extend(V)``): ``SumGradSquared`` gives
  ``sum_i ||xi_i||^2`` and ``V.grad`` gives ``sum_i X_i = n C`` (the
  default-probe quantities C and sigma^2, Prop. 1); ``BatchGrad`` gives every
  ``X_i``, hence ``sum_i X_i^T X_i`` (the ``variance=True`` quantity).
* GroMo (``LinearGrowingModule`` as ``V``): its ``TensorStatistic`` objects
  ``tensor_s`` (= K) and ``tensor_m`` (= C^T), and its
  ``compute_optimal_delta`` first-order decrease ``tr(M^T S^+ M)`` (=
  ``growth_value^2``, Lemma 4).

The model's own parameters are frozen for the peers (their backward then
only reaches ``V``, the cheapest a peer can do); satcore's probe computes
gradients to its taps only anyway.  First the numbers are checked where the
quantities coincide (relative differences are printed and stored), then time
(interleaved medians) and resident peak memory are compared:

=========================  =====================================================
``satcore``                default probe: C, K, sum ||xi||^2 (per-batch float64)
``satcore_float32``        the same with ``batch_dtype=torch.float32``
``satcore_variance``       ``variance=True`` (adds sum X^T X)
``satcore_scored``         default probe + ``report()`` (growth values)
``backpack_sumgradsquared`` C and sum ||xi||^2 (no K: no growth value)
``backpack_batchgrad``     every X_i, summed into sum X^T X
``gromo``                  K and C (no variance)
``gromo_scored``           + ``compute_optimal_delta()`` (its defaults)
=========================  =====================================================

BackPACK computes less than satcore's default (no ``r x r`` Gram), GroMo
computes K and C in float32: the ``*_float32`` ratios are the like-for-like
arithmetic.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import warnings

import numpy as np
import torch
from torch import nn

from _results import record
from _workloads import gpt2_batches, gpt2_model, interleaved, peak_rss_increase, set_threads, versions
from satcore.adapters.torch import build_feature_map, probe, sequence_loss
from satcore.adapters.torch.capture import get_stream, with_stream
from satcore.adapters.torch.probe import call_model, model_init_std
from satcore.certification import variance_estimate

SIZES = {  # (blocks, batch size, batches); M*T must exceed r = 1024 for a full-rank K
    "quick": (2, 4, 3),
    "full": (8, 4, 4),
}


def rel(a, b) -> float:
    """``||a - b|| / ||b||`` (Frobenius)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@contextlib.contextmanager
def inserted_branches(model, terminals: dict):
    """Forward pre-hooks ``z -> z + V(psi(z))`` at each block ``name -> (feature map, V)``."""
    modules = dict(model.named_modules())

    def hook_for(features, V):
        def hook(module, args, kwargs):
            z = get_stream(args, kwargs)
            with torch.no_grad():
                psi = features(z)
            return with_stream(args, kwargs, z + V(psi))

        return hook

    handles = [
        modules[name].register_forward_pre_hook(hook_for(features, V), with_kwargs=True)
        for name, (features, V) in terminals.items()
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def feature_maps(model, blocks):
    """satcore's seeded ``mlp`` feature map for each block (built from one stream sample)."""
    width = model.config.n_embd
    like = torch.zeros(1, 1, width)
    return {name: build_feature_map("mlp", like, init_std=model_init_std(model)) for name in blocks}


def backpack_pass(model, batches, features, *, batch_grad: bool):
    """Per block: ``n``, ``sum X_i`` (N x r), ``sum ||X_i||^2`` and, with ``batch_grad``, ``sum X_i^T X_i``."""
    from backpack import backpack, extend
    from backpack.extensions import BatchGrad, SumGradSquared

    width, r = model.config.n_embd, next(iter(features.values())).n_features
    terminals = {name: (f, extend(zero_linear(r, width))) for name, f in features.items()}
    sums = {name: {"n": 0, "cross": 0.0, "xi_sq": 0.0, "xtx": 0.0} for name in features}
    extension = BatchGrad() if batch_grad else SumGradSquared()
    with inserted_branches(model, terminals):
        for inputs, targets in batches:
            with backpack(extension):
                sequence_loss(call_model(model, inputs), targets).sum().backward()
            for name, (_, V) in terminals.items():
                w = V.weight
                acc = sums[name]
                acc["n"] += targets.shape[0]
                acc["cross"] = acc["cross"] + w.grad.to(torch.float64)
                if batch_grad:
                    X = w.grad_batch.to(torch.float64)
                    acc["xi_sq"] += float(X.pow(2).sum())
                    acc["xtx"] = acc["xtx"] + torch.einsum("bnr,bns->rs", X, X)
                else:
                    acc["xi_sq"] += float(w.sum_grad_squared.to(torch.float64).sum())
                w.grad = None
    return sums


def gromo_pass(model, batches, features, *, finalize=None):
    """Per block GroMo's ``tensor_s`` (K), ``tensor_m`` (C^T) and, when ``finalize`` is a dict of
    ``compute_optimal_delta`` keywords, its first-order decrease ``tr(M^T S^+ M)``."""
    from gromo.modules.linear_growing_module import LinearGrowingModule

    width, r = model.config.n_embd, next(iter(features.values())).n_features
    terminals = {}
    for name, f in features.items():
        V = LinearGrowingModule(r, width, use_bias=False, device=torch.device("cpu"), name=name)
        with torch.no_grad():
            V.weight.zero_()
        V.init_computation()
        terminals[name] = (f, V)
    with inserted_branches(model, terminals):
        for inputs, targets in batches:
            sequence_loss(call_model(model, inputs), targets).sum().backward()
            for _, V in terminals.values():
                V.update_computation(update_covariance_loss_gradient=False)
                V.weight.grad = None
    out = {}
    for name, (_, V) in terminals.items():
        out[name] = {"K": V.tensor_s(), "C": V.tensor_m().T}
        if finalize is not None:
            out[name]["decrease"] = float(V.compute_optimal_delta(**finalize)[2])
        V.reset_computation()
    return out


def zero_linear(r, width) -> nn.Linear:
    V = nn.Linear(r, width, bias=False)
    nn.init.zeros_(V.weight)
    return V


def satcore_pass(model, batches, blocks, *, variance=False, scored=False, **options):
    result = probe(model, batches, sequence_loss, candidates=blocks, head=False, family="mlp", variance=variance,
                   **options)
    return result.report() if scored else result


def agreement(model, batches, blocks) -> dict:
    """Relative differences, per block, where satcore's and the peers' quantities coincide."""
    features = feature_maps(model, blocks)
    ours = satcore_pass(model, batches, blocks, variance=True).statistics
    bp = backpack_pass(model, batches, features, batch_grad=True)
    bp_sgs = backpack_pass(model, batches, features, batch_grad=False)
    gm = gromo_pass(model, batches, features, finalize={"dtype": torch.float64, "force_pseudo_inverse": True})
    rows = {}
    for name in blocks:
        s = ours[name]
        n = s.n_samples
        score = s.score(name)
        b, g = bp[name], gm[name]
        C_bp = b["cross"].numpy() / b["n"]
        sigma_bp = variance_estimate(b["n"], bp_sgs[name]["xi_sq"], float(np.sum(C_bp**2)))
        rows[name] = {
            "backpack_C": rel(C_bp, s.cross_gradient()),
            "backpack_sum_xi_sq": rel(bp_sgs[name]["xi_sq"], s.sum_xi_sq),
            "backpack_sigma_sq": rel(sigma_bp, score.sigma_sq),
            "backpack_sum_xtx": rel(b["xtx"].numpy(), s.sum_xtx),
            "gromo_K": rel(g["K"].numpy(), s.feature_gram()),
            "gromo_C": rel(g["C"].numpy(), s.cross_gradient()),
            "gromo_growth_value": rel(math.sqrt(max(g["decrease"], 0.0)), score.growth_value),
            "n_samples": n,
        }
    worst = {k: max(row[k] for row in rows.values()) for k in next(iter(rows.values())) if k != "n_samples"}
    for k, v in worst.items():
        print(f"  agreement {k:22s} max rel diff over blocks {v:.2e}", flush=True)
    return {"per_block": rows, "max_rel_diff": worst}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    set_threads(args.threads)
    # BackPACK's hooks on V, whose input needs no gradient: harmless, V's weight gradient is what is read.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    repeats = args.repeats or 3
    n_layer, batch_size, n_batches = SIZES["quick" if args.quick else "full"]
    model = gpt2_model(n_layer=n_layer)
    for p in model.parameters():
        p.requires_grad_(False)
    blocks = [f"transformer.h.{i}" for i in range(model.config.n_layer)]
    batches = gpt2_batches(batch_size, n_batches)
    print(f"GPT-2 d={model.config.n_embd}, {len(blocks)} blocks, {batch_size}x{n_batches} sequences of T=128")
    checks = agreement(model, batches, blocks)
    features = feature_maps(model, blocks)
    runs = {
        "satcore": lambda: satcore_pass(model, batches, blocks),
        "satcore_float32": lambda: satcore_pass(model, batches, blocks, batch_dtype=torch.float32),
        "satcore_variance": lambda: satcore_pass(model, batches, blocks, variance=True),
        "satcore_scored": lambda: satcore_pass(model, batches, blocks, scored=True),
        "backpack_sumgradsquared": lambda: backpack_pass(model, batches, features, batch_grad=False),
        "backpack_batchgrad": lambda: backpack_pass(model, batches, features, batch_grad=True),
        "gromo": lambda: gromo_pass(model, batches, features),
        "gromo_scored": lambda: gromo_pass(model, batches, features, finalize={}),
    }
    seconds = interleaved(runs, repeats)
    memory = {name: peak_rss_increase(fn) for name, fn in runs.items()}
    for name in runs:
        print(f"  {name:24s} {seconds[name]:7.3f} s  peak +{memory[name] / 2**20:7.1f} MiB", flush=True)
    summary = {
        "backpack_vs_satcore_time": seconds["backpack_sumgradsquared"] / seconds["satcore"],
        "backpack_batchgrad_vs_satcore_variance_time": seconds["backpack_batchgrad"] / seconds["satcore_variance"],
        "backpack_vs_satcore_float32_time": seconds["backpack_sumgradsquared"] / seconds["satcore_float32"],
        "gromo_vs_satcore_time": seconds["gromo"] / seconds["satcore"],
        "gromo_vs_satcore_float32_time": seconds["gromo"] / seconds["satcore_float32"],
        "gromo_scored_vs_satcore_scored_time": seconds["gromo_scored"] / seconds["satcore_scored"],
        "backpack_vs_satcore_memory": memory["backpack_sumgradsquared"] / max(memory["satcore"], 1),
        "backpack_batchgrad_vs_satcore_variance_memory": memory["backpack_batchgrad"]
        / max(memory["satcore_variance"], 1),
        "gromo_vs_satcore_memory": memory["gromo"] / max(memory["satcore"], 1),
        "peers_max_rel_diff": max(checks["max_rel_diff"].values()),
    }
    for k, v in summary.items():
        print(f"{k} {v:.3g}")
    record(
        "peers",
        {
            "quick": args.quick,
            "repeats": repeats,
            "workload": {"model": "gpt2", "n_embd": model.config.n_embd, "blocks": len(blocks),
                         "batch_size": batch_size, "batches": n_batches, "seq_len": 128},
            "versions": {**versions(), **peer_versions()},
            "agreement": checks,
            "seconds": seconds,
            "peak_rss_increase_bytes": memory,
        },
        summary,
    )


def peer_versions() -> dict:
    from importlib.metadata import version

    return {p: version(p) for p in ("backpack-for-pytorch", "gromo")}


if __name__ == "__main__":
    main()
