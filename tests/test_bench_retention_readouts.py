"""studies/retention_readouts.py: its readouts' arithmetic against hand-computed values and independent references,
and its table against the lab notes (the recorded trials and the probe recording re-render it)."""

from pathlib import Path

import numpy as np
import pytest

from satcore._decisions.frontier import extrapolation_weights
from studies import retention_readouts as study

ROOT = Path(__file__).resolve().parent.parent


def test_the_log2_line_is_the_frontiers_extrapolation():
    """The study's own least squares on ``[1, log2 t]`` reads what the frontier's pseudo-inverse weights read."""
    checkpoints, curve = (2, 4, 9), [0.0062, 0.0449, 0.1126]
    assert study._ls(curve, checkpoints, 400) == pytest.approx(float(extrapolation_weights(checkpoints, 400) @ curve),
                                                              abs=1e-14)
    # a straight line in log2 t, -0.1 per doubling from 0 at t = 1: at t = 64, -0.6
    assert study._ls([-0.1, -0.2, -0.3], (2, 4, 8), 64) == pytest.approx(-0.6, abs=1e-14)


def test_the_ratio_weighted_progress_is_the_integral_of_the_ratio_along_the_target_line():
    """``g(T) + int r dh`` with ``h = -0.01 x``, ``r = 1 - 0.1 x`` (``x = log2 t``) from ``T = 8`` to ``S = 64``: by
    hand ``-0.01 [3 - 0.1 (36 - 9) / 2] = -0.0165``; by the trapezoid rule on a fine grid, the same."""
    x = np.log2([2.0, 4.0, 8.0])
    point = {"checkpoints": [2, 4, 8], "S": 64, "h": -0.01 * x, "g": np.array([-0.005, -0.01, -0.02])}
    got = study._integral(point, 1 - 0.1 * x)
    grid = np.linspace(3.0, 6.0, 100_001)
    assert got == pytest.approx(-0.02 - 0.0165, abs=1e-12)
    assert got == pytest.approx(-0.02 + np.trapezoid((1 - 0.1 * grid) * -0.01, grid), abs=1e-10)


def test_the_recordings_re_render_the_lab_notes_readout_table():
    """Every column but the bootstrap's (``draws = 0``: not drawn) of the notes' table is what the study prints from
    the recorded trials and the probe recording; the shipped readout recomputed from the curves is the recorded one."""
    points = study.recorded_points()
    assert len(points["400"]) == 27 and len(points["2000"]) == 9
    probed = study.attach_probe(points["400"], study.PROBE) and study.attach_probe(points["2000"], study.PROBE)
    assert probed
    rows = [line for line in study.evaluate(points, probed, draws=0) if line.startswith("| ")]
    notes = [line for line in (ROOT / "studies" / "expansion-budget-notes.md").read_text().splitlines()
             if line.startswith("| ")]

    def without_bootstrap(line):
        cells = line.split(" | ")
        return cells[:2] + cells[3:]

    recorded = {tuple(without_bootstrap(line)) for line in notes}
    assert len(rows) == 19  # the header and 18 readouts (the separator starts "|-")
    assert [line for line in rows[1:] if tuple(without_bootstrap(line)) not in recorded] == []
    assert rows[1].split(" | ")[1:] == rows[2].split(" | ")[1:]


def test_the_shipped_readout_on_the_controls_and_the_main_protocol_is_the_benchs_criterion():
    """The study's shipped row scores the controls and the main protocol's must-show points as the bench does: the
    controls' pooled criterion of ``render_control`` and ``general_criterion`` on the main protocol's satcore-carry
    frontier (two code paths: the study's own points, noise cells and scoring); its table is the lab notes'."""
    from studies import expansion_budget as bench

    controls, main = study.control_points(), study.main_points()
    assert len(controls) == 50 and len(main) == 135
    row = study.evaluate_controls(study.recorded_points(), controls, main)[2].split(" | ")
    assert row[0] == "| shipped: least squares in log2 t, read at log2 S"
    _, _, base, runs = bench._load(bench.main_protocol_files(study.RESULTS))
    points = [bench._general_point((pair, entry["blocks"]), entry["predicted_general_change"], windows)
              for pair, arms in runs.items()
              for _, entry, _, windows in bench._frontier_cases(pair, arms, base[pair], arms["satcore-carry"])]
    assert f"Spearman {row[6]} over 135 points (needs >= 0.6); sign right {row[7][:-2]} above" \
        in bench.general_criterion(points)
    results = study.RESULTS
    settings = [[results / f"expansion_budget_{n}.jsonl" for n in names] for _, names in study.CONTROLS]
    pooled = bench.render_control(settings, "uniform-1").splitlines()
    assert f"Spearman {row[1]} over 50 points (needs >= 0.6); sign right {row[2]} above" in \
        next(line for line in pooled if line.startswith("* all 3 controls"))
    notes = (ROOT / "studies" / "expansion-budget-notes.md").read_text()
    table = [line for line in study.evaluate_controls(study.recorded_points(), controls, main) if line.startswith("| ")]
    assert len(table) == 15 and [line for line in table if line not in notes] == []  # header, 14 readouts
