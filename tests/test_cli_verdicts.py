"""`satcore score` prints the fold tests' verdicts: JSON names, loss-unit tolerances, old dumps."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

import satcore
from satcore.cli.main import main


def _stats(rng, shift, n_folds=16, M=160):
    s = satcore.CandidateStatistics(3, 5, n_folds=n_folds)
    for b in range(16):
        psi = rng.standard_normal((M // 16, 5))
        s.update(rng.standard_normal((M // 16, 3)) + shift * psi[:, :3], psi)
    return s


def _dump(tmp_path, shifts, *, n_folds=16, diagnostics=None):
    rng = np.random.default_rng(0)
    depth = satcore.DepthStatistics({f"block{i}": _stats(rng, s, n_folds) for i, s in enumerate(shifts)})
    meta = {"split": "heldout"}
    if diagnostics:
        meta["diagnostics"] = {name: {"stream_rms": v} for name, v in diagnostics.items()}
    path = tmp_path / "d.npz"
    satcore.write_dump(path, depth, meta=meta)
    return path, depth


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_json_carries_the_tests_and_matches_the_python_report(tmp_path):
    path, depth = _dump(tmp_path, [0.0, 0.6])
    result = invoke("score", path, "--json", "--alpha", 0.01)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    expected = depth.report(split="heldout", alpha=0.01)
    assert out["verdict"]["verdict"] == expected.verdict.verdict == "improvable"
    assert out["verdict"]["best_candidate"] == out["best_candidate"] == "block1" and out["verdict"]["alpha"] == 0.01
    for cand, test in zip(out["candidates"], expected.tests):
        assert cand["test"]["p_value_adjusted"] == pytest.approx(test.p_value_adjusted)
        assert cand["test"]["growth_value_sq_unbiased"] == pytest.approx(test.growth_value_sq_unbiased)


def test_loss_unit_tolerance_uses_the_recorded_stream_rms(tmp_path):
    path, depth = _dump(tmp_path, [0.0, 0.6], diagnostics={"block0": 2.0, "block1": 4.0})
    out = json.loads(invoke("score", path, "--json", "--tolerance", 1e-3, "--rho", 0.01).output)
    for cand, rms in zip(out["candidates"], (2.0, 4.0)):
        assert cand["test"]["tolerance"] == pytest.approx(1e-3 / (0.01 * rms))
        gain = cand["test"]["predicted_gain"]
        assert gain["value"] == pytest.approx(0.01 * rms * math.sqrt(max(0, cand["test"]["growth_value_sq_unbiased"])))
    text = invoke("score", path, "--tolerance", 1e-3, "--rho", 0.01).output
    assert "predicted first-order gain at block1 (rho 0.01)" in text


def test_loss_unit_tolerance_without_stream_rms_is_one_line_exit_2(tmp_path):
    path, _ = _dump(tmp_path, [0.3])
    result = invoke("score", path, "--tolerance", 1e-3, "--rho", 0.01)
    assert result.exit_code == 2 and "stream RMS" in result.output and "Traceback" not in result.output


def test_dump_without_folds_scores_inconclusive_with_a_reason(tmp_path):
    path, _ = _dump(tmp_path, [1.0], n_folds=0)
    result = invoke("score", path)
    assert result.exit_code == 0
    assert "verdict: INCONCLUSIVE" in result.output and "keep no folds" in result.output


def test_a_large_tolerance_certifies_saturation(tmp_path):
    path, _ = _dump(tmp_path, [0.0, 0.0])
    out = json.loads(invoke("score", path, "--json", "--tolerance", 10.0).output)
    assert out["verdict"]["verdict"] == "saturated"
    assert all(c["test"]["verdict"] == "saturated" for c in out["candidates"])


def test_sweep_depth_counts_blocks_and_low_signal_comes_from_the_tests(tmp_path):
    """Without model_depth a dump's depth is its residual blocks (the head endpoint is no block);
    a plateau whose depths are improvable is not called low signal."""
    rng = np.random.default_rng(3)
    paths = []
    for blocks, shift in ((2, 0.6), (4, 0.6)):
        names = [f"block{i}" for i in range(blocks)] + ["head"]
        depth = satcore.DepthStatistics({n: _stats(rng, shift) for n in names})
        paths.append(tmp_path / f"d{blocks}.npz")
        satcore.write_dump(paths[-1], depth, meta={"split": "heldout"})
    out = json.loads(invoke("sweep", *paths, "--json", "--rel-tol", 10).output)
    assert [p["depth"] for p in out["points"]] == [2, 4]
    assert all(p["verdict"] == "improvable" for p in out["points"])
    assert out["plateau"] is not None and out["plateau"]["low_signal"] is False


@pytest.mark.parametrize("k, alpha", [(1, 0.05), (3, 0.05), (7, 0.05), (24, 0.01), (2, 0.5)])
def test_fewest_batches_to_reject_is_where_the_fold_test_first_can(k, alpha):
    """``fewest_batches_to_reject(k, alpha)`` (what the callbacks warn with when training starts) is the smallest
    number of one-batch folds whose smallest sign-flip p-value ``2^-(m-1)`` is below Holm's ``alpha / k``, and on
    candidates with a strong signal the real report is improvable at that many batches and cannot be at one fewer."""
    from satcore.adapter_api import fewest_batches_to_reject

    needed = fewest_batches_to_reject(k, alpha)
    assert needed == next(m for m in range(1, 64) if 2.0 ** -(m - 1) < alpha / k)
    for batches, improvable in ((needed, True), (needed - 1, False)):
        if batches > 16 or batches < 2:
            continue
        rng = np.random.default_rng(0)
        depth = {}
        for i in range(k):
            s = satcore.CandidateStatistics(3, 5)
            for _ in range(batches):
                psi = rng.standard_normal((8, 5))
                s.update(rng.standard_normal((8, 3)) * 0.01 + 3.0 * psi[:, :3], psi)
            depth[f"block{i}"] = s
        report = satcore.DepthStatistics(depth).report(alpha=alpha)
        assert (report.verdict.verdict == "improvable") == improvable, (batches, report.verdict)
        if not improvable:
            assert f"probe at least {needed} batches" in report.verdict.reason
