"""Read-merge-write of ``bench/results.json``: every benchmark adds its own keys.

A quick run (``run_all --quick`` sets :data:`QUICK_ENV`, or a section recorded with ``"quick": true``) writes
``bench/out/results-quick.json`` (git-ignored) instead: the committed results, and the pages rendered from them,
keep the full runs' numbers."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).with_name("results.json")
QUICK_RESULTS = Path(__file__).parent / "out" / "results-quick.json"
QUICK_ENV = "SATCORE_BENCH_QUICK"


def results_path(values: dict | None = None) -> Path:
    """Where a run's keys go: :data:`QUICK_RESULTS` for a quick run, :data:`RESULTS` for a full one."""
    quick = os.environ.get(QUICK_ENV) == "1" or bool((values or {}).get("quick"))
    return QUICK_RESULTS if quick else RESULTS


def record(section: str, values: dict, summary: dict | None = None, path: Path | None = None) -> None:
    """Store ``values`` under ``sections[section]`` and ``summary`` keys at the top level of ``path`` (the benches'
    ``results.json``, :func:`results_path`'s for a quick run; a study that records the same way names its own
    file)."""
    path = results_path(values) if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("sections", {})[section] = values
    data.update(summary or {})
    data["machine"] = {"processor": platform.processor() or platform.machine(), "python": platform.python_version()}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
