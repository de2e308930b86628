"""Peers: BackPACK and GroMo against satcore on the same blocks and batches.

Usage: ``python -m bench.bench_peers [--quick] [--threads N] [--repeats R] [--workload gpt2|resnet8]``
(``--workload``: that workload's rows only; the other's stay as recorded).

Workloads of :mod:`_workloads`: GPT-2 (``mlp`` family, BackPACK and GroMo)
and the paper's ResNet-8 (``conv`` family, BackPACK; GroMo's convolution
module is not wired here).  The peers get what a user of each would build:
at the input of every residual block a zero-output branch
``z -> z + V psi(z)`` is inserted with a forward pre-hook, ``psi`` being
satcore's own feature map (the same seeded weights; computed without a graph,
as the peers only need ``V``'s gradient) and ``V`` zero: a
``Linear(r, d, bias=False)`` on the ``mlp`` features ``act(W1 LN(z))``, or a
3x3 ``Conv2d(C_mid, C)`` on ``relu(BN(conv3x3(z)))`` for ``conv`` (its
per-sample gradient, flattened, is ``X_i`` in the unfold order of satcore's
patches):

* BackPACK (``backpack.extend(V)``): ``SumGradSquared`` gives
  ``sum_i ||xi_i||^2`` and ``V.grad`` gives ``sum_i X_i = n C`` (the
  default-probe quantities C and sigma^2, Prop. 1); ``BatchGrad`` gives every
  ``X_i``, hence ``sum_i X_i^T X_i`` (the ``variance=True`` quantity).
* GroMo (``LinearGrowingModule`` as ``V``): its ``TensorStatistic`` objects
  ``tensor_s`` (= K) and ``tensor_m`` (= C^T), and its
  ``compute_optimal_delta`` first-order decrease ``tr(M^T S^+ M)`` (=
  ``growth_value^2``, Lemma 4).

Every contender's measured call starts from the same state (:func:`contenders`: the model loaded,
the batches made, the blocks' names and widths found) and builds what its tool needs inside the call,
as a user pays it: satcore's ``probe`` its taps and feature maps; BackPACK the feature maps, the
``extend``-ed ``V`` and the inserting pre-hooks; GroMo the feature maps, its ``LinearGrowingModule``
(with its tensor statistics) and the pre-hooks.  The model's own parameters are frozen for the peers (their backward then
only reaches ``V``, the cheapest a peer can do); satcore's probe computes
gradients to its taps only anyway.  First the numbers are checked where the
quantities coincide (relative differences are printed and stored), then time
(interleaved medians of CPU seconds, user + system, of this one-thread process: on a shared
machine far steadier than wall time) and resident peak memory (each contender alone in a fresh
process, ``--peak-of WORKLOAD:CONTENDER``, interleaved medians; also in this process, after the other
runs, which lifts every peak) are compared:

=========================  =====================================================
``satcore``                default probe: C, K, sum ||xi||^2 (per-batch float64;
                           C from a float32 product of centred features)
``satcore_float32``        the same with ``batch_dtype=torch.float32``
``satcore_variance``       ``variance=True`` (adds sum X^T X)
``satcore_scored``         default probe + ``report()`` (growth values)
``satcore_scored_eigen``   the same with the score's ``G^-`` from an eigen
                           decomposition (``psd_spectrum``: the route before
                           ``gram_inverse``, side by side)
``backpack_sumgradsquared`` C and sum ||xi||^2 (no K: no growth value)
``backpack_batchgrad``     every X_i, summed into sum X^T X
``gromo``                  K and C (no variance)
``gromo_scored``           + ``compute_optimal_delta()`` (its defaults)
=========================  =====================================================

BackPACK computes less than satcore's default (no ``r x r`` Gram), GroMo
computes K and C in float32: the ``*_float32`` ratios are the like-for-like
arithmetic.  Summary keys without a suffix are GPT-2's; ResNet-8's end in
``_resnet8``.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn

from bench._results import record, results_path
from bench._workloads import (WORKLOADS, fresh_process_peaks, interleaved, peak_rss_increase, parse_bench_args,
                              versions)
from satcore.adapters.torch import build_feature_map, find_blocks, probe
from satcore.adapters.torch.features import ConvFeatures
from satcore.adapters.torch.capture import get_stream, with_stream
from satcore.adapters.torch.probe import call_model, model_init_std
from satcore._formulas.certification import variance_estimate

SIZES = {  # workload -> mode -> (blocks, batch size, batches); GPT-2: M*T > r = 1024 for a full-rank K
    "gpt2": {"quick": (2, 4, 3), "full": (8, 4, 4)},
    "resnet8": {"quick": (3, 32, 2), "full": (3, 64, 4)},
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
            with torch.no_grad():  # conv: V is a 3x3 conv on the hidden map, i.e. V applied to the patches
                psi = features.hidden(z) if isinstance(features, ConvFeatures) else features(z)
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


def stream_layouts(model, batches, blocks) -> dict:
    """Per block, an empty-valued tensor of one position of its stream: ``(1, C, 1, 1)`` for an image,
    ``(1, N)`` otherwise, in the stream's dtype.

    What a peer's user knows from the architecture (the widths), found once by a forward of one batch
    before any measured call; :func:`peer_feature_maps` builds the weights from it inside each peer's
    measured call (satcore builds its own inside ``probe``, from the first batch's streams).
    """
    modules, layouts = dict(model.named_modules()), {}

    def record_layout(name):
        def hook(module, args, kwargs):
            z = get_stream(args, kwargs)
            shape = (1, z.shape[1], 1, 1) if z.dim() == 4 else (1, z.shape[-1])
            layouts[name] = torch.zeros(shape, dtype=z.dtype)

        return hook

    handles = [modules[n].register_forward_pre_hook(record_layout(n), with_kwargs=True) for n in blocks]
    with torch.no_grad():
        call_model(model, batches[0][0])
    for handle in handles:
        handle.remove()
    return layouts


def peer_feature_maps(model, layouts: dict) -> dict:
    """satcore's seeded feature map (family ``auto``, the model's init scale) for each block of ``layouts``:
    the weights a peer's branch ``V psi`` needs, built inside the peer's measured call."""
    init_std = model_init_std(model)
    return {name: build_feature_map("auto", like, init_std=init_std) for name, like in layouts.items()}


def zero_terminal(features) -> nn.Module:
    """``V = 0``: ``Linear(r, N)`` on the features, or the 3x3 ``Conv2d(C_mid, C)`` of the conv family."""
    if isinstance(features, ConvFeatures):
        V = nn.Conv2d(features.mid_channels, features.width, 3, padding=1, bias=False)
    else:
        V = nn.Linear(features.n_features, features.width, bias=False)
    nn.init.zeros_(V.weight)
    return V


def backpack_pass(model, batches, loss_fn, layouts, *, batch_grad: bool):
    """Per block: ``n``, ``sum X_i`` (N x r), ``sum ||X_i||^2`` and, with ``batch_grad``, ``sum X_i^T X_i``.

    Builds everything it uses: the feature maps, the extended ``V`` (``extend`` adds BackPACK's hooks
    to it), the pre-hooks inserting the branches and the extension.
    """
    from backpack import backpack, extend
    from backpack.extensions import BatchGrad, SumGradSquared

    features = peer_feature_maps(model, layouts)
    terminals = {name: (f, extend(zero_terminal(f))) for name, f in features.items()}
    sums = {name: {"n": 0, "cross": 0.0, "xi_sq": 0.0, "xtx": 0.0} for name in features}
    extension = BatchGrad() if batch_grad else SumGradSquared()
    with inserted_branches(model, terminals):
        for inputs, targets in batches:
            with backpack(extension):
                loss_fn(call_model(model, inputs), targets).sum().backward()
            for name, (_, V) in terminals.items():
                w = V.weight
                acc = sums[name]
                acc["n"] += targets.shape[0]
                acc["cross"] = acc["cross"] + w.grad.to(torch.float64).flatten(1)
                if batch_grad:
                    X = w.grad_batch.to(torch.float64).flatten(2)
                    acc["xi_sq"] += float(X.pow(2).sum())
                    acc["xtx"] = acc["xtx"] + torch.einsum("bnr,bns->rs", X, X)
                else:
                    acc["xi_sq"] += float(w.sum_grad_squared.to(torch.float64).sum())
                w.grad = None
    return sums


def gromo_pass(model, batches, loss_fn, layouts, *, finalize=None):
    """Per block GroMo's ``tensor_s`` (K), ``tensor_m`` (C^T) and, when ``finalize`` is a dict of
    ``compute_optimal_delta`` keywords, its first-order decrease ``tr(M^T S^+ M)``.

    Builds everything it uses: the feature maps, the ``LinearGrowingModule`` per block (its constructor
    creates its ``TensorStatistic`` objects; ``init_computation`` resets them and makes its forward keep
    its input and, with ``retain_grad``, its pre-activation's gradient, which ``update_computation``
    folds in) and the pre-hooks inserting them.
    """
    from gromo.modules.linear_growing_module import LinearGrowingModule

    features, terminals = peer_feature_maps(model, layouts), {}
    for name, f in features.items():
        V = LinearGrowingModule(f.n_features, f.width, use_bias=False, device=torch.device("cpu"), name=name)
        with torch.no_grad():
            V.weight.zero_()
        V.init_computation()
        terminals[name] = (f, V)
    with inserted_branches(model, terminals):
        for inputs, targets in batches:
            loss_fn(call_model(model, inputs), targets).sum().backward()
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


def satcore_pass(model, batches, loss_fn, blocks, *, scored=False, **options):
    result = probe(model, batches, loss_fn, candidates=blocks, head=False, **options)
    return result.report() if scored else result


def with_eigen_route(run):
    """``run()`` with the score's ``G^-`` from the eigen decomposition (the route before ``gram_inverse``)."""
    from satcore._formulas import psd
    from satcore._statistics import candidate

    candidate.gram_inverse = (lambda K, rtol, rank_bound=None, symmetric=False, mean_of=1.0:
                              psd.psd_spectrum(K, rtol).of_mean(mean_of))
    try:
        return run()
    finally:
        candidate.gram_inverse = psd.gram_inverse


def agreement(model, batches, loss_fn, blocks, layouts, *, gromo: bool) -> dict:
    """Relative differences, per block, where satcore's and the peers' quantities coincide."""
    ours = satcore_pass(model, batches, loss_fn, blocks, variance=True).statistics
    bp = backpack_pass(model, batches, loss_fn, layouts, batch_grad=True)
    bp_sgs = backpack_pass(model, batches, loss_fn, layouts, batch_grad=False)
    gm = gromo_pass(model, batches, loss_fn, layouts, finalize=EXACT_DELTA) if gromo else None
    rows = {}
    for name in blocks:
        s = ours[name]
        score = s.score(name)
        b = bp[name]
        C_bp = b["cross"].numpy() / b["n"]
        sigma_bp = variance_estimate(b["n"], bp_sgs[name]["xi_sq"], float(np.sum(C_bp**2)))
        rows[name] = {
            "backpack_C": rel(C_bp, s.cross_gradient()),
            "backpack_sum_xi_sq": rel(bp_sgs[name]["xi_sq"], s.sum_xi_sq),
            "backpack_sigma_sq": rel(sigma_bp, score.sigma_sq),
            "backpack_sum_xtx": rel(b["xtx"].numpy(), s.sum_xtx),
        }
        if gm is not None:
            g = gm[name]
            rows[name].update({
                "gromo_K": rel(g["K"].numpy(), s.feature_gram()),
                "gromo_C": rel(g["C"].numpy(), s.cross_gradient()),
                "gromo_growth_value": rel(math.sqrt(max(g["decrease"], 0.0)), score.growth_value),
            })
    worst = {k: max(row[k] for row in rows.values()) for k in next(iter(rows.values()))}
    for k, v in worst.items():
        print(f"  agreement {k:22s} max rel diff over blocks {v:.2e}", flush=True)
    return {"per_block": rows, "max_rel_diff": worst, "n_samples": ours[blocks[0]].n_samples}


EXACT_DELTA = {"dtype": torch.float64, "force_pseudo_inverse": True}  # GroMo's decrease, for the check only


def contenders(workload: str, mode: str) -> tuple[dict, dict]:
    """The workload's model, batches, blocks and stream layouts, and a runner per contender.

    The state every runner starts from: the model loaded (its parameters frozen), the batches made, the
    blocks' names and widths found; nothing of any one tool.  Each runner builds what its tool needs
    inside its call (satcore's ``probe``: its taps and feature maps; a peer: its feature maps, branches
    and hooks), so the measured windows cover the same work a user of each tool pays.
    """
    build, make_batches, loss_fn = WORKLOADS[workload]
    n_blocks, batch_size, n_batches = SIZES[workload][mode]
    model = build(n_layer=n_blocks) if workload == "gpt2" else build()
    for p in model.parameters():
        p.requires_grad_(False)
    blocks = find_blocks(model)
    batches = make_batches(batch_size, n_batches)
    layouts = stream_layouts(model, batches, blocks)
    runs = {
        "satcore": lambda: satcore_pass(model, batches, loss_fn, blocks),
        "satcore_float32": lambda: satcore_pass(model, batches, loss_fn, blocks, batch_dtype=torch.float32),
        "satcore_variance": lambda: satcore_pass(model, batches, loss_fn, blocks, variance=True),
        "satcore_scored": lambda: satcore_pass(model, batches, loss_fn, blocks, scored=True),
        "satcore_scored_eigen": lambda: with_eigen_route(
            lambda: satcore_pass(model, batches, loss_fn, blocks, scored=True)),
        "backpack_sumgradsquared": lambda: backpack_pass(model, batches, loss_fn, layouts, batch_grad=False),
        "backpack_batchgrad": lambda: backpack_pass(model, batches, loss_fn, layouts, batch_grad=True),
    }
    if workload == "gpt2":
        runs["gromo"] = lambda: gromo_pass(model, batches, loss_fn, layouts)
        runs["gromo_scored"] = lambda: gromo_pass(model, batches, loss_fn, layouts, finalize={})
    setting = {"model": model, "batches": batches, "loss_fn": loss_fn, "blocks": blocks, "layouts": layouts,
               "batch_size": batch_size, "n_batches": n_batches}
    return setting, runs


def peak_alone(workload: str, mode: str, name: str) -> int:
    """Peak resident rise of contender ``name``'s second call in this process, after one call that loads
    its modules and lazily built state (what a user running that one tool sees from then on).

    The first call runs under :func:`peak_rss_increase` too: its allocator settings must hold from the
    first allocation on (one call under glibc's defaults raised the second's peak by 45 MB on GPT-2).
    """
    _, runs = contenders(workload, mode)
    peak_rss_increase(runs[name])
    return peak_rss_increase(runs[name])


def peaks_in_fresh_processes(workload: str, names, *, quick: bool, threads: int, repeats: int) -> dict:
    """:func:`peak_alone` of every contender, each in a fresh ``python -m bench.bench_peers --peak-of``
    with the same threads (:func:`_workloads.fresh_process_peaks`: interleaved, medians of ``repeats``)."""
    def command(name):
        return [sys.executable, "-m", "bench.bench_peers", "--peak-of", f"{workload}:{name}",
                "--threads", str(threads), *(["--quick"] if quick else [])]

    return fresh_process_peaks(command, names, repeats)


def measure(workload: str, mode: str, repeats: int, threads: int) -> tuple[dict, dict]:
    """Agreement, then interleaved times and peak memory (in this process, then each contender in a
    fresh one) of every contender on one workload."""
    setting, runs = contenders(workload, mode)
    model, batches, loss_fn, blocks = (setting[k] for k in ("model", "batches", "loss_fn", "blocks"))
    batch_size, n_batches = setting["batch_size"], setting["n_batches"]
    gromo = workload == "gpt2"
    print(f"{workload}: {len(blocks)} blocks, {n_batches} batches of {batch_size}", flush=True)
    checks = agreement(model, batches, loss_fn, blocks, setting["layouts"], gromo=gromo)
    seconds = interleaved(runs, repeats, clock=time.process_time)  # one thread: CPU seconds, steadier on a shared host
    in_process = {name: peak_rss_increase(fn) for name, fn in runs.items()}
    fresh = peaks_in_fresh_processes(workload, runs, quick=mode == "quick", threads=threads, repeats=repeats)
    memory = fresh["median"]
    for name in runs:
        print(f"  {name:24s} {seconds[name]:7.3f} s  peak +{memory[name] / 1e6:7.1f} MB alone, "
              f"+{in_process[name] / 1e6:7.1f} MB in this process", flush=True)
    suffix = "" if workload == "gpt2" else f"_{workload}"
    t, m, mi = seconds, memory, in_process
    summary = {
        "satcore_scored_eigen_vs_satcore_scored_time": t["satcore_scored_eigen"] / t["satcore_scored"],
        "backpack_vs_satcore_time": t["backpack_sumgradsquared"] / t["satcore"],
        "backpack_vs_satcore_float32_time": t["backpack_sumgradsquared"] / t["satcore_float32"],
        "backpack_batchgrad_vs_satcore_variance_time": t["backpack_batchgrad"] / t["satcore_variance"],
        "backpack_vs_satcore_memory": m["backpack_sumgradsquared"] / max(m["satcore"], 1),
        "backpack_batchgrad_vs_satcore_variance_memory": m["backpack_batchgrad"] / max(m["satcore_variance"], 1),
        "backpack_vs_satcore_memory_in_process": mi["backpack_sumgradsquared"] / max(mi["satcore"], 1),
    }
    if gromo:
        summary.update({
            "gromo_vs_satcore_time": t["gromo"] / t["satcore"],
            "gromo_vs_satcore_float32_time": t["gromo"] / t["satcore_float32"],
            "gromo_scored_vs_satcore_scored_time": t["gromo_scored"] / t["satcore_scored"],
            "gromo_scored_vs_satcore_scored_eigen_time": t["gromo_scored"] / t["satcore_scored_eigen"],
            "gromo_vs_satcore_memory": m["gromo"] / max(m["satcore"], 1),
            "gromo_vs_satcore_memory_in_process": mi["gromo"] / max(mi["satcore"], 1),
        })
    summary["peers_max_rel_diff"] = max(checks["max_rel_diff"].values())
    summary = {key + suffix: value for key, value in summary.items()}
    for k, v in summary.items():
        print(f"{k} {v:.3g}", flush=True)
    details = {"blocks": blocks, "batch_size": batch_size, "batches": n_batches, "agreement": checks,
               "seconds": seconds, "peak_rss_increase_bytes": memory,
               "peak_rss_increase_bytes_fresh_runs": fresh["runs"], "peak_rss_increase_bytes_in_process": in_process}
    return details, summary


def main():
    args = parse_bench_args(__doc__, {"--peak-of": "WORKLOAD:CONTENDER: print that one's peak_alone, in bytes",
                                      "--workload": f"one of {list(SIZES)}: its rows only, the other's as recorded"})
    # BackPACK's hooks on V, whose input needs no gradient: harmless, V's weight gradient is what is read.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    mode = "quick" if args.quick else "full"
    if args.peak_of:
        workload, name = args.peak_of.split(":")
        print(peak_alone(workload, mode, name))
        return
    if args.workload not in (None, *SIZES):
        raise SystemExit(f"--workload must be one of {list(SIZES)}, got {args.workload!r}")
    repeats = args.repeats or 3
    details, summary = recorded_workloads(args.quick) if args.workload else {}, {}
    for workload in [args.workload] if args.workload else SIZES:
        details[workload], values = measure(workload, mode, repeats, args.threads)
        summary.update(values)
    record(
        "peers",
        {"quick": args.quick, "repeats": repeats, "versions": {**versions(), **peer_versions()},
         "workloads": details},
        summary,
    )


def recorded_workloads(quick: bool) -> dict:
    """The workloads' details as the peers section of the results holds them (none when it holds none):
    a run of one workload keeps the other's (its summary keys stay at the top level as they are)."""
    import json

    path = results_path({"quick": quick})
    sections = json.loads(path.read_text()).get("sections", {}) if path.exists() else {}
    return dict(sections.get("peers", {}).get("workloads", {}))


def peer_versions() -> dict:
    from importlib.metadata import version

    return {p: version(p) for p in ("backpack-for-pytorch", "gromo")}


if __name__ == "__main__":
    main()
