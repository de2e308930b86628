"""Performance benches: overhead, throughput and memory (docs/benchmarks.md).

Run from the repository root as ``python -m bench.<name>`` (``python -m bench.run_all`` runs them all); the
validity studies are in ``studies/``.
"""
