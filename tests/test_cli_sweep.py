"""Depth sweeps: the plateau rule, the growth-value noise floor, and ``satcore sweep``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import satcore
from satcore.cli.main import main
from satcore._decisions.sweep import depth_sweep, find_plateau, growth_noise_floor, sweep_point


@pytest.mark.parametrize(
    "values, floors, expected",
    [
        ([1.0, 0.5, 0.25, 0.13, 0.12, 0.11, 0.115], [0] * 7, (3, False)),  # 0.13 <= 1.25 * 0.11
        ([1.0, 0.5, 0.25, 0.125], [0] * 4, None),  # still halving
        ([1.0, 0.5, 0.3, 0.2], [0, 0, 0.05, 0.11], (2, False)),  # 0.3 <= 1.25*0.2 + 0.05
        ([1.0, 0.5, 0.3, 0.2], [0, 0, 0.04, 0.11], None),  # 0.3 > 1.25*0.2 + 0.04
        ([0.9, 0.1, 0.12, 0.1], [0.1, 0.08, 0.07, 0.06], (1, True)),  # every tail value <= 2 x floor
        ([0.9, 0.1, 0.12, 0.13], [0.1, 0.08, 0.07, 0.06], (1, False)),  # 0.13 > 2 x 0.06
        ([3.0, 3.0], [0, 0], (0, False)),
    ],
)
def test_find_plateau_rule(values, floors, expected):
    assert find_plateau(values, floors) == expected


def test_growth_noise_floor_is_the_expected_excess_monte_carlo():
    """With g_pop = 0 (Q independent of Psi), E V_hat^2 = f^2: the noise floor is the noise."""
    rng = np.random.default_rng(4)
    M, N, r, reps = 200, 3, 4, 300
    v_sq, f_sq = [], []
    for _ in range(reps):
        psi = rng.standard_normal((M, r))
        q = rng.standard_normal((M, N)) * (1 + psi[:, :1] ** 2)  # heteroscedastic but uncorrelated
        s = satcore.score(q, psi)
        v_sq.append(s.growth_value**2)
        f_sq.append(growth_noise_floor(s) ** 2)
    v_sq, f_sq = np.array(v_sq), np.array(f_sq)
    stderr = v_sq.std() / np.sqrt(reps)
    assert abs(v_sq.mean() - f_sq.mean()) < 4 * stderr
    no_variance = satcore.CandidateStatistics.from_samples(q, psi, variance=False)
    assert growth_noise_floor(no_variance.score()) > 0  # from the folds
    assert growth_noise_floor(satcore.CandidateStatistics.from_samples(q, psi, variance=False, n_folds=0).score()) is None


def sweep_dumps(tmp_path, signal=(1.0, 0.3, 0.0, 0.0, 0.0), seed=0):
    """One dump per model depth 2, 4, ...; candidate signal strength falls with depth, then only noise."""
    rng = np.random.default_rng(seed)
    M, N, r = 400, 3, 4
    paths, values = [], []
    for i, s in enumerate(signal):
        depth = 2 * (i + 1)
        raw = {}
        for b in range(depth):
            psi = rng.standard_normal((M, r))
            raw[f"block.{b}"] = (s * psi @ rng.standard_normal((r, N)) + rng.standard_normal((M, N)), psi)
        path = tmp_path / f"depth{depth}.npz"
        satcore.write_dump(path, raw=raw, meta={"split": "val"})
        paths.append(path)
        values.append(max(satcore.growth_value(q, p) for q, p in raw.values()))
    return paths, values


def test_sweep_json_and_plateau(tmp_path):
    paths, values = sweep_dumps(tmp_path)
    result = CliRunner().invoke(main, ["sweep", "--json", *map(str, reversed(paths))])  # order is by depth
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["schema"] == "satcore-sweep/2"
    assert [p["depth"] for p in out["points"]] == [2, 4, 6, 8, 10]
    assert [p["growth_value_max"] for p in out["points"]] == pytest.approx(values, rel=1e-12)
    assert out["plateau"] == {"start_index": 2, "start_depth": 6, "low_signal": True}
    for p in out["points"][2:]:
        assert p["growth_value_max"] <= 2 * p["growth_noise_floor"]
    assert out["points"][0]["growth_value_max"] > 5 * out["points"][0]["growth_noise_floor"]


def test_sweep_table_plot_and_model_depth(tmp_path):
    pytest.importorskip("matplotlib")  # the plot extra
    paths, _ = sweep_dumps(tmp_path, signal=(2.0, 0.5, 0.1))
    png = tmp_path / "sweep.png"
    result = CliRunner().invoke(main, ["sweep", *map(str, paths), "--plot", str(png), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "plateau: none" in result.stdout
    # first a line saying the statistics make no stop decision; the verdict column keeps its name
    assert result.stdout.splitlines()[0].startswith("depth decision: none from statistics alone")
    assert result.stdout.splitlines()[1].split()[-1] == "first-order"
    assert png.read_bytes()[:4] == b"\x89PNG"
    # model_depth from meta overrides the candidate count
    q, psi = np.ones((3, 2)), np.ones((3, 1))
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    satcore.write_dump(a, raw={"x": (q, psi)}, meta={"model_depth": 50})
    satcore.write_dump(b, raw={"x": (q, psi)}, meta={"model_depth": 50})
    bad = CliRunner().invoke(main, ["sweep", str(a), str(b)])
    assert bad.exit_code == 2 and "two dumps have depth 50" in bad.stderr and len(bad.stderr.splitlines()) == 1
    one = CliRunner().invoke(main, ["sweep", str(paths[0])])
    assert one.exit_code == 0 and "plateau: not assessed (needs at least 2 depths, got 1)" in one.stdout


def test_depth_sweep_ag_metric_has_no_noise_floor():
    report = satcore.DepthStatistics(
        x=satcore.CandidateStatistics.from_samples(np.eye(4)[:, :2] + 1, np.ones((4, 1)))
    ).report()
    points = [sweep_point(d, f"m{d}", report) for d in (3, 1, 2)]
    sweep = depth_sweep(points, metric="ag")
    assert [p.depth for p in sweep.points] == [1, 2, 3]
    assert sweep.plateau.start_index == 0 and sweep.plateau.low_signal is False


def test_sweep_refuses_dumps_of_unrelated_models(tmp_path):
    """Dumps of different architectures or probes made a 'plateau' before; now one line, exit 2, naming both
    files and what differs. Dumps of one architecture at two depths (more candidates, same patterns) pass."""
    rng = np.random.default_rng(0)

    def dump(name, names, width=3, r=4, **meta):
        raw = {n: (rng.standard_normal((64, width)), rng.standard_normal((64, r))) for n in names}
        path = tmp_path / name
        satcore.write_dump(path, raw=raw, meta={"split": "val", **meta})
        return str(path)

    shallow = dump("shallow.npz", ["h.0", "h.1"], framework="torch", loss="sequence_loss")
    deep = dump("deep.npz", ["h.0", "h.1", "h.2", "h.3"], framework="torch", loss="sequence_loss")
    ok = CliRunner().invoke(main, ["sweep", shallow, deep])
    assert ok.exit_code == 0, ok.output
    cases = {
        dump("resnet.npz", ["layer1.0", "layer1.1", "layer2.0"]): "their candidate name patterns differ "
                                                                   "([\"layer#.#\"] vs [\"h.#\"])",
        dump("wide.npz", ["h.0", "h.1", "h.2"], width=5): "their stream widths differ ([5] vs [3])",
        dump("r8.npz", ["h.0", "h.1", "h.2"], r=8): "their feature counts differ ([8] vs [4])",
        dump("onnx.npz", ["h.0", "h.1", "h.2"], framework="onnx"): "their framework differ (onnx vs torch)",
        dump("train.npz", ["h.0", "h.1", "h.2"], split="train"): "their split differ (train vs val)",
    }
    for other, differs in cases.items():
        bad = CliRunner().invoke(main, ["sweep", shallow, deep, other])
        assert bad.exit_code == 2, bad.output
        assert bad.stderr.splitlines() == [
            f"satcore: error: {other} and {shallow} are not one model at two depths: {differs}; a depth "
            "sweep compares one architecture, probed the same way, at several depths"]
