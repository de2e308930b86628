"""Streaming statistics: any batching equals one pass; merged shards equal one pass (docs/core.md, Streaming statistics)."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import satcore
from satcore._statistics.candidate import BATCHING_FIELDS, FIELDS


def one_pass(Q, Psi, variance=True):
    stats = satcore.CandidateStatistics(Q.shape[2], Psi.shape[2], Q.shape[1], variance)
    stats.update(Q, Psi)
    return stats


def reference_sums(Q, Psi):
    """Per-sample loop, explicit X_i = Q_i^T Psi_i: the independent reference."""
    X = [Q[i].T @ Psi[i] for i in range(Q.shape[0])]
    return {
        "sum_q_sq": sum(np.sum(Q[i] ** 2) for i in range(Q.shape[0])),
        "sum_cross": sum(X),
        "sum_gram": sum(Psi[i].T @ Psi[i] for i in range(Q.shape[0])),
        "sum_xi_sq": sum(np.sum(x * x) for x in X),
        "sum_xtx": sum(x.T @ x for x in X),
    }


def assert_stats_equal(a, b, rel=1e-12):
    for f in FIELDS:
        va, vb = getattr(a, f), getattr(b, f)
        if f in BATCHING_FIELDS or va is None or vb is None:
            # eq. (2)'s batch average and the folds depend on the batching; the folds add up to the totals
            assert (va is None) == (vb is None)
            continue
        np.testing.assert_allclose(va, vb, rtol=rel, atol=rel * (np.abs(vb).max() if np.size(vb) else 0))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_any_batching_equals_one_pass(seed, T, sizes):
    rng = np.random.default_rng(seed)
    M = sum(sizes)
    # Wide candidates (T (N + r) >= N r) and narrow ones take different sum_xi_sq paths.
    N, r = int(rng.integers(1, 6)), int(rng.integers(1, 7))
    Q = rng.standard_normal((M, T, N))
    Psi = rng.standard_normal((M, T, r))
    whole = one_pass(Q, Psi)
    ref = reference_sums(Q, Psi)
    for f, v in ref.items():
        np.testing.assert_allclose(getattr(whole, f), v, rtol=1e-12, atol=1e-12)
    streamed = satcore.CandidateStatistics(N, r, T, variance=True)
    start = 0
    for size in sizes:
        streamed.update(Q[start : start + size], Psi[start : start + size])
        start += size
    assert streamed.n_samples == M and streamed.n_batches == len(sizes)
    assert_stats_equal(streamed, whole)
    # Shards merged in any grouping equal one pass.
    cut = sizes[0]
    merged = one_pass(Q[:cut], Psi[:cut]).merge(one_pass(Q[cut:], Psi[cut:])) if cut < M else whole
    assert_stats_equal(merged, whole)
    assert merged.score("c").growth_value == pytest.approx(whole.score("c").growth_value, rel=1e-12)


def test_narrow_and_wide_xi_paths_agree():
    rng = np.random.default_rng(0)
    Q, Psi = rng.standard_normal((7, 5, 3)), rng.standard_normal((7, 5, 2))
    wide = satcore.batch_moments(Q, Psi, variance=True).sum_xi_sq
    narrow = satcore.batch_moments(Q[:, :1], Psi[:, :1], variance=False).sum_xi_sq
    assert wide == pytest.approx(reference_sums(Q, Psi)["sum_xi_sq"], rel=1e-13)
    assert narrow == pytest.approx(reference_sums(Q[:, :1], Psi[:, :1])["sum_xi_sq"], rel=1e-13)
    # T (N + r) < N r picks the T x T kernel route; with variance, its QR factor (min(N, T) rows per sample):
    Q2, P2 = rng.standard_normal((4, 2, 6)), rng.standard_normal((4, 2, 7))
    ref = reference_sums(Q2, P2)
    assert satcore.batch_moments(Q2, P2).sum_xi_sq == pytest.approx(ref["sum_xi_sq"], rel=1e-13)
    factored = satcore.batch_moments(Q2, P2, variance=True)
    assert factored.sum_xi_sq == pytest.approx(ref["sum_xi_sq"], rel=1e-13)
    np.testing.assert_allclose(factored.sum_xtx, ref["sum_xtx"], rtol=1e-12, atol=1e-12 * np.abs(ref["sum_xtx"]).max())
    np.testing.assert_array_equal(factored.sum_xtx, factored.sum_xtx.T)  # one symmetric product


def test_serialisation_round_trip_and_depth_merge():
    rng = np.random.default_rng(1)
    depth = satcore.DepthStatistics()
    other = satcore.DepthStatistics()
    for name, (N, r, T) in {"layer1.0": (3, 4, 2), "layer2.0/a": (2, 5, 1)}.items():
        Q, Psi = rng.standard_normal((12, T, N)), rng.standard_normal((12, T, r))
        depth[name] = one_pass(Q[:5], Psi[:5], variance=(T == 2))
        other[name] = one_pass(Q[5:], Psi[5:], variance=(T == 2))
    arrays = depth.to_arrays()
    back = satcore.DepthStatistics.from_arrays(arrays, list(depth))
    for name in depth:
        assert_stats_equal(back[name], depth[name], rel=0)
        assert back[name].variance == depth[name].variance
    merged = depth.merge(other)
    assert list(merged) == ["layer1.0", "layer2.0/a"]
    assert merged["layer1.0"].n_samples == 12
    with pytest.raises(ValueError, match="candidate lists differ"):
        depth.merge(satcore.DepthStatistics(reversed(list(other.items()))))


@pytest.mark.parametrize(
    "change, message",
    [
        (("n_samples", -1), "whole number"),
        (("n_samples", 2.7), "whole number"),
        (("n_samples", 1e300), "whole number"),
        (("n_positions", 1.5), "whole number"),
        (("n_positions", 0), "n_positions must be >= 1"),
        (("sum_q_sq", -2.0), "negative"),
        (("sum_batch_grad_norm", -1.0), "negative"),
        (("sum_gram", "asym"), "not symmetric"),
        (("sum_gram", "negdiag"), "negative diagonal"),
        (("sum_cross", np.zeros((3,))), "do not fit"),
        (("sum_cross", np.zeros((0, 2))), "do not fit|N >= 1"),
        (("n_positions", np.array([1, 2])), "scalar"),
        (("n_vectors", 2.5), "whole number"),
        (("n_vectors", -4), "whole number"),
        (("n_vectors", 0), "n_vectors is 0 but n_samples is 4"),
        (("sum_xi_sq", "shrink"), "negative variance"),
        (("sum_xtx", "trace"), "trace"),
    ],
)
def test_inconsistent_statistics_are_refused(change, message):
    rng = np.random.default_rng(2)
    arrays = one_pass(rng.standard_normal((4, 1, 3)), rng.standard_normal((4, 1, 2))).to_arrays()
    key, value = change
    edits = {
        "asym": lambda a: a + np.array([[0.0, 1.0], [0.0, 0.0]]),
        "negdiag": lambda a: a - 2 * np.diag(np.diag(a)),
        "shrink": lambda a: a * 1e-3,
        "trace": lambda a: a * 1.01,  # sum_xi_sq no longer its trace
    }
    arrays[key] = edits[value](np.asarray(arrays[key])) if isinstance(value, str) else value
    with pytest.raises(ValueError, match=message):
        satcore.CandidateStatistics.from_arrays(arrays)


@pytest.mark.parametrize("corruption", ["indefinite", "ag_too_small"])
def test_statistics_no_data_could_give_are_refused_when_scored(corruption):
    """A sum_gram with a clearly negative eigenvalue, or a sum_q_sq too small for the projection
    sum_cross and sum_gram imply (growth value > ag), cannot come from adding up samples."""
    rng = np.random.default_rng(3)
    stats = one_pass(rng.standard_normal((40, 2, 3)), rng.standard_normal((40, 2, 4)))
    if corruption == "indefinite":
        lam, U = np.linalg.eigh(stats.sum_gram)
        lam[0] = -0.5 * lam[-1]
        stats.sum_gram = (U * lam) @ U.T
        message = "not positive semi-definite"
    else:
        stats.sum_q_sq *= 1e-4
        message = "exceeds ag"
    with pytest.raises(ValueError, match=message):
        stats.score("x")


def test_merge_refuses_mismatched_shapes():
    a = satcore.CandidateStatistics(3, 4, 1)
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(satcore.CandidateStatistics(3, 5, 1))
    with pytest.raises(ValueError, match="expect"):
        a.update(np.ones((2, 1, 3)), np.ones((2, 1, 5)))


def test_float32_level_asymmetry_is_removed_and_dumps_validate():
    """Batch Grams summed in float32 are symmetric only to round-off; the totals come out exactly symmetric."""
    rng = np.random.default_rng(3)
    Q, Psi = rng.standard_normal((6, 4, 3)), rng.standard_normal((6, 4, 5))
    m = satcore.batch_moments(Q, Psi, variance=True)
    skewed = {}
    for key in ("sum_gram", "sum_xtx"):
        noise = rng.standard_normal(getattr(m, key).shape) * 1e-7 * np.abs(getattr(m, key)).max()
        skewed[key] = getattr(m, key) + noise
        assert not np.array_equal(skewed[key], skewed[key].T)
    stats = satcore.CandidateStatistics(3, 5, 4, variance=True).add_moments(dataclasses.replace(m, **skewed))
    np.testing.assert_array_equal(stats.sum_gram, stats.sum_gram.T)
    np.testing.assert_array_equal(stats.sum_xtx, stats.sum_xtx.T)
    back = satcore.CandidateStatistics.from_arrays(stats.to_arrays())
    np.testing.assert_allclose(back.sum_gram, m.sum_gram, rtol=0, atol=1e-6 * np.abs(m.sum_gram).max())


def two_lengths(repeat_a_row: bool):
    """Batches of T = 3 and T = 5 (2 and 3 samples: 21 position vectors) with r = 30 features,
    the last feature row a copy of the first when ``repeat_a_row``; and the stacked feature rows."""
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((M, T, 4)), rng.standard_normal((M, T, 30))) for M, T in ((2, 3), (3, 5))]
    if repeat_a_row:
        batches[1][1][-1, -1] = batches[0][1][0, 0]
    return batches, np.concatenate([psi.reshape(-1, 30) for _, psi in batches])


@pytest.mark.parametrize("repeat_a_row", [False, True])
def test_tangent_complete_counts_the_rows_of_batches_of_different_lengths(repeat_a_row):
    """The reference: the explicit projector ``P P^+`` on the 21 stacked rows is the identity exactly
    when the features span every sample-position row.  ``n_samples * n_positions`` (first T) is 15."""
    batches, rows = two_lengths(repeat_a_row)
    stats = satcore.CandidateStatistics(4, 30, 3, variance=True)
    for q, psi in batches:
        stats.update(q, psi)
    assert stats.n_vectors == rows.shape[0] == 21
    spans_every_row = np.allclose(rows @ np.linalg.pinv(rows), np.eye(21), atol=1e-8)
    assert spans_every_row == (not repeat_a_row)
    score = stats.score("x")
    assert score.tangent_complete == spans_every_row
    assert score.feature_rank == np.linalg.matrix_rank(rows)
    if spans_every_row:  # Thm 2 item 4
        assert score.growth_value == pytest.approx(score.ag, rel=1e-10)
    else:
        assert score.growth_value < score.ag * (1 - 1e-3)


def test_n_vectors_survives_serialisation_merge_and_dumps(tmp_path):
    batches, _ = two_lengths(False)
    stats = satcore.CandidateStatistics(4, 30, 3)
    for q, psi in batches:
        stats.update(q, psi)
    back = satcore.CandidateStatistics.from_arrays(stats.to_arrays())
    assert back.n_vectors == 21 and back.score().tangent_complete
    more = satcore.CandidateStatistics(4, 30, 3).update(*(a[:, :3] for a in batches[1]))  # 3 samples of T = 3
    assert stats.merge(more).n_vectors == 21 + 9
    satcore.write_dump(tmp_path / "stats.npz", satcore.DepthStatistics(x=stats))
    read = satcore.read_dump(tmp_path / "stats.npz").statistics()["x"]
    assert read.n_vectors == 21 and read.score("x").tangent_complete
    q, psi = batches[1]
    satcore.write_dump(tmp_path / "raw.npz", raw={"x": (q, psi)})
    assert satcore.read_dump(tmp_path / "raw.npz").statistics(chunk_samples=2)["x"].n_vectors == 3 * 5


def test_a_dump_written_before_n_vectors_scores_with_n_samples_times_n_positions(tmp_path):
    """4 samples of T = 2 and r = 10: rank 8 == n_samples * n_positions, the only count such a dump gives."""
    rng = np.random.default_rng(6)
    stats = one_pass(rng.standard_normal((4, 2, 3)), rng.standard_normal((4, 2, 10)))
    members = {f"stats/x/{f}": v for f, v in stats.to_arrays().items() if f != "n_vectors"}
    np.savez(tmp_path / "old.npz", satcore_schema=np.array("satcore-dump/1"),
             meta=np.array(json.dumps({"candidates": ["x"]})), **members)
    old = satcore.read_dump(tmp_path / "old.npz").statistics()["x"]
    assert old.n_vectors is None
    assert old.score("x").feature_rank == 8 and old.score("x").tangent_complete
    merged = old.merge(stats)
    assert merged.n_vectors is None and "n_vectors" not in merged.to_arrays()
    assert merged.n_samples == 8
