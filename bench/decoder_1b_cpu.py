"""The 1B-class decoder of ``device_run.py`` on this CPU: CPU, not the GPU target.

Usage: ``python -m bench.decoder_1b_cpu [--windows 2] [--seq-len 128] [--layers 22]``.

No GPU is lent to the sessions that maintain this page, so the device script's
Llama-style decoder (d 2048, 22 layers, 32 heads, 4 key-value heads:
TinyLlama-1.1B's shape, ``device_run.SIZES["device"]["llama"]``) runs here in
float32 with seeded random weights, on one thread, at a tiny token count
(``--windows`` batches of one ``--seq-len``-token window): one plain forward +
backward (the floor), one ``probe`` at every block with ``n_features = d``
(the device script's choice), and its ``report()``; CPU seconds of this
process.  Memory: ``plan(...).peak_bytes`` against the resident high-water
increase of one probe call (``probe_peak_over_planned``; the plan leaves out
the model's own activations, small at these token counts), beside the
floor's (whose parameter gradients, 4.4 GB here, the probe never forms).
The section is written before ``report()`` runs, and again with its time
if it finishes under the memory limit; ``report()`` runs twice, alternating
with the same report whose ``G^-`` comes from the eigen decomposition (the
route before ``gram_inverse``), medians of CPU seconds.
``--layers N`` (fewer than 22) keeps the width (``r = d = 2048``, the
per-candidate cost of probe and report alike) with ``N`` layers, for a
machine that cannot hold the whole model; it writes
``sections.decoder_1b_cpu_layers<N>`` and leaves the full row alone.
Not ``bench_``-prefixed: ``run_all.py`` leaves it out (minutes and ~10 GB).
Writes ``sections.decoder_1b_cpu``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench._results import record
from bench._workloads import floor_pass, peak_rss_increase, set_threads, versions
from bench.bench_peers import with_eigen_route
from bench.device_run import SIZES, llama, token_batches

from satcore.adapters.torch import plan, probe, sequence_loss


RSS_LIMIT = 15.5 * 2**30  # the run stops itself past this (the machine's 23 GiB are shared)


def resident_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def watch_memory():
    """Stop the process (exit 3) as soon as its resident memory passes :data:`RSS_LIMIT`."""
    import os
    import threading

    def watch():
        while True:
            if resident_bytes() > RSS_LIMIT:
                print(f"decoder_1b_cpu: resident memory passed {RSS_LIMIT / 2**30:.1f} GiB, stopping", flush=True)
                os._exit(3)
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()


def cpu_seconds(fn):
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def step(name):
    print(f"  {name} (resident {resident_bytes() / 2**30:.1f} GiB)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--layers", type=int, default=SIZES["device"]["llama"]["num_hidden_layers"])
    args = parser.parse_args()
    set_threads(1)
    watch_memory()
    sizes = {**SIZES["device"]["llama"], "num_hidden_layers": args.layers}
    section = "decoder_1b_cpu" if sizes == SIZES["device"]["llama"] else f"decoder_1b_cpu_layers{args.layers}"
    build_seconds, (model, config) = cpu_seconds(lambda: llama(torch.device("cpu"), sizes, torch.float32))
    batches = token_batches(config, 1, args.seq_len, args.windows, 0, torch.device("cpu"))
    options = {"n_features": config.hidden_size}
    step("built")
    planned = plan(model, batches[0], sequence_loss, **options)
    step("planned")
    probe_peak = peak_rss_increase(lambda: probe(model, batches[:1], sequence_loss, **options))
    step("probe peak measured")
    floor_peak = peak_rss_increase(lambda: floor_pass(model, batches[:1], sequence_loss))
    step("floor peak measured")
    floor_seconds, _ = cpu_seconds(lambda: floor_pass(model, batches, sequence_loss))
    step("floor timed")
    probe_seconds, result = cpu_seconds(lambda: probe(model, batches, sequence_loss, **options))
    step("probe timed")
    del batches[1:]  # only the first window is needed from here
    tokens = args.windows * args.seq_len
    row = {
        "label": "CPU, not the GPU target",
        "config": {**sizes, "dtype": "float32"},
        "parameters": sum(p.numel() for p in model.parameters()),
        "candidates": len(planned.candidates),
        "n_features": planned.candidates[0].n_features,
        "windows": args.windows,
        "seq_len": args.seq_len,
        "seconds": {"build": build_seconds, "floor": floor_seconds, "probe": probe_seconds},
        "floor_tokens_per_s": tokens / floor_seconds,
        "probe_tokens_per_s": tokens / probe_seconds,
        "probe_vs_floor": probe_seconds / floor_seconds,
        "plan_peak_bytes": planned.peak_bytes,
        "plan_score_bytes": planned.score_bytes,
        "floor_peak_rss_increase_bytes": floor_peak,
        "probe_peak_rss_increase_bytes": probe_peak,
        "probe_peak_over_planned": probe_peak / planned.peak_bytes,
        "resident_after_probe_bytes": resident_bytes(),
        "report": f"stopped when the resident memory passed {RSS_LIMIT / 2**30:.1f} GiB",  # replaced if it finishes
    }
    print(f"llama {row['parameters'] / 1e9:.2f}B float32 on the CPU, {row['candidates']} candidates, r "
          f"{row['n_features']}, {tokens} tokens: floor {floor_seconds:.1f} s ({row['floor_tokens_per_s']:.1f} "
          f"tokens/s), probe {probe_seconds:.1f} s ({row['probe_tokens_per_s']:.1f} tokens/s, "
          f"{row['probe_vs_floor']:.2f}x); plan {planned.peak_bytes / 2**30:.2f} GiB, probe peak "
          f"{probe_peak / 2**30:.2f} GiB, floor peak {floor_peak / 2**30:.2f} GiB", flush=True)
    record(section, {**row, "versions": versions()})  # kept if the report below passes the limit
    seconds = {"score": [], "score_eigen": []}
    for _ in range(2):
        spent, report = cpu_seconds(result.report)
        seconds["score"].append(spent)
        seconds["score_eigen"].append(cpu_seconds(lambda: with_eigen_route(result.report))[0])
        step("report timed")
    row["seconds"].update({key: statistics.median(values) for key, values in seconds.items()})
    row["score_vs_probe"] = row["seconds"]["score"] / probe_seconds
    row["score_eigen_vs_probe"] = row["seconds"]["score_eigen"] / probe_seconds
    print(f"report() {row['seconds']['score']:.1f} s = {row['score_vs_probe']:.1%} of the probe; with the eigen "
          f"route {row['seconds']['score_eigen']:.1f} s = {row['score_eigen_vs_probe']:.1%}", flush=True)
    row["report"] = str(report.verdict.verdict) if report.verdict else "no verdict"
    record(section, {**row, "versions": versions()})


if __name__ == "__main__":
    main()
