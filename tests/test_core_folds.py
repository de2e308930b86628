"""The fold test of H0: g = 0 (satcore._formulas.folds) and the three-way verdicts (satcore._decisions.verdicts).

Problem settings -> cases -> independent references: brute-force sign enumeration and explicit
per-sample parameter gradients with an explicit pseudo-inverse; Monte Carlo for unbiasedness, size
and power (rejection rates, not arguments).
"""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest

import satcore
from satcore._formulas.folds import fold_gram, fold_test, holm, sign_flip_p_value, unbiased_square
from satcore._decisions.verdicts import decide


def per_sample_xi(Q, Psi):
    return np.einsum("mtn,mtr->mnr", Q, Psi)


def stats_in_batches(Q, Psi, sizes, n_folds=16):
    s = satcore.CandidateStatistics(Q.shape[2], Psi.shape[2], Q.shape[1], n_folds=n_folds)
    start = 0
    for size in sizes:
        s.update(Q[start : start + size], Psi[start : start + size])
        start += size
    return s


# -- exact pieces against independent references ------------------------------------------------

def test_fold_sums_are_the_per_sample_gradients_of_each_fold():
    rng = np.random.default_rng(0)
    Q, Psi = rng.standard_normal((37, 3, 4)), rng.standard_normal((37, 3, 5))
    sizes = [5, 3, 7, 2, 9, 4, 7]
    s = stats_in_batches(Q, Psi, sizes, n_folds=3)
    xi = per_sample_xi(Q, Psi)
    bounds = np.cumsum([0] + sizes)
    for a in range(3):
        rows = np.concatenate([np.arange(bounds[b], bounds[b + 1]) for b in range(len(sizes)) if b % 3 == a])
        np.testing.assert_allclose(s.fold_cross[a], xi[rows].sum(axis=0), rtol=1e-12, atol=1e-12)
        assert s.fold_samples[a] == rows.size


def test_unbiased_square_and_p_value_against_brute_force():
    """U from the explicit K^+ metric and p from enumerating every sign pattern by hand."""
    rng = np.random.default_rng(1)
    M, m = 48, 6
    Q, Psi = rng.standard_normal((M, 2, 3)) + 0.2, rng.standard_normal((M, 2, 4))
    sizes = [10, 6, 8, 9, 7, 8]  # unequal folds
    s = stats_in_batches(Q, Psi, sizes, n_folds=m)
    score = s.score("c")
    K_pinv = np.linalg.pinv(s.sum_gram / M)
    xi = per_sample_xi(Q, Psi)
    bounds = np.cumsum([0] + sizes)
    means = [xi[bounds[a] : bounds[a + 1]].mean(axis=0) for a in range(m)]
    G = np.array([[np.trace(ga @ K_pinv @ gb.T) for gb in means] for ga in means])
    w = np.array(sizes) / M
    U = sum(w[a] * w[b] * G[a, b] for a in range(m) for b in range(m) if a != b) / (1 - np.sum(w**2))
    assert score.fold_test.unbiased == pytest.approx(U, rel=1e-10)
    # V_hat^2 is the full quadratic form of the fold means (diagonal included)
    assert score.growth_value**2 == pytest.approx(w @ G @ w, rel=1e-10)

    def T(eps):
        return sum(eps[a] * eps[b] * w[a] * w[b] * G[a, b] for a in range(m) for b in range(m) if a != b)

    observed = T([1] * m)
    patterns = [(1,) + rest for rest in itertools.product((1, -1), repeat=m - 1)]
    p_ref = sum(T(e) >= observed - 1e-12 for e in patterns) / len(patterns)
    assert score.fold_test.p_value == pytest.approx(p_ref, abs=1e-15)
    # the Euclidean metric: the fold Gram of plain fold means
    GE = np.array([[np.sum(ga * gb) for gb in means] for ga in means])
    UE = (w @ GE @ w - np.sum(w**2 * np.diag(GE))) / (1 - np.sum(w**2))
    assert score.fold_test_euclidean.unbiased == pytest.approx(UE, rel=1e-10)


def test_jackknife_is_the_delete_one_fold_formula():
    rng = np.random.default_rng(2)
    m = 7
    sums, counts = rng.standard_normal((m, 2, 3)) * 5 + 1, rng.integers(3, 9, size=m)
    G, w = fold_gram(sums, counts)
    loo = []
    for a in range(m):
        keep = [b for b in range(m) if b != a]
        Gk, wk = G[np.ix_(keep, keep)], w[keep] / w[keep].sum()
        loo.append(unbiased_square(Gk, wk))
    loo = np.array(loo)
    se = math.sqrt((m - 1) / m * np.sum((loo - loo.mean()) ** 2))
    assert fold_test(sums, counts).se == pytest.approx(se, rel=1e-12)


def test_sampled_patterns_agree_with_enumeration_above_the_exact_limit():
    rng = np.random.default_rng(3)
    G_small = rng.standard_normal((12, 12))
    G_small = G_small @ G_small.T
    w = np.full(12, 1 / 12)
    exact, is_exact = sign_flip_p_value(G_small, w)
    assert is_exact
    m = 24
    X = rng.standard_normal((m, 5)) + 0.15
    G, w = X @ X.T, np.full(m, 1 / m)
    p, is_exact = sign_flip_p_value(G, w, seed=1)
    assert not is_exact
    # Monte Carlo standard error of a sampled p-value at 2^15 patterns
    A = G * np.outer(w, w)
    np.fill_diagonal(A, 0)
    eps = np.random.default_rng(9).choice((-1.0, 1.0), size=(200_000, m))
    ref = np.mean(np.einsum("pa,ab,pb->p", eps, A, eps) >= A.sum() - 1e-12)
    assert abs(p - ref) < 4 * math.sqrt(ref * (1 - ref) / 2**15) + 1e-4


def test_holm_against_the_step_down_definition():
    rng = np.random.default_rng(4)
    for _ in range(20):
        p = rng.uniform(size=int(rng.integers(1, 9))) ** 3
        k = p.size
        order = np.argsort(p)
        ref = np.empty(k)
        running = 0.0
        for j, i in enumerate(order):
            running = max(running, min(1.0, (k - j) * p[i]))
            ref[i] = running
        np.testing.assert_allclose(holm(p), ref)


def test_merged_shards_hold_one_pass_folds_and_p_values():
    """Shards merged in order equal one pass over their batches: folds, p-values, intervals."""
    rng = np.random.default_rng(5)
    Q, Psi = rng.standard_normal((90, 2, 3)) + 0.05, rng.standard_normal((90, 2, 4))
    sizes = [6] * 15
    whole = stats_in_batches(Q, Psi, sizes)
    parts = [stats_in_batches(Q[a:b], Psi[a:b], [6] * ((b - a) // 6)) for a, b in ((0, 36), (36, 54), (54, 90))]
    merged = parts[0] + parts[1] + parts[2]
    np.testing.assert_allclose(merged.fold_cross, whole.fold_cross, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(merged.fold_samples, whole.fold_samples)
    a, b = merged.score().fold_test, whole.score().fold_test
    assert a.p_value == b.p_value and a.unbiased == pytest.approx(b.unbiased, rel=1e-10)
    assert a.se == pytest.approx(b.se, rel=1e-9)


def test_folds_round_trip_through_a_dump_and_bad_folds_are_refused(tmp_path):
    rng = np.random.default_rng(6)
    s = stats_in_batches(rng.standard_normal((40, 1, 3)), rng.standard_normal((40, 1, 2)), [5] * 8)
    depth = satcore.DepthStatistics({"b": s})
    path = tmp_path / "d.npz"
    satcore.write_dump(path, depth)
    back = satcore.read_dump(path).statistics()["b"]
    np.testing.assert_array_equal(back.fold_cross, s.fold_cross)
    assert back.n_folds == 16 and back.score().fold_test.p_value == s.score().fold_test.p_value
    arrays = s.to_arrays()
    for field, bad, message in [
        ("fold_samples", arrays["fold_samples"] + 1, "add up to"),
        ("fold_cross", arrays["fold_cross"] * 2, "does not add up"),
        ("fold_cross", arrays["fold_cross"][:3], "do not fit"),
    ]:
        with pytest.raises(ValueError, match=message):
            satcore.CandidateStatistics.from_arrays({**arrays, field: bad})
    del arrays["fold_cross"]
    with pytest.raises(ValueError, match="all or none"):
        satcore.CandidateStatistics.from_arrays(arrays)


# -- calibration: size and power by Monte Carlo --------------------------------------------------

def _null_q(rng, psi, kind):
    M, T, _ = psi.shape
    N = 4
    if kind == "gaussian":
        return rng.standard_normal((M, T, N))
    if kind == "heavy":  # Student t, 2.5 degrees of freedom: finite variance, heavy tails
        return rng.standard_t(2.5, size=(M, T, N))
    if kind == "low_rank":  # one direction only, scale tied to the features (heteroscedastic)
        return rng.standard_normal((M, T, 1)) * (1 + np.abs(psi[..., :1])) * np.ones((1, 1, N))
    raise AssertionError(kind)


@pytest.mark.slow  # Monte Carlo of the sign-flip test over 32768 patterns: 3-4 s per case on an idle core
@pytest.mark.parametrize("kind, r, uneven", [
    ("gaussian", 6, False),
    ("heavy", 6, True),
    ("low_rank", 6, False),
    ("gaussian", 40, True),  # high effective dimension: N r = 160 parameters, 96 samples
])
def test_rejection_rate_under_h0_is_at_most_alpha(kind, r, uneven):
    rng = np.random.default_rng(zlib.crc32(f"{kind}-{r}-{uneven}".encode()))
    alpha, reps, M = 0.05, 300, 96
    sizes = list(rng.multinomial(M - 16, np.ones(16) / 16) + 1) if uneven else [M // 16] * 16
    rejected = 0
    for _ in range(reps):
        psi = rng.standard_normal((M, 2, r))
        q = _null_q(rng, psi, kind)
        rejected += stats_in_batches(q, psi, sizes).score().fold_test.p_value < alpha
    mc = math.sqrt(alpha * (1 - alpha) / reps)
    assert rejected / reps <= alpha + 3 * mc


def test_power_beside_proposition_1_at_the_same_n_and_level():
    """A signal the fold test finds nearly always; Proposition 1's interval almost never excludes 0."""
    rng = np.random.default_rng(11)
    alpha, reps, M, N, r = 0.05, 100, 128, 4, 6
    fold_hits = prop1_hits = 0
    for _ in range(reps):
        psi = rng.standard_normal((M, 1, r))
        q = rng.standard_normal((M, 1, N)) + 0.35 * psi[..., :N]  # E[q | psi] = 0.35 psi: g != 0
        s = stats_in_batches(q, psi, [8] * 16)
        score = s.score("c")
        fold_hits += score.fold_test.p_value < alpha
        test = satcore.saturation_test(["c"], [score.cross_gradient_norm], [score.sigma_sq], [M], error=alpha)
        prop1_hits += test.verdict == "improvable"
    assert fold_hits / reps >= 0.9
    assert prop1_hits / reps <= 0.2


def test_real_gradients_with_signs_flipped_are_a_calibrated_null():
    """Per-sample (q, psi) of a real ResNet on scikit-learn digits; flipping each sample's q by a random
    sign makes H0 exact (E[q | psi] = 0) whatever the distribution."""
    torch = pytest.importorskip("torch")
    from zoo import models_torch as mt

    torch.manual_seed(0)
    model = mt.DigitsResNet().double().eval()
    x, y = mt.digits_batches(160, 1, dtype=torch.float64)[0]
    z = {}

    def keep(_module, inputs):
        inputs[0].retain_grad()
        z["z"] = inputs[0]

    handle = model.layer2[0].register_forward_pre_hook(keep)
    loss = mt.per_sample_ce(model(x), y).sum()
    loss.backward()
    handle.remove()
    zz = z["z"].detach()
    Q = z["z"].grad.permute(0, 2, 3, 1).reshape(zz.shape[0], -1, zz.shape[1]).numpy()
    Psi = zz.permute(0, 2, 3, 1).reshape(zz.shape[0], -1, zz.shape[1]).numpy()  # the linear family psi = z
    sizes = [10] * 16
    real = stats_in_batches(Q, Psi, sizes).score().fold_test
    assert real.p_value < 0.01  # an untrained network: depth helps
    rng = np.random.default_rng(12)
    alpha, reps, rejected = 0.05, 200, 0
    for _ in range(reps):
        signs = rng.choice((-1.0, 1.0), size=(Q.shape[0], 1, 1))
        rejected += stats_in_batches(Q * signs, Psi, sizes).score().fold_test.p_value < alpha
    assert rejected / reps <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)


# -- verdicts -----------------------------------------------------------------------------------

def _depth(rng, shifts, M=160, n_folds=16):
    depth = satcore.DepthStatistics()
    for i, shift in enumerate(shifts):
        psi = rng.standard_normal((M, 1, 5))
        q = rng.standard_normal((M, 1, 3)) + shift * psi[..., :3]
        depth[f"b{i}"] = stats_in_batches(q, psi, [M // 16] * 16, n_folds)
    return depth


def test_three_way_verdicts_and_depth_wide_answer():
    rng = np.random.default_rng(13)
    depth = _depth(rng, [0.0, 0.6, 0.0])
    report = depth.report(split="heldout")
    verdicts = [t.verdict for t in report.tests]
    assert verdicts[1] == "improvable" and report.verdict.verdict == "improvable"
    assert report.verdict.best_candidate == report.best_candidate == "b1"
    assert "saturated" not in verdicts  # no tolerance: nothing is certified saturated
    big = report.test("b0").growth_value_interval[1] * 1.5
    lenient = depth.report(split="heldout", tolerance=max(big, report.test("b1").growth_value_interval[1] * 1.5))
    assert all(t.verdict == "saturated" for t in lenient.tests) and lenient.verdict.verdict == "saturated"
    null = _depth(rng, [0.0, 0.0]).report(split="heldout")
    assert null.verdict.verdict == "inconclusive" and "no tolerance" in null.verdict.reason
    assert all(t.probe_size_to_decide is None or t.probe_size_to_decide > 160 for t in null.tests)


def test_tolerance_in_loss_units_and_predicted_gain():
    rng = np.random.default_rng(14)
    depth = _depth(rng, [0.5, 0.1])
    rms = {"b0": 3.0, "b1": 0.5}
    eps, rho = 1e-3, 0.01
    report = depth.report(split="heldout", tolerance=eps, rho=rho, stream_rms=rms)
    for t in report.tests:
        assert t.tolerance == pytest.approx(eps / (rho * rms[t.name]))
        g = t.predicted_gain
        assert g.value == pytest.approx(rho * rms[t.name] * math.sqrt(max(0, t.growth_value_sq_unbiased)))
        assert g.interval[0] == pytest.approx(rho * rms[t.name] * t.growth_value_interval[0])
    assert report.verdict.tolerance == {"value": eps, "units": "loss", "rho": rho}
    with pytest.raises(ValueError, match="stream RMS"):
        depth.report(tolerance=eps, rho=rho, stream_rms={"b0": 1.0})


def test_statistics_without_folds_are_inconclusive_with_a_reason():
    rng = np.random.default_rng(15)
    depth = _depth(rng, [1.0], n_folds=0)
    report = depth.report(split="heldout")
    assert report.tests[0].verdict == "inconclusive" and "no folds" in report.tests[0].reason
    assert report.to_dict()["candidates"][0]["test"]["p_value"] == 1.0


def test_report_json_names_and_text():
    rng = np.random.default_rng(16)
    report = _depth(rng, [0.6, 0.0]).report(split="heldout", tolerance=1e-3)
    d = report.to_dict()
    assert d["schema"] == "satcore-report/2"
    test = d["candidates"][0]["test"]
    for key in ("statistic", "p_value", "p_value_adjusted", "verdict", "growth_value_sq_unbiased",
                "growth_value_interval", "predicted_gain", "probe_size_to_decide"):
        assert key in test
    assert set(d["verdict"]) >= {"verdict", "alpha", "tolerance", "best_candidate", "method"}
    assert "prop1" in d and d["prop1"]["verdict"] in ("improvable", "saturated", "inconclusive")
    assert d["candidates"][0]["n_folds"] == 16
    text = str(report)
    assert "verdict: IMPROVABLE" in text and "prop1 (distribution-free" in text and "columns:" in text


def test_decide_without_signal_in_any_fold_gives_no_probe_size():
    s = satcore.CandidateStatistics(1, 1, n_folds=4)
    for v in (1.0, -1.0, 1.0, -1.0):
        s.update(np.array([[v]]), np.array([[1.0]]))
    tests, verdict = decide([s.score("x")])
    assert tests[0].verdict == "inconclusive" and tests[0].probe_size_to_decide is None
