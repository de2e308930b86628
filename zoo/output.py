"""Tables (markdown + JSON) and PNG plots, and where they go.

Full runs write their tables and figures to ``studies/results/`` (committed;
``studies/paper-experiments.md`` copies the tables from there); quick runs write the same
files under ``examples/out/quick/results`` (git-ignored) for the smoke test.
Bulky work files (checkpoints, dumps) always go under ``examples/out/<mode>/``.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def out_dir(name: str, quick: bool) -> Path:
    """Work files (checkpoints, dumps): ``examples/out/<mode>/<name>``."""
    path = EXAMPLES / "out" / ("quick" if quick else "full") / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir(quick: bool) -> Path:
    """Tables and figures: ``studies/results`` (full) or ``examples/out/quick/results`` (quick)."""
    path = ROOT / "studies" / "results" if not quick else EXAMPLES / "out" / "quick" / "results"
    path.mkdir(parents=True, exist_ok=True)
    return path


def versions() -> dict:
    import numpy
    import torch

    import satcore

    out = {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
           "satcore": satcore.__version__, "threads": torch.get_num_threads()}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    return out


def fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == 0:
            return "0"
        return f"{v:.4g}" if 1e-3 <= abs(v) < 1e4 else f"{v:.3e}"
    return "" if v is None else str(v)


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """``columns``: ``(key, header)`` pairs."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731  (a bare | would end the cell)
    head = "| " + " | ".join(cell(h) for _, h in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cell(fmt(r.get(k))) for k, _ in columns) + " |" for r in rows]
    return "\n".join([head, sep] + body)


def write_results(directory: Path, stem: str, rows: list[dict], columns, *, meta: dict, notes: list[str] = ()):
    """``<stem>.md`` (notes + table) and ``<stem>.json`` (meta + rows) in ``directory``."""
    meta = {**meta, "versions": versions(), "written": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:])}
    text = markdown_table(rows, columns)
    if notes:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes)
    (directory / f"{stem}.md").write_text(text + "\n")
    (directory / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=_json))
    print(text)
    print(f"wrote {directory / stem}.md/.json")


def _json(x):
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def figure(n: int = 1, width: float = 5.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(width * n, 3.8))
    return fig, ([axes] if n == 1 else list(axes))


def save_figure(fig, path: Path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(f"wrote {path}")


def log_if_spread(ax, values):
    """Log y scale when positive values span more than a decade."""
    positive = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if positive and max(positive) / min(positive) > 10:
        ax.set_yscale("log")
