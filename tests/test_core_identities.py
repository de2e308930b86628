"""The identities of docs/core.md (Quantities), property-tested against the explicit projector."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import satcore
from core_problems import explicit_jacobians, explicit_projector_parts, problems

REL = 1e-9
PROPS = settings(max_examples=60, deadline=None)


def close(a, b, rel=REL, scale=None):
    scale = max(abs(a), abs(b)) if scale is None else scale
    return abs(a - b) <= rel * scale + 1e-300


@PROPS
@given(problems())
def test_gram_form_equals_projector_and_jacobian(problem):
    """Identity 1: ||Q Pi||_F / sqrt(M) == sqrt(tr(C K^+ C^T)) == sqrt(g^T G^+ g) with J = I kron psi^T."""
    Q, Psi = problem
    gram = satcore.growth_value(Q, Psi)
    reference = satcore.projected_growth_value(Q, Psi)
    jac = satcore.growth_value_jacobian(Q, explicit_jacobians(Psi, np.shape(Q)[-1]))
    scale = satcore.ag(Q)
    assert close(gram, reference, scale=scale)
    assert close(gram, jac, scale=scale)
    assert satcore.score(Q, Psi).growth_value == pytest.approx(gram, rel=1e-12, abs=1e-300)


@PROPS
@given(problems())
def test_bounds_and_pythagoras(problem):
    """Identities 2 and 5: 0 <= V <= AG and V^2 + dist^2 = AG^2 (Remark 3)."""
    Q, Psi = problem
    gv, ag = satcore.growth_value(Q, Psi), satcore.ag(Q)
    assert 0 <= gv <= ag * (1 + 1e-12)
    M = np.shape(Q)[0]
    _, residual = explicit_projector_parts(Q, Psi)
    dist_sq = np.sum(residual**2) / M
    assert close(gv**2 + dist_sq, ag**2, scale=ag**2)
    s = satcore.score(Q, Psi)
    assert 0 <= s.realizability <= 1
    assert s.realizability == pytest.approx(gv / ag, rel=1e-12)


@PROPS
@given(problems(), st.data())
def test_equality_iff_in_tangent_range(problem, data):
    """Identity 2: V == AG iff Q lies in the tangent range; C == 0 iff V == 0."""
    _, Psi = problem
    Psi = np.asarray(Psi, dtype=np.float64)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    N = data.draw(st.integers(1, 4))
    raw = rng.standard_normal(Psi.shape[:-1] + (N,))
    inside, outside = explicit_projector_parts(raw, Psi)
    inside = inside.reshape(raw.shape)
    outside = outside.reshape(raw.shape)
    if np.linalg.norm(inside) > 1e-8:
        assert close(satcore.growth_value(inside, Psi), satcore.ag(inside), rel=1e-8)
    if np.linalg.norm(outside) > 1e-6:
        # Orthogonal to the range: C vanishes and so does V, although AG does not.
        C = satcore.cross_gradient(outside, Psi)
        assert np.abs(C).max() <= 1e-10 * satcore.ag(outside) * np.abs(Psi).max()
        assert satcore.growth_value(outside, Psi) <= 1e-6 * satcore.ag(outside)
        mixed = inside + outside
        assert satcore.growth_value(mixed, Psi) < satcore.ag(mixed) * (1 - 1e-9)
    # C == 0 exactly iff V == 0: a nonzero C has a nonzero growth value.
    C = satcore.cross_gradient(raw, Psi)
    assert (np.abs(C).max() > 1e-12) == (satcore.growth_value(raw, Psi) > 1e-12)


@PROPS
@given(problems(), st.data())
def test_reparameterisation_invariance(problem, data):
    """Identity 3: psi -> A psi leaves V unchanged; ||C||_F (coordinate-dependent) changes."""
    Q, Psi = problem
    Psi = np.asarray(Psi, dtype=np.float64)
    r = Psi.shape[-1]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    A = np.eye(r) + 0.5 * rng.standard_normal((r, r)) / np.sqrt(r)
    A[0, 0] += 2.0  # keep A well away from orthogonal
    assume(abs(np.linalg.det(A)) >= 0.1)  # invertible with room to spare
    moved = Psi @ A.T
    gv, gv_moved = satcore.growth_value(Q, Psi), satcore.growth_value(Q, moved)
    assert close(gv, gv_moved, rel=1e-7, scale=satcore.ag(Q))
    s, s_moved = satcore.score(Q, Psi), satcore.score(Q, moved)
    if s.cross_gradient_norm > 1e-6:
        assert not np.isclose(s.cross_gradient_norm, s_moved.cross_gradient_norm, rtol=1e-6)


@PROPS
@given(problems())
def test_full_rank_implies_growth_equals_ag(problem):
    """Identity 4 / Thm 2 item 4: rank(Psi_S) == M*T implies V == AG."""
    Q, Psi = problem
    s = satcore.score(Q, Psi)
    rows = int(np.prod(np.shape(Psi)[:-1]))
    assert s.tangent_complete == (s.feature_rank == rows)
    assert s.feature_rank == np.linalg.matrix_rank(np.asarray(Psi, dtype=np.float64).reshape(rows, -1))
    if s.tangent_complete:
        assert close(s.growth_value, s.ag)
        assert s.realizability == pytest.approx(1.0, abs=1e-9)


def test_rank_deficient_float32_matches_float64_values():
    """Float32 input is accumulated in float64: same values as the float64 copy of the same numbers."""
    rng = np.random.default_rng(3)
    Psi = rng.standard_normal((40, 3, 6)).astype(np.float32)
    Psi = np.concatenate([Psi, Psi[..., :2]], axis=-1)  # exactly rank 6 of 8 columns
    Q = rng.standard_normal((40, 3, 4)).astype(np.float32)
    a = satcore.score(Q, Psi)
    b = satcore.score(Q.astype(np.float64), Psi.astype(np.float64))
    assert a == b
    assert a.feature_rank == 6


def test_joint_insertion_gradient_is_concatenation():
    """Identity 6 / Cor. 2 on a real two-candidate network, by finite differences.

    Network: z1 = tanh(W0 x); z2 = tanh(W1 (z1 + V1 psi1(z1))); loss = CE(W2 (z2 + V2 psi2(z2)), y).
    The joint gradient in (V1, V2) at zero equals (vec C1, vec C2), with each C_l = mean q_l psi_l^T and
    q_l the per-sample activation gradient (itself taken by finite differences).
    """
    rng = np.random.default_rng(0)
    M, d_in, N, classes = 6, 3, 4, 3
    X = rng.standard_normal((M, d_in))
    y = rng.integers(0, classes, M)
    W0, W1, W2 = rng.standard_normal((N, d_in)), rng.standard_normal((N, N)), rng.standard_normal((classes, N))
    f1 = satcore.make_family("mlp", N, seed=1, expansion=2)
    f2 = satcore.make_family("linear", N)

    def per_sample_losses(V1, V2, dz1=None, dz2=None):
        z1 = np.tanh(X @ W0.T)
        if dz1 is not None:
            z1 = z1 + dz1
        z2 = np.tanh((z1 + f1.features(z1)[:, 0] @ V1.T) @ W1.T)
        if dz2 is not None:
            z2 = z2 + dz2
        logits = (z2 + f2.features(z2)[:, 0] @ V2.T) @ W2.T
        logits = logits - logits.max(axis=1, keepdims=True)
        return -(logits[np.arange(M), y] - np.log(np.exp(logits).sum(axis=1)))

    V1, V2 = np.zeros((N, f1.n_features)), np.zeros((N, f2.n_features))
    h = 1e-6

    def fd_q(which):
        q = np.zeros((M, N))
        for n in range(N):
            e = np.zeros((M, N))
            e[:, n] = h
            kw_p, kw_m = {which: e}, {which: -e}
            q[:, n] = (per_sample_losses(V1, V2, **kw_p) - per_sample_losses(V1, V2, **kw_m)) / (2 * h)
        return q

    z1 = np.tanh(X @ W0.T)
    z2 = np.tanh(z1 @ W1.T)
    C1 = satcore.cross_gradient(fd_q("dz1"), f1.features(z1))
    C2 = satcore.cross_gradient(fd_q("dz2"), f2.features(z2))
    joint = satcore.joint_gradient([C1, C2])

    fd = []
    for V, which in ((V1, 0), (V2, 1)):
        for idx in np.ndindex(V.shape):
            Vp, Vm = [V1.copy(), V2.copy()], [V1.copy(), V2.copy()]
            Vp[which][idx] += h
            Vm[which][idx] -= h
            fd.append((per_sample_losses(*Vp).mean() - per_sample_losses(*Vm).mean()) / (2 * h))
    np.testing.assert_allclose(joint, fd, rtol=1e-5, atol=1e-8)
    assert satcore.joint_descent_exists([C1, C2])
    assert satcore.joint_descent_exists([np.zeros_like(C1), C2])
    assert not satcore.joint_descent_exists([np.zeros_like(C1), np.zeros_like(C2)])


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 8), st.floats(1e-12, 1.0))
def test_direction_maps_are_descent_compatible(seed, p, eps):
    """Identity 7 / Assumption 2: GD, any SPD preconditioner and zero-state Adam are descent-compatible."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(p) * 10.0 ** rng.uniform(-6, 3)
    B = rng.standard_normal((p, p))
    P = B @ B.T + 1e-3 * np.eye(p)
    for d in (satcore.gradient_descent(), satcore.preconditioned(P), satcore.adam_zero_state(eps)):
        assert np.all(d(np.zeros(p)) == 0)
        assert satcore.is_descent_compatible(d, g)
    # The check can fail: ascent, and a map with a nonzero zero-state drift, are refused.
    assert not satcore.is_descent_compatible(lambda v: np.asarray(v), g)
    assert not satcore.is_descent_compatible(lambda v: -np.asarray(v) + 1.0, g)


def test_descent_bound_cor1_on_quadratic():
    """Cor. 1: for an L-smooth quadratic, one GD step decreases at least eta (1 - L eta / 2) ||g||^2."""
    rng = np.random.default_rng(1)
    B = rng.standard_normal((5, 5))
    H = B @ B.T
    L = np.linalg.eigvalsh(H).max()
    b = rng.standard_normal(5)
    phi = lambda th: 0.5 * th @ H @ th + b @ th  # noqa: E731
    g = b  # gradient at zero
    for eta in (0.1 / L, 0.5 / L, 1 / L):
        decrease = phi(np.zeros(5)) - phi(-eta * g)
        assert decrease >= satcore.descent_bound(g @ g, L, eta) - 1e-12
    with pytest.raises(ValueError):
        satcore.descent_bound(1.0, L, 2 / L)


def test_ag_batch_matches_eq2_by_hand():
    rng = np.random.default_rng(2)
    Q = rng.standard_normal((10, 3, 4))
    by_hand = np.mean([np.linalg.norm(Q[0:4]) / 4, np.linalg.norm(Q[4:8]) / 4, np.linalg.norm(Q[8:10]) / 2])
    assert satcore.ag_batch(Q, 4) == pytest.approx(by_hand, rel=1e-14)
    assert satcore.score(Q, rng.standard_normal((10, 3, 2)), batch_size=4).ag_batch == pytest.approx(by_hand)
    assert satcore.ag_normalized(Q) == pytest.approx(satcore.ag(Q) / 2.0)


def test_input_validation():
    with pytest.raises(TypeError):
        satcore.ag(np.ones((3, 2), dtype=int))
    with pytest.raises(ValueError):
        satcore.growth_value(np.ones((3, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError):
        satcore.ag(np.ones(3))


def test_rank_tolerance_is_the_documented_cut():
    """Singular values of the unit-column features Psi S above sqrt(DEFAULT_RTOL) * s_max count, those below do not."""
    rng = np.random.default_rng(5)
    U, _ = np.linalg.qr(rng.standard_normal((30, 4)))
    W, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    cut = np.sqrt(satcore.DEFAULT_RTOL)
    Psi = (U * np.array([1.0, 0.1, 30 * cut, cut / 30])) @ W.T
    Q = rng.standard_normal((30, 2))
    Us, s, _ = np.linalg.svd(Psi / np.linalg.norm(Psi, axis=0), full_matrices=False)
    assert s[2] > 10 * cut * s[0] and s[3] < cut * s[0] / 10  # the construction straddles the cut
    assert satcore.feature_rank(Psi) == 3
    assert satcore.growth_value(Q, Psi) == pytest.approx(satcore.projected_growth_value(Q, Psi), rel=1e-6)
    # The kept weak direction contributes fully: ||Q^T u_3||^2 / M is inside V^2.
    kept = np.sum((Us[:, :3].T @ Q) ** 2) / 30
    assert satcore.growth_value(Q, Psi) ** 2 == pytest.approx(kept, rel=1e-6)


@pytest.mark.parametrize("spread", [1e3, 1e6, 1e9])
def test_feature_scales_do_not_decide_the_rank(spread):
    """A diagonal reparameterisation (features on scales ``spread`` apart: a bias column next to
    large activations) keeps every direction and the growth value (identity 3), where a cut on the
    unscaled Gram would drop the small features once spread^2 passes 1/DEFAULT_RTOL."""
    rng = np.random.default_rng(6)
    Psi = rng.standard_normal((40, 3, 6))
    Q = rng.standard_normal((40, 3, 4))
    scales = np.logspace(0, np.log10(spread), 6)
    P, Y = Psi.reshape(-1, 6), Q.reshape(-1, 4)
    reference = np.linalg.norm(P @ np.linalg.lstsq(P, Y, rcond=None)[0]) / np.sqrt(40)  # unscaled least squares
    for features in (Psi, Psi * scales):
        s = satcore.score(Q, features)
        assert s.feature_rank == 6
        assert s.growth_value == pytest.approx(reference, rel=1e-9)
        assert satcore.projected_growth_value(Q, features) == pytest.approx(reference, rel=1e-9)


def test_float32_batch_sums_do_not_invent_directions():
    """With fewer positions than features (r > M*T), Grams summed in float32 per batch (an adapter's
    batch_dtype=float32) put round-off of either sign on K's null directions, far above the 1e-10 cut;
    the cut at ROUNDOFF_FACTOR x the most negative eigenvalue keeps the rank at M*T and the growth value
    at the float64 one, instead of whitening noise past ag."""
    rng = np.random.default_rng(11)
    Q, Psi = rng.standard_normal((30, 2, 5)), rng.standard_normal((30, 2, 100)) * np.logspace(0, 1, 100)
    exact = satcore.CandidateStatistics.from_samples(Q, Psi, batch_size=10).score()
    single = satcore.CandidateStatistics(5, 100, 2)
    for b in range(0, 30, 10):
        q, p = (a[b : b + 10].reshape(-1, a.shape[2]).astype(np.float32) for a in (Q, Psi))
        sums = satcore.BatchMoments(n_samples=10, n_vectors=20, sum_q_sq=float(np.vdot(q, q)), sum_cross=q.T @ p,
                                    sum_gram=p.T @ p, sum_xi_sq=0.0)  # products in float32
        single.add_moments(sums)
    got = single.score()
    assert exact.feature_rank == 60 and got.feature_rank == 60
    assert got.growth_value == pytest.approx(exact.growth_value, rel=1e-4)
    assert got.growth_value <= got.ag * (1 + 1e-6)
