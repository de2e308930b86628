"""Gradient-matched insertion (Appendix H): predicted vs exactly measured loss change.

Toy models whose loss after inserting h_i = V* psi_i can be computed exactly:
a linear-quadratic head and a softmax cross-entropy head on top of z.  Per
sample, q_i is the analytic gradient of loss_i at z_i.
"""

import numpy as np
import pytest

import satcore


def quadratic(W, Y):
    def loss(Z, rows=slice(None)):  # Z: (M, T, N), per-sample loss = mean over positions
        R = Z @ W.T - Y[rows]
        return 0.5 * np.mean(np.sum(R * R, axis=2), axis=1)

    def grad(Z, rows=slice(None)):
        return ((Z @ W.T - Y[rows]) @ W) / Z.shape[1]

    return loss, grad


def logistic(W, labels):
    def loss(Z, rows=slice(None)):
        labels_ = labels[rows]
        logits = Z @ W.T
        logits = logits - logits.max(axis=2, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=2, keepdims=True))
        picked = np.take_along_axis(logp, labels_[..., None], axis=2)[..., 0]
        return -picked.mean(axis=1)

    def grad(Z, rows=slice(None)):
        logits = Z @ W.T
        p = np.exp(logits - logits.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        p[np.arange(Z.shape[0])[:, None], np.arange(Z.shape[1])[None, :], labels[rows]] -= 1.0
        return (p @ W) / Z.shape[1]

    return loss, grad


def make_problem(kind, M=60, T=3, N=5, out=4, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((out, N))
    Z = rng.standard_normal((M, T, N))
    if kind == "quadratic":
        loss, grad = quadratic(W, rng.standard_normal((M, T, out)))
    else:
        loss, grad = logistic(W, rng.integers(0, out, (M, T)))
    return Z, loss, grad


@pytest.mark.parametrize("kind", ["quadratic", "logistic"])
@pytest.mark.parametrize("family", ["mlp", "linear", "bias"])
def test_predicted_change_matches_measured_to_second_order(kind, family):
    Z, loss, grad = make_problem(kind)
    fam = satcore.make_family(family, Z.shape[2], seed=3, expansion=2)
    Psi = fam.features(Z)
    Q = grad(Z)
    stats = satcore.CandidateStatistics.from_samples(Q, Psi)
    gv = stats.score().growth_value
    errors = []
    for alpha in (1e-2, 1e-3):
        plan = satcore.plan_insertion(stats, alpha)
        assert plan.predicted_change == pytest.approx(-alpha * gv**2, rel=1e-10)
        measured = loss(Z + Psi @ plan.projection.T).mean() - loss(Z).mean()
        errors.append(abs(measured - plan.predicted_change))
        assert measured == pytest.approx(plan.predicted_change, rel=0.05)
    # The gap is second order: a 10x smaller step shrinks it ~100x.
    assert errors[1] < errors[0] / 30


def test_matched_projection_is_the_least_squares_fit():
    """V* = -alpha C K^+ minimises (1/2M) sum ||V psi_i + alpha q_i||^2 (checked by lstsq)."""
    Z, _, grad = make_problem("logistic", M=30, T=2)
    Psi = satcore.make_family("mlp", 5, seed=1, expansion=2).features(Z)
    Q = grad(Z)
    alpha = 0.1
    V = satcore.matched_projection(satcore.cross_gradient(Q, Psi), satcore.feature_gram(Psi), alpha)
    P, Y = Psi.reshape(-1, Psi.shape[2]), -alpha * Q.reshape(-1, Q.shape[2])
    V_ls = np.linalg.lstsq(P, Y, rcond=None)[0].T
    np.testing.assert_allclose(V, V_ls, rtol=1e-8, atol=1e-12)
    # Its output is -alpha times the projected gradient, of size alpha * growth_value.
    out = P @ V.T
    assert np.linalg.norm(out) / np.sqrt(30) == pytest.approx(alpha * satcore.growth_value(Q, Psi), rel=1e-9)


def test_matched_block_is_scale_free_when_K_is_singular():
    """Fewer positions than features (r > M*T) on scales 1e4 apart: V* is the minimum-norm least-squares
    fit of the unit-scaled features (np.linalg.lstsq on them), so the inserted function V* psi on new
    inputs does not change when the features are rescaled, and a second split's prediction is the
    first-order change <C', V*> of that block."""
    rng = np.random.default_rng(8)
    Q, base = rng.standard_normal((6, 1, 3)), rng.standard_normal((6, 1, 10))
    fresh = rng.standard_normal((4, 10))  # inputs the fit never saw
    alpha = 0.3
    outputs = []
    for scales in (np.ones(10), np.logspace(0, 4, 10)):
        Psi = base * scales
        C, K = satcore.cross_gradient(Q, Psi), satcore.feature_gram(Psi)
        V = satcore.matched_projection(C, K, alpha)
        P = Psi.reshape(-1, 10)
        norms = np.linalg.norm(P, axis=0)
        V_unit = np.linalg.lstsq(P / norms, -alpha * Q.reshape(-1, 3), rcond=None)[0].T
        np.testing.assert_allclose(V, V_unit / norms, rtol=1e-8, atol=1e-12 * np.abs(V).max())
        outputs.append((fresh * scales) @ V.T)
        C_eval = rng.standard_normal(C.shape)  # rows outside the fitting features' span
        assert satcore.predicted_loss_change(C, K, alpha, C_eval) == pytest.approx(np.sum(C_eval * V), rel=1e-9)
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-8)


def test_second_split_prediction():
    """On another split the first-order change is -alpha tr(C' K^+ C^T)."""
    Z, loss, grad = make_problem("quadratic", M=80, seed=4)
    fam = satcore.make_family("mlp", 5, seed=2, expansion=2)
    fit, held = slice(0, 40), slice(40, 80)
    s_fit = satcore.CandidateStatistics.from_samples(grad(Z[fit], fit), fam.features(Z[fit]))
    s_held = satcore.CandidateStatistics.from_samples(grad(Z[held], held), fam.features(Z[held]))
    alpha = 1e-4
    plan = satcore.plan_insertion(s_fit, alpha, s_held)
    moved = Z[held] + fam.features(Z[held]) @ plan.projection.T
    measured = loss(moved, held).mean() - loss(Z[held], held).mean()
    assert measured == pytest.approx(plan.predicted_change_eval, rel=0.01)


def test_alpha_for_relative_update():
    Z, _, grad = make_problem("quadratic")
    Psi = satcore.make_family("linear", 5).features(Z)
    stats = satcore.CandidateStatistics.from_samples(grad(Z), Psi)
    rms = np.sqrt(np.mean(np.sum(Z**2, axis=(1, 2))))
    alpha = satcore.alpha_for_relative_update(1e-3, rms, stats.score().growth_value)
    h = Psi @ satcore.plan_insertion(stats, alpha).projection.T
    assert np.sqrt(np.mean(np.sum(h**2, axis=(1, 2)))) / rms == pytest.approx(1e-3, rel=1e-9)
