"""Read-merge-write of ``bench/results.json``: every benchmark adds its own keys."""

from __future__ import annotations

import json
import platform
from pathlib import Path

RESULTS = Path(__file__).with_name("results.json")


def record(section: str, values: dict, summary: dict | None = None, path: Path = RESULTS) -> None:
    """Store ``values`` under ``sections[section]`` and ``summary`` keys at the top level of ``path`` (the benches'
    ``results.json``; a study that records the same way names its own file)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("sections", {})[section] = values
    data.update(summary or {})
    data["machine"] = {"processor": platform.processor() or platform.machine(), "python": platform.python_version()}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
