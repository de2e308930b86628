"""Read-merge-write of ``bench/results.json``: every benchmark adds its own keys."""

from __future__ import annotations

import json
import platform
from pathlib import Path

RESULTS = Path(__file__).with_name("results.json")


def record(section: str, values: dict, summary: dict | None = None) -> None:
    """Store ``values`` under ``sections[section]`` and ``summary`` keys at the top level."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.setdefault("sections", {})[section] = values
    data.update(summary or {})
    data["machine"] = {"processor": platform.processor() or platform.machine(), "python": platform.python_version()}
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
