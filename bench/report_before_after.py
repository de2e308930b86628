"""``report()`` of one probe with this checkout's scoring and with another checkout's, side by side.

Usage: ``python -m bench.report_before_after --before DIR [--layers 2] [--repeats 7]``.

``DIR`` is another checkout of this repository (``git worktree add DIR <commit>``): its
``satcore/_statistics/candidate.py``, ``satcore/_formulas/psd.py`` and ``satcore/_formulas/folds.py``
are executed into copies of this checkout's module namespaces, so ``CandidateStatistics.score`` runs
with that code's ``score``, ``gram_inverse`` and ``FoldSums`` on the very statistics this checkout's
probe returned (a ``score`` that reads ``feature_gram_inverse`` reads the other checkout's
``gram_inverse`` through it).  The probe is
``decoder_1b_cpu.py``'s Llama-style decoder at the 1B row's width (d 2048, ``r = d``) with
``--layers`` layers, 2 windows of 128 tokens, one thread; the two reports alternate ``--repeats``
times (CPU seconds, medians) and their growth values and verdicts are compared.  Prints; with
``--record LABEL`` (the other checkout's commit) also writes ``sections.report_before_after.LABEL``,
which the benchmarks page reads beside the full row's probe time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import satcore._formulas.folds as folds
import satcore._formulas.psd as psd
import satcore._statistics.candidate as candidate
from bench._results import RESULTS, record
from bench._workloads import interleaved, set_threads, versions
from bench.device_run import SIZES, llama, token_batches
from satcore.adapters.torch import probe, sequence_loss


def namespace_of(module, source: Path) -> dict:
    """``source`` executed in a copy of ``module``'s namespace (its imports resolve to this checkout's)."""
    names = dict(vars(module))
    exec(compile(source.read_text(), str(source), "exec"), names)
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--record", metavar="LABEL", help="store the run as sections.report_before_after.LABEL")
    args = parser.parse_args()
    set_threads(1)
    before = namespace_of(candidate, args.before / "satcore/_statistics/candidate.py")
    before["gram_inverse"] = namespace_of(psd, args.before / "satcore/_formulas/psd.py")["gram_inverse"]
    before["FoldSums"] = namespace_of(folds, args.before / "satcore/_formulas/folds.py")["FoldSums"]
    # the other checkout's feature_gram_inverse, where it has one (its score reads it), runs with it
    methods = [m for m in ("score", "feature_gram_inverse") if hasattr(before["CandidateStatistics"], m)]
    scores = {"before": {m: getattr(before["CandidateStatistics"], m) for m in methods},
              "after": {m: getattr(candidate.CandidateStatistics, m) for m in methods}}
    model, config = llama(torch.device("cpu"), {**SIZES["device"]["llama"], "num_hidden_layers": args.layers},
                          torch.float32)
    batches = token_batches(config, 1, 128, 2, 0, torch.device("cpu"))
    load = os.getloadavg()[0]
    start = time.process_time()
    result = probe(model, batches, sequence_loss, n_features=config.hidden_size)
    probe_seconds = time.process_time() - start

    def report_with(code):
        def run():
            for name, method in code.items():
                setattr(candidate.CandidateStatistics, name, method)
            try:
                return result.report()
            finally:
                for name, method in scores["after"].items():
                    setattr(candidate.CandidateStatistics, name, method)
        return run

    reports = {name: report_with(score)() for name, score in scores.items()}
    gaps = [abs(a.growth_value - b.growth_value) / b.growth_value
            for a, b in zip(reports["before"].candidates, reports["after"].candidates)]
    seconds = interleaved({name: report_with(score) for name, score in scores.items()}, args.repeats, time.process_time)
    k = len(result.statistics)
    print(f"probe {probe_seconds:.2f} s, {k} candidates of r = {config.hidden_size}; report() before "
          f"{seconds['before']:.3f} s ({seconds['before'] / k:.3f} a candidate), after {seconds['after']:.3f} s "
          f"({seconds['after'] / k:.3f} a candidate); same verdict: "
          f"{reports['before'].verdict == reports['after'].verdict}; growth values within {max(gaps):.1e}; "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f} (medians of {args.repeats}, CPU seconds)")
    if args.record:
        runs = json.loads(RESULTS.read_text())["sections"].get(SECTION, {}) if RESULTS.exists() else {}
        runs[args.record] = {
            "candidates": k, "n_features": config.hidden_size, "layers": args.layers, "repeats": args.repeats,
            "probe_seconds": probe_seconds, "report_seconds": seconds,
            "same_verdict": reports["before"].verdict == reports["after"].verdict, "growth_gap": max(gaps),
            "load_average_start": load, "versions": versions(),  # versions(): the load at the end
        }
        record(SECTION, runs)


SECTION = "report_before_after"


if __name__ == "__main__":
    main()
