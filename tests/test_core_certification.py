"""Finite-sample certification and alignment against Monte Carlo (Prop. 1, App. G; docs/core.md, Certification and Train/held-out alignment).

The generating model is the standard block with known population quantities:
psi ~ N(0, I_r), q = B psi + s * eps with eps ~ N(0, I_N) independent.  Then
C_pop = B, K_pop = I, g_pop = vec(B) and, using E[psi psi^T ||psi||^2] = (r + 2) I,
sigma^2 = E||q psi^T - B||^2 = (r + 1) ||B||^2 + N r s^2.
"""

import math

import numpy as np
import pytest

import satcore

N, R = 3, 4


def population(scale, s=1.0, seed=0):
    B = np.random.default_rng(seed).standard_normal((N, R))
    B *= scale / np.linalg.norm(B) if scale > 0 else 0.0
    sigma_sq = (R + 1) * np.sum(B * B) + N * R * s * s
    return B, sigma_sq


def draw(rng, B, n, s=1.0):
    psi = rng.standard_normal((n, R))
    q = psi @ B.T + s * rng.standard_normal((n, N))
    return q, psi


def test_closed_form_helpers():
    assert satcore.prop1_bound([1.0, 3.0], 100, 0.5) == pytest.approx(4.0 / (100 * 0.25))
    t = satcore.interval_half_width([1.0, 3.0], 100, 0.05)
    assert satcore.prop1_bound([1.0, 3.0], 100, t) == pytest.approx(0.05)
    n = satcore.required_probe_size(4.0, 0.1, 0.05)
    assert satcore.prop1_bound([4.0], n, 0.1) <= 0.05 < satcore.prop1_bound([4.0], n - 1, 0.1)
    tau = [satcore.detection_threshold(n) for n in (10, 1000, 10**6)]
    assert tau[0] > tau[1] > tau[2] and 1000 * tau[1] ** 2 < 10**6 * tau[2] ** 2
    with pytest.raises(ValueError):
        satcore.detection_threshold(10, exponent=0.5)


def test_sigma_and_debiased_energy_are_unbiased():
    """sigma^2 and the debiased ||g||^2 are unbiased; raw ||g_hat||^2 sits on the noise floor sigma^2/n."""
    rng = np.random.default_rng(1)
    B, sigma_sq = population(0.3)
    n, reps = 20, 3000
    raw, debiased, sig = [], [], []
    for _ in range(reps):
        s = satcore.score(*draw(rng, B, n), n_folds=0)  # no fold test read: no fold sums kept
        raw.append(s.cross_gradient_norm**2)
        debiased.append(s.signal_energy_debiased)
        sig.append(s.sigma_sq)
    truth = np.sum(B * B)
    for values, target in ((debiased, truth), (sig, sigma_sq), (raw, truth + sigma_sq / n)):
        values = np.asarray(values)
        se = values.std(ddof=1) / math.sqrt(reps)
        assert abs(values.mean() - target) < 4 * se, (values.mean(), target, se)
    # The raw energy is biased by the noise floor by many standard errors; the debiased one is not.
    assert np.mean(raw) - truth > 10 * np.std(raw) / math.sqrt(reps)


def _separated_test_errors(rng, scales, n, reps, bound_target, shift):
    """Monte Carlo of the separated test at the ``t`` whose Prop. 1 bound is ``bound_target``.

    Two candidates with population norms ``scales``; ``delta = Gamma - shift(t)``.  Returns the
    bound, the rate of ``|Gamma_hat - Gamma| >= t``, the rate of "saturated" verdicts and ``delta``.
    """
    (B1, s1), (B2, s2) = population(scales[0], seed=1), population(scales[1], seed=2)
    gamma = max(np.linalg.norm(B1), np.linalg.norm(B2))
    t = math.sqrt((s1 + s2) / (n * bound_target))
    delta = gamma - shift(t)
    deviations, saturated = 0, 0
    for _ in range(reps):
        scores = [satcore.score(*draw(rng, B, n), n_folds=0) for B in (B1, B2)]  # no fold test read
        norms = [c.cross_gradient_norm for c in scores]
        sig = [c.sigma_sq for c in scores]
        deviations += abs(max(norms) - gamma) >= t
        saturated += satcore.saturation_test("ab", norms, sig, n, delta=delta, t=t).saturated
    return satcore.prop1_bound([s1, s2], n, t), deviations / reps, saturated / reps, delta


def test_prop1_bound_holds_and_separated_test_errors_are_bounded():
    """Observed P(|Gamma_hat - Gamma| >= t) <= sum sigma^2 / (n t^2) for a known Gamma (two candidates),
    and the separated test's error rate under H0 (Gamma <= delta) and under H1 (Gamma >= delta + 2t)
    stays below that bound."""
    rng = np.random.default_rng(2)
    reps = 2000
    mc = 3 * math.sqrt(0.5 * 0.5 / reps)
    # H0 at its boundary: delta = Gamma.
    bound, deviation_rate, saturated_rate, _ = _separated_test_errors(rng, (0.4, 0.1), 40, reps, 0.5, lambda t: 0.0)
    assert bound == pytest.approx(0.5)
    assert deviation_rate <= bound + mc
    assert 1 - saturated_rate <= bound + mc  # wrongly non-saturated under H0
    # H1 at its boundary: delta = Gamma - 2t, which must be >= 0.  sigma^2 grows like 5 ||B||^2, so
    # Gamma >= 2t needs a strong signal and more samples than H0 (at n = 40 it is unreachable).
    bound, deviation_rate, saturated_rate, delta = _separated_test_errors(
        rng, (3.0, 0.1), 160, reps, 0.5, lambda t: 2 * t)
    assert delta > 0 and bound == pytest.approx(0.5)
    assert deviation_rate <= bound + mc
    assert saturated_rate <= bound + mc  # wrongly saturated under H1


def test_consistent_detector_separates_saturated_and_not():
    """Theorem 3: tau_n = n^-1/4 flags Gamma = 0 as saturated and Gamma > 0 as not, with high probability."""
    rng = np.random.default_rng(3)
    zero, _ = population(0.0)
    signal, _ = population(0.5)
    n = 4000
    for B, expect in ((zero, True), (signal, False)):
        verdicts = []
        for _ in range(20):
            s = satcore.score(*draw(rng, B, n), n_folds=0)
            test = satcore.saturation_test(["x"], [s.cross_gradient_norm], [s.sigma_sq], n, t=0.01,
                                           detector_scale=1.0)
            verdicts.append(test.detector_saturated)
        assert np.mean(verdicts) >= 0.95 if expect else np.mean(verdicts) <= 0.05


def test_report_test_block_and_training_split_warning():
    rng = np.random.default_rng(4)
    B, _ = population(0.2)
    depth = satcore.DepthStatistics()
    for name in ("block0", "block1"):
        depth[name] = satcore.CandidateStatistics.from_samples(*draw(rng, B, 30))
    report = depth.report(split="train", error=0.1)
    assert report.warnings and "training set" in report.warnings[0]
    d = report.to_dict()
    assert d["schema"] == "satcore-report/2"
    names = [c["name"] for c in d["candidates"]]
    best = max(d["candidates"], key=lambda c: c["cross_gradient_norm"])
    assert d["prop1"]["argmax"] == best["name"] and names == ["block0", "block1"]
    assert d["prop1"]["error_bound"] == pytest.approx(0.1)
    lo, hi = d["prop1"]["interval"]
    assert hi - d["prop1"]["gamma_hat"] == pytest.approx(d["prop1"]["t"])
    assert not depth.report(split="heldout").warnings  # no tangent-complete candidate here


def test_noise_free_probe_gets_a_verdict_at_any_error_level():
    """sum sigma^2 = 0 (every xi_i equal, here all zero: exactly saturated): t = 0, bound 0, interval a point."""
    rng = np.random.default_rng(7)
    depth = satcore.DepthStatistics()
    for name in ("a", "b"):
        depth[name] = satcore.CandidateStatistics.from_samples(np.zeros((50, 4)), rng.standard_normal((50, 6)))
    test = depth.report(split="heldout", error=0.05).prop1
    assert (test.t, test.error_bound, test.interval, test.saturated) == (0.0, 0.0, (0.0, 0.0), True)
    assert satcore.prop1_bound([0.0, 0.0], 50, 0.0) == 0.0
    with pytest.raises(ValueError, match="t must be > 0"):
        satcore.prop1_bound([0.0, 1e-3], 50, 0.0)


def test_detector_runs_only_with_a_scale():
    """Theorem 3's tau_n is in ||C||_F units: without a stated scale the report leaves it out."""
    rng = np.random.default_rng(8)
    B, _ = population(0.2)
    depth = satcore.DepthStatistics({"x": satcore.CandidateStatistics.from_samples(*draw(rng, B, 64))})
    assert depth.report(t=0.1).prop1.detector_threshold is None
    test = depth.report(t=0.1, detector_scale=2.0).prop1
    assert test.detector_threshold == pytest.approx(2.0 * 64**-0.25)
    assert test.detector_saturated == (test.gamma_hat <= test.detector_threshold)


def test_non_finite_inputs_and_sums_are_refused():
    rng = np.random.default_rng(9)
    Q, Psi = rng.standard_normal((20, 3)), rng.standard_normal((20, 4))
    for bad in (np.nan, np.inf):
        q = Q.copy()
        q[3, 1] = bad
        with pytest.raises(ValueError, match="Q: 1 of 60 entries are NaN or infinite"):
            satcore.score(q, Psi)
    stats = satcore.CandidateStatistics(3, 4)
    stats.add_moments(satcore.batch_moments(Q, Psi))
    stats.sum_gram[0, 0] = np.inf  # as an adapter's float16 overflow would leave it
    with pytest.raises(ValueError, match="candidate 'x': sum_gram not finite"):
        stats.score("x")
    assert np.isnan(satcore.realizability(np.nan, 1.0))
    assert np.isnan(satcore.variance_estimate(5, np.nan, 1.0))


def test_alignment_variance_matches_simulation():
    """docs/core.md, Train/held-out alignment: exact E and Var of <g1, g2> against simulation, non-Gaussian per-sample gradients."""
    rng = np.random.default_rng(5)
    p, n1, n2, reps = 4, 7, 11, 40000
    mu = np.array([0.3, -0.2, 0.1, 0.0])
    L = rng.standard_normal((p, p)) * 0.5
    Sigma = L @ L.T

    def sample(n):
        e = rng.exponential(size=(reps, n, p)) - 1.0  # skewed, unit variance
        return mu + e @ L.T

    g1, g2 = sample(n1).mean(axis=1), sample(n2).mean(axis=1)
    inner = np.einsum("ij,ij->i", g1, g2)
    mean, var = satcore.alignment_moments(mu, Sigma, n1, n2)
    assert abs(inner.mean() - mean) < 4 * inner.std() / math.sqrt(reps)
    centered = (inner - inner.mean()) ** 2
    assert abs(inner.var() - var) < 4 * centered.std() / math.sqrt(reps)
    # Cantelli bounds the observed sign-disagreement frequency.
    assert np.mean(inner <= 0) <= satcore.misalignment_bound(mean, var)


def test_alignment_estimates_from_kernel_are_unbiased():
    """U-statistics from xi_i^T xi_j recover ||mu||^2, mu^T Sigma mu, tr(Sigma^2) without p-vectors."""
    rng = np.random.default_rng(6)
    B, _ = population(0.8)
    s = 0.5
    # Population moments of xi = vec(q psi^T) by a large Monte Carlo (exact ones are messy).
    qb, pb = draw(rng, B, 400000, s)
    xi = np.einsum("mn,mr->mnr", qb, pb).reshape(len(qb), -1)
    mu = xi.mean(0)
    Sigma = np.cov(xi.T)
    truth = {
        "mean_energy": mu @ mu,
        "mu_sigma_mu": mu @ Sigma @ mu,
        "trace_sigma_sq": np.sum(Sigma * Sigma),
        "trace_sigma": np.trace(Sigma),
    }
    reps, n = 300, 30
    est = {k: [] for k in truth}
    for _ in range(reps):
        q, psi = draw(rng, B, n, s)
        e = satcore.estimate_alignment(satcore.xi_kernel(q, psi))
        for k in truth:
            est[k].append(getattr(e, k))
    for k, target in truth.items():
        v = np.asarray(est[k])
        se = v.std(ddof=1) / math.sqrt(reps)
        assert abs(v.mean() - target) < 4 * se + 0.01 * abs(target), (k, v.mean(), target, se)
    e = satcore.estimate_alignment(satcore.xi_kernel(qb[:2000], pb[:2000]))
    assert e.effective_dimension == pytest.approx(
        truth["trace_sigma"] ** 2 / truth["trace_sigma_sq"], rel=0.1
    )


def test_xi_kernel_with_positions_equals_explicit_products():
    rng = np.random.default_rng(7)
    Q, Psi = rng.standard_normal((9, 4, 3)), rng.standard_normal((9, 4, 5))
    X = np.einsum("mtn,mtr->mnr", Q, Psi).reshape(9, -1)
    np.testing.assert_allclose(satcore.xi_kernel(Q, Psi), X @ X.T, rtol=1e-12)
    # The chunked position-kernel route (when X would not fit) gives the same kernel.
    np.testing.assert_allclose(satcore.xi_kernel(Q, Psi, chunk=8, max_bytes=0), X @ X.T, rtol=1e-12)
    assert satcore.split_inner_product(Q[:4], Psi[:4], Q[4:], Psi[4:]) == pytest.approx(
        X[:4].mean(0) @ X[4:].mean(0), rel=1e-12
    )


def test_debiased_growth_value_removes_the_noise_floor():
    """growth_value_sq_debiased (K^+ metric) lands near V_pop^2 = ||B||^2 where the raw V^2 does not."""
    rng = np.random.default_rng(8)
    B, _ = population(0.3)
    n, reps = 50, 1500
    raw, debiased = [], []
    for _ in range(reps):
        s = satcore.score(*draw(rng, B, n), n_folds=0)  # no fold test read: no fold sums kept
        raw.append(s.growth_value**2)
        debiased.append(s.growth_value_sq_debiased)
    truth = np.sum(B * B)
    se = np.std(debiased) / math.sqrt(reps)
    assert np.mean(raw) - truth > 10 * se
    # K is estimated from the same probe, so the correction is first-order exact, not exact: allow 5%.
    assert abs(np.mean(debiased) - truth) < 4 * se + 0.05 * truth
