"""satcore._decisions.predictors against independent references.

* first-step decreases (SGD, zero-state Adam) against the realized loss change
  of a real inserted zero-output block after one torch optimizer step
  (autograd; the error shrinks linearly with the step, so it is the first-order term);
* the Kronecker model's S-step decrease against explicit gradient descent on
  the explicit ``(F kron K) / T`` quadratic;
* the held-out gain's fold mean and interval against explicit per-sample
  gradients and, by Monte Carlo, its coverage of the population value;
* predict_gains against the growth value / Appendix H prediction it restates.
"""

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore import Criteria, InputError, Recipe
from satcore._decisions import predictors as P
from satcore._shared.arrays import frobenius_norm
from satcore._statistics.depth import DepthStatistics
from satcore._formulas.insertion import predicted_loss_change
from satcore._statistics.candidate import CandidateStatistics
from satcore.adapters.torch import grow, probe

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def resnet_probe():
    model = mt.digits_resnet().double()
    batches = mt.digits_batches(32, 2, start=0, dtype=torch.float64)
    return model, batches, probe(model, batches, mt.per_sample_ce, split="train")


def _mean_loss(model, batches):
    return torch.cat([mt.per_sample_ce(model(x), y) for x, y in batches]).mean()


def _realized_first_step(model, result, batches, at, optimizer, lr):
    grown = grow(model, result, at, zero=True).model.eval()
    branch = next(m for m in grown.modules() if type(m).__name__ == "InsertedResidual").branch
    params = list(branch.projection.parameters())
    opt = torch.optim.SGD(params, lr=lr) if optimizer == "sgd" else torch.optim.Adam(params, lr=lr, eps=1e-8)
    before = _mean_loss(grown, batches)
    opt.zero_grad()
    before.backward()
    opt.step()
    with torch.no_grad():
        return float(before) - float(_mean_loss(grown, batches))


@pytest.mark.parametrize("at", ["layer1.1", "layer2.0", "head"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_first_step_decrease_matches_a_real_inserted_block(resnet_probe, at, optimizer):
    model, batches, result = resnet_probe
    C = result.statistics[at].cross_gradient()
    gain = P.sgd_step_gain if optimizer == "sgd" else P.adam_step_gain
    lr = 1e-4 / np.abs(C).max() if optimizer == "sgd" else 1e-5
    errors = []
    for scale in (1.0, 0.1):
        predicted = gain(C, lr * scale)
        realized = _realized_first_step(model, result, batches, at, optimizer, lr * scale)
        errors.append(abs(realized - predicted) / predicted)
    assert errors[0] < 0.05, errors
    assert errors[1] < errors[0] / 4 or errors[1] < 1e-6, errors  # the gap is second order in the step


def _explicit_gd(C, F, K, T, lr, steps):
    """GD on L(v) = g.v + 1/2 v^T H v with the explicit H = kron(F, K) / T (row-major vec(V))."""
    H, g = np.kron(F, K) / T, C.ravel()
    v = np.zeros_like(g)
    for _ in range(steps):
        v = v - lr * (g + H @ v)
    return v.reshape(C.shape), -(g @ v + 0.5 * v @ H @ v)


@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize("steps", [1, 5, 40])
def test_kronecker_sgd_equals_explicit_gradient_descent(T, steps):
    rng = np.random.default_rng(T * 100 + steps)
    N, r = 3, 4
    A, B = rng.normal(size=(N, 5)), rng.normal(size=(r, 2))  # K of rank 2: a zero-curvature direction
    F, K, C = A @ A.T, B @ B.T, rng.normal(size=(N, r))
    lr = 0.5 / (np.linalg.eigvalsh(F).max() * np.linalg.eigvalsh(K).max() / T)
    V_ref, gain_ref = _explicit_gd(C, F, K, T, lr, steps)
    np.testing.assert_allclose(P.kronecker_sgd_point(C, F, K, T, lr, steps), V_ref, rtol=1e-9, atol=1e-12)
    assert P.kronecker_sgd_gain(C, F, K, T, lr, steps) == pytest.approx(gain_ref, rel=1e-9)
    # one step: the first-order decrease minus the explicit quadratic term
    if steps == 1:
        quad = 0.5 * lr**2 * C.ravel() @ (np.kron(F, K) / T) @ C.ravel()
        assert gain_ref == pytest.approx(P.sgd_step_gain(C, lr) - quad, rel=1e-9)


def test_kronecker_adam_minimises_the_model_along_adams_direction():
    rng = np.random.default_rng(3)
    A, B = rng.normal(size=(3, 3)), rng.normal(size=(4, 4))
    F, K, C = A @ A.T, B @ B.T, rng.normal(size=(3, 4))
    d = P.adam_direction(C)
    s_grid = np.linspace(0, 2.0, 20001)
    H = np.kron(F, K)
    values = [-(s * C.ravel() @ d.ravel() + 0.5 * s * s * d.ravel() @ H @ d.ravel()) for s in s_grid]
    best = float(np.max(values))
    assert P.kronecker_adam_gain(C, F, K, 1, lr=1.0, steps=2) == pytest.approx(best, rel=1e-6)
    # a budget shorter than the minimiser: the first-order gain less the quadratic at s = lr
    lr = 1e-3
    expected = P.adam_step_gain(C, lr) - 0.5 * lr**2 * d.ravel() @ H @ d.ravel()
    assert P.kronecker_adam_gain(C, F, K, 1, lr=lr) == pytest.approx(expected, rel=1e-9)


def test_heldout_gain_against_explicit_per_sample_gradients():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(96, 3, 4)) + 0.3          # per-sample gradients X_i
    counts = np.array([5, 7, 6, 6] * 4)              # 16 unequal folds
    edges = np.concatenate([[0], np.cumsum(counts)])
    sums = np.stack([X[a:b].sum(axis=0) for a, b in zip(edges[:-1], edges[1:])])
    V = rng.normal(size=(3, 4))
    h = P.heldout_gain(V, sums, counts, second_order=0.01)
    assert h.value == pytest.approx(-(float(np.sum(X.mean(axis=0) * V)) + 0.01), rel=1e-12)
    y = np.array([np.sum(X[a:b].mean(axis=0) * V) for a, b in zip(edges[:-1], edges[1:])])
    w = counts / counts.sum()
    se = np.sqrt(16 / 15 * np.sum(w**2 * (y - w @ y) ** 2))
    assert h.se == pytest.approx(se, rel=1e-12)
    assert h.interval[0] < h.value < h.interval[1] and h.n_folds == 16
    from scipy import stats

    assert h.fold_test_p_positive == pytest.approx(stats.t.cdf(h.value / se, df=15), rel=1e-12)


def test_a_huge_steps_heldout_gain_and_norm_are_the_small_steps_scaled_without_overflow():
    """A recipe lr of 1e300 makes a step ``V`` near 1e300: its per-fold values' squared spread (1e600) and its
    sum of squares overflowed float64 (RuntimeWarnings printed before decide's refusal, se and the norm inf).  The
    gain, se and norm are linear in ``V`` and the fold test's probability is scale-free, so the reference is the
    same step at unit scale times ``2^997`` (exact in float64)."""
    rng = np.random.default_rng(2)
    sums, counts = rng.normal(size=(8, 3, 4)) + 0.2, np.full(8, 5)
    V, huge = rng.normal(size=(3, 4)), 2.0**997
    with np.errstate(all="raise"):
        small, big = P.heldout_gain(V, sums, counts), P.heldout_gain(huge * V, sums, counts)
        norm = frobenius_norm(huge * V)
    assert (big.value, big.se) == (huge * small.value, huge * small.se)
    assert big.interval == (huge * small.interval[0], huge * small.interval[1])
    assert big.fold_test_p_positive == small.fold_test_p_positive and np.isfinite(big.se)
    assert norm == huge * float(np.linalg.norm(V))


def test_heldout_interval_covers_the_population_gain_by_monte_carlo():
    rng = np.random.default_rng(1)
    mu, V = np.full((2, 3), 0.05), rng.normal(size=(2, 3))
    truth = -float(np.sum(mu * V))
    covered, decrease = 0, []
    for _ in range(400):
        X = rng.normal(size=(160, 2, 3)) + mu
        h = P.heldout_gain(V, X.reshape(16, 10, 2, 3).sum(axis=1), np.full(16, 10))
        covered += h.interval[0] <= truth <= h.interval[1]
        decrease.append(h.fold_test_p_positive)
    assert 0.91 <= covered / 400 <= 0.99
    # the fold test's probability of a positive gain is on the side of the population gain's sign
    assert (np.mean(decrease) > 0.5) == (truth > 0)
    # no trial verified the step: no P(decrease) (studies/screen-probability.md)
    assert h.p_decrease is None and h.to_dict()["p_decrease"] is None


def _depth_stats(rng, shift):
    Q, Psi = rng.normal(size=(64, 2, 3)) + shift, rng.normal(size=(64, 2, 5))
    return DepthStatistics(a=CandidateStatistics.from_samples(Q, Psi, batch_size=4))


def test_predict_gains_restates_the_step_predictions():
    rng = np.random.default_rng(2)
    train, held = _depth_stats(rng, 0.4), _depth_stats(rng, 0.4)
    C, K, Ch = train["a"].cross_gradient(), train["a"].feature_gram(), held["a"].cross_gradient()
    sgd = P.predict_gains(train, held, Recipe("sgd", 0.01, 3, 64))["a"]
    assert sgd.training_gain == pytest.approx(3 * 0.01 * np.sum(C * C), rel=1e-12)
    assert sgd.heldout.value == pytest.approx(3 * 0.01 * np.sum(C * Ch), rel=1e-12)
    matched = P.predict_gains(train, held, criteria=Criteria(rho=0.1), stream_rms={"a": 2.0})["a"]
    growth = train["a"].score("a").growth_value
    assert matched.training_gain == pytest.approx(0.1 * 2.0 * growth, rel=1e-9)  # rho ||z||_S V
    alpha = 0.1 * 2.0 / growth
    assert matched.heldout.value == pytest.approx(-predicted_loss_change(C, K, alpha, Ch), rel=1e-9)
    F = {"a": np.eye(3)}
    second = P.predict_gains(train, held, Recipe("sgd", 0.01, 1, 64), train_fisher=F, heldout_fisher=F)["a"]
    assert second.training_gain_second_order == pytest.approx(
        P.kronecker_sgd_gain(C, F["a"], K, train["a"].n_positions, 0.01), rel=1e-12)
    d = P.predict_gains(train, held, Recipe("adam", 0.01, 1, 64)).to_dict()
    assert d["candidates"][0]["predicted_heldout_gain"]["n_folds"] == 16 and "splits" in d


def test_predict_gains_refuses_bad_requests():
    rng = np.random.default_rng(4)
    train, held = _depth_stats(rng, 0.0), _depth_stats(rng, 0.0)
    with pytest.raises(InputError, match="rho > 0"):
        P.predict_gains(train, held)
    with pytest.raises(InputError, match="stream_rms"):
        P.predict_gains(train, held, criteria=Criteria(rho=0.1))
    with pytest.raises(InputError, match="weight decay"):
        P.predict_gains(train, held, Recipe("adamw", 0.1, 1, 8, weight_decay=0.01))
    other = DepthStatistics(b=held["a"])
    with pytest.raises(ValueError, match="candidate lists differ"):
        P.predict_gains(train, other, Recipe("sgd", 0.1, 1, 8))
    no_folds = DepthStatistics(a=CandidateStatistics.from_samples(rng.normal(size=(8, 1, 3)),
                                                                  rng.normal(size=(8, 1, 5)), n_folds=0))
    with pytest.raises(ValueError, match="no folds"):
        P.predict_gains(DepthStatistics(a=CandidateStatistics.from_samples(
            rng.normal(size=(8, 1, 3)), rng.normal(size=(8, 1, 5)), n_folds=0)), no_folds, Recipe("sgd", 0.1, 1, 8))


def test_sum_qq_is_the_explicit_gradient_moment_and_survives_merge_and_dumps(tmp_path):
    from satcore._io.dump import read_dump, write_dump

    rng = np.random.default_rng(5)
    Q, Psi = rng.normal(size=(40, 3, 4)), rng.normal(size=(40, 3, 6))
    stats = CandidateStatistics.from_samples(Q, Psi, batch_size=5, curvature=True)
    explicit = sum(q.T @ q for q in Q) / 40  # (1/n) sum_i Q_i^T Q_i, summed over positions
    np.testing.assert_allclose(stats.gradient_moment(), explicit, rtol=1e-12)
    halves = (CandidateStatistics.from_samples(Q[:20], Psi[:20], batch_size=5, curvature=True)
              + CandidateStatistics.from_samples(Q[20:], Psi[20:], batch_size=5, curvature=True))
    np.testing.assert_allclose(halves.sum_qq, stats.sum_qq, rtol=1e-12)
    plain = CandidateStatistics.from_samples(Q[20:], Psi[20:], batch_size=5)
    assert not (CandidateStatistics.from_samples(Q[:20], Psi[:20], curvature=True) + plain).curvature
    back = CandidateStatistics.from_arrays(stats.to_arrays())
    np.testing.assert_array_equal(back.sum_qq, stats.sum_qq)
    bad = stats.to_arrays()
    bad["sum_qq"] = bad["sum_qq"] * 2
    with pytest.raises(ValueError, match="trace\\(sum_qq\\)"):
        CandidateStatistics.from_arrays(bad)
    write_dump(tmp_path / "d.npz", DepthStatistics(a=stats), meta={})
    np.testing.assert_array_equal(read_dump(tmp_path / "d.npz").stored["a"].sum_qq, stats.sum_qq)
    with pytest.raises(ValueError, match="curvature=False"):
        plain.gradient_moment()


def test_predict_gains_reads_the_fisher_from_curvature_statistics():
    rng = np.random.default_rng(6)
    Q, Psi = rng.normal(size=(64, 2, 3)) + 0.3, rng.normal(size=(64, 2, 5))
    Qh, Psih = rng.normal(size=(64, 2, 3)) + 0.3, rng.normal(size=(64, 2, 5))
    train = DepthStatistics(a=CandidateStatistics.from_samples(Q, Psi, batch_size=4, curvature=True))
    held = DepthStatistics(a=CandidateStatistics.from_samples(Qh, Psih, batch_size=4, curvature=True))
    given = P.predict_gains(train, held, Recipe("sgd", 0.05, 4, 64), train_fisher={"a": train["a"].gradient_moment()},
                            heldout_fisher={"a": held["a"].gradient_moment()})["a"]
    own = P.predict_gains(train, held, Recipe("sgd", 0.05, 4, 64))["a"]
    assert own.training_gain_second_order == given.training_gain_second_order is not None
    assert own.heldout.value == given.heldout.value
