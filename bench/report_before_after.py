"""``report()`` of one probe with this checkout's scoring and with another checkout's, side by side.

Usage: ``python -m bench.report_before_after --before DIR [--workload decoder|gpt2] [--layers 2] [--repeats 7]``.

``DIR`` is another checkout of this repository (``git worktree add DIR <commit>``): its
``satcore/_statistics/candidate.py``, ``satcore/_formulas/psd.py`` and ``satcore/_formulas/folds.py``
are executed into copies of this checkout's module namespaces, so ``CandidateStatistics.score`` runs
with that code's ``score``, ``gram_inverse`` and ``FoldSums`` on the very statistics this checkout's
probe returned (a ``score`` that reads ``feature_gram_inverse`` reads the other checkout's
``gram_inverse`` through it).  The probe (``--workload decoder``, the default) is
``decoder_1b_cpu.py``'s Llama-style decoder at the 1B row's width (d 2048, ``r = d``) with
``--layers`` layers, 2 windows of 128 tokens, one thread; the two reports alternate ``--repeats``
times (CPU seconds, medians) and their growth values and verdicts are compared.  Prints; with
``--record LABEL`` (the other checkout's commit) also writes ``sections.report_before_after.LABEL``,
which the benchmarks page reads beside the full row's probe time.  ``--workload gpt2``: the probe is
:mod:`bench.bench_peers`' GPT-2 (its sizes and runner), and its scored runners alternate too (satcore's
probe + ``report()`` with either code, GroMo's with ``compute_optimal_delta``), so the scored ratio of
each code is read in one process; it prints only (the peers page quotes the run).
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
    parser.add_argument("--workload", choices=("decoder", "gpt2"), default="decoder")
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
    scored_runs = {}
    if args.workload == "gpt2":
        from bench import bench_peers

        if args.record:
            parser.error("--record stores the decoder's runs; --workload gpt2 prints only")
        scored_runs = bench_peers.contenders("gpt2", "full")[1]
        make_probe = scored_runs["satcore"]
    else:
        model, config = llama(torch.device("cpu"), {**SIZES["device"]["llama"], "num_hidden_layers": args.layers},
                              torch.float32)
        batches = token_batches(config, 1, 128, 2, 0, torch.device("cpu"))
        make_probe = lambda: probe(model, batches, sequence_loss, n_features=config.hidden_size)  # noqa: E731
    load = os.getloadavg()[0]
    start = time.process_time()
    result = make_probe()
    probe_seconds = time.process_time() - start

    def with_code(code, run):
        def patched():
            for name, method in code.items():
                setattr(candidate.CandidateStatistics, name, method)
            try:
                return run()
            finally:
                for name, method in scores["after"].items():
                    setattr(candidate.CandidateStatistics, name, method)
        return patched

    def report_with(code):
        return with_code(code, result.report)

    reports = {name: report_with(score)() for name, score in scores.items()}
    gaps = [abs(a.growth_value - b.growth_value) / b.growth_value
            for a, b in zip(reports["before"].candidates, reports["after"].candidates)]
    seconds = interleaved({name: report_with(score) for name, score in scores.items()}, args.repeats, time.process_time)
    k, widths = len(result.statistics), sorted({s.n_features for s in result.statistics.values()})
    print(f"probe {probe_seconds:.2f} s, {k} candidates of r = {', '.join(map(str, widths))}; report() before "
          f"{seconds['before']:.3f} s ({seconds['before'] / k:.3f} a candidate), after {seconds['after']:.3f} s "
          f"({seconds['after'] / k:.3f} a candidate); same verdict: "
          f"{reports['before'].verdict == reports['after'].verdict}; growth values within {max(gaps):.1e}; fold tests "
          f"equal: {all(test_numbers(a) == test_numbers(b) for a, b in zip(*(r.candidates for r in reports.values())))}; "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f} (medians of {args.repeats}, CPU seconds)")
    if scored_runs:  # the whole scored runs, each code's against GroMo's, alternated in this process
        scored = interleaved({"before": with_code(scores["before"], scored_runs["satcore_scored"]),
                              "after": with_code(scores["after"], scored_runs["satcore_scored"]),
                              "gromo_scored": scored_runs["gromo_scored"]}, args.repeats, time.process_time)
        print(f"probe + report() before {scored['before']:.3f} s, after {scored['after']:.3f} s, GroMo scored "
              f"{scored['gromo_scored']:.3f} s: GroMo scored / satcore scored {scored['gromo_scored'] / scored['before']:.3f} "
              f"-> {scored['gromo_scored'] / scored['after']:.3f}; load average {os.getloadavg()[0]:.1f} "
              f"(medians of {args.repeats}, CPU seconds)")
    if args.record:
        runs = json.loads(RESULTS.read_text())["sections"].get(SECTION, {}) if RESULTS.exists() else {}
        runs[args.record] = {
            "candidates": k, "n_features": widths[0], "layers": args.layers, "repeats": args.repeats,
            "probe_seconds": probe_seconds, "report_seconds": seconds,
            "same_verdict": reports["before"].verdict == reports["after"].verdict, "growth_gap": max(gaps),
            "load_average_start": load, "versions": versions(),  # versions(): the load at the end
        }
        record(SECTION, runs)


def test_numbers(score) -> dict | None:
    """A score's fold test as numbers (each checkout's ``FoldTest`` is its own class, which ``==`` tells apart)."""
    return None if score.fold_test is None else score.fold_test.to_dict()


SECTION = "report_before_after"


if __name__ == "__main__":
    main()
