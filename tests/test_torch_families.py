"""Torch feature maps == satcore._formulas.families NumPy features (same seed); torch batch
sums == the core's batch_moments; position subsampling is unbiased."""

import itertools

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore import CandidateStatistics, batch_moments as core_batch_moments, make_family
from satcore.adapters.torch import (
    ResidualBranch,
    batch_moments,
    build_feature_map,
    position_index,
    positions,
    probe,
    sequence_loss,
    subsample_positions,
)

torch.set_num_threads(1)


def _real_streams():
    """Real activations: a ResNet stage input (M, C, H, W) and a GPT-2 residual stream (M, T, d)."""
    resnet = mt.digits_resnet().double()
    x, _ = mt.digits_batches(4, 1, dtype=torch.float64)[0]
    conv = resnet.relu(resnet.bn1(resnet.conv1(x))).detach()
    gpt = mt.gpt2().double()
    ids, _ = mt.text_batches(12, 3, 1)[0]
    tokens = gpt.transformer.wte(ids) + gpt.transformer.wpe(torch.arange(12))
    return conv, tokens.detach()


@pytest.fixture(scope="module")
def streams():
    return _real_streams()


@pytest.mark.parametrize("kind", ["mlp", "linear", "bias", "conv"])
def test_torch_features_equal_numpy_family(streams, kind):
    conv, tokens = streams
    for z in (conv, tokens) if kind != "conv" else (conv,):
        for seed, init_std in ((0, None), (3, 0.02)):
            fm = build_feature_map(kind, z, seed=seed, init_std=init_std)
            with torch.no_grad():
                got = fm(z).numpy()
            width = z.shape[1] if z.dim() == 4 else z.shape[-1]
            ref_family = make_family(kind, width, seed=seed, init_std=init_std if kind == "mlp" else None)
            zn = z.numpy()
            if kind != "conv" and z.dim() == 4:  # position-wise families see pixels as positions
                zn = positions(z).numpy()
            ref = ref_family.features(zn)
            assert got.shape == ref.shape
            assert np.abs(got - ref).max() <= 1e-12 * max(1.0, np.abs(ref).max())


def test_float32_features_equal_numpy_to_float32_roundoff(streams):
    _, tokens = streams
    fm = build_feature_map("mlp", tokens.float(), seed=1, init_std=0.02)
    with torch.no_grad():
        got = fm(tokens.float()).double().numpy()
    ref = make_family("mlp", tokens.shape[-1], seed=1, init_std=0.02).features(tokens.float().double().numpy())
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


def test_user_module_feature_map(streams):
    _, tokens = streams
    user = torch.nn.Sequential(torch.nn.Linear(tokens.shape[-1], 5, bias=False).double(), torch.nn.Tanh())
    fm = build_feature_map(user, tokens)
    with torch.no_grad():
        assert torch.equal(fm(tokens), user(tokens))
    assert (fm.width, fm.n_features, fm.kind) == (tokens.shape[-1], 5, "user")


@pytest.mark.parametrize("kind", ["mlp", "conv", "linear", "bias"])
def test_branch_is_V_psi(streams, kind):
    """The inserted block's output equals V psi(z) computed from the features (conv: 3x3 conv of V)."""
    conv, tokens = streams
    z = conv if kind in ("conv", "linear") else tokens
    fm = build_feature_map(kind, z, seed=0)
    g = torch.Generator().manual_seed(0)
    V = torch.randn(positions(z).shape[2], fm.n_features, generator=g, dtype=torch.float64)
    with torch.no_grad():
        h = ResidualBranch(fm, V)(z)
        ref = torch.einsum("mtr,nr->mtn", fm(z), V)
    assert h.shape == z.shape
    assert torch.allclose(positions(h), ref, rtol=1e-12, atol=1e-12)


# float64 torch sums against the core, both routes: tests/test_conformance.py, test_moments_equal_the_core_batch_moments
@pytest.mark.parametrize("shape", [(5, 1, 3, 4), (4, 6, 3, 7), (3, 9, 2, 2), (2, 3, 8, 9)])
@pytest.mark.parametrize("variance", [False, True])
def test_torch_float32_batch_moments_equal_core_to_float32_roundoff(shape, variance):
    g = torch.Generator().manual_seed(sum(shape))
    M, T, N, r = shape
    q = torch.randn(M, T, N, generator=g, dtype=torch.float64)
    psi = torch.randn(M, T, r, generator=g, dtype=torch.float64)
    ref = core_batch_moments(q.numpy(), psi.numpy(), variance=variance).as_dict()
    f32 = batch_moments(q.float(), psi.float(), variance=variance, dtype=torch.float32).as_dict()
    np.testing.assert_allclose(f32["sum_cross"], ref["sum_cross"], rtol=1e-5, atol=1e-5)


def test_position_subsampling_is_exactly_unbiased():
    """Averaging the subsampled sums over ALL T'-subsets gives the full sums (exact expectation)."""
    g = torch.Generator().manual_seed(0)
    M, T, N, r, keep = 3, 6, 4, 5, 2
    q = torch.randn(M, T, N, generator=g, dtype=torch.float64)
    psi = torch.randn(M, T, r, generator=g, dtype=torch.float64)
    full = batch_moments(q, psi).as_dict()
    subsets = list(itertools.combinations(range(T), keep))
    mean = {k: 0.0 for k in ("sum_q_sq", "sum_cross", "sum_gram")}
    for s in subsets:
        idx = torch.tensor(s)
        part = batch_moments(subsample_positions(q, idx), subsample_positions(psi, idx)).as_dict()
        for k in mean:
            mean[k] = mean[k] + np.asarray(part[k]) / len(subsets)
    for k in mean:
        np.testing.assert_allclose(mean[k], full[k], rtol=1e-12, atol=1e-12)


def test_position_index_is_uniform():
    """Each position is kept with probability T'/T (Monte Carlo, 4000 draws, 5 standard errors)."""
    g = torch.Generator().manual_seed(1)
    T, keep, n = 10, 3, 4000
    counts = torch.zeros(T)
    for _ in range(n):
        idx = position_index(T, keep, g)
        assert idx.numel() == keep and len(set(idx.tolist())) == keep
        counts[idx] += 1
    p = keep / T
    assert torch.all((counts / n - p).abs() < 5 * np.sqrt(p * (1 - p) / n))
    assert position_index(T, None, g) is None and position_index(T, T, g) is None


def test_probe_with_position_subsampling_is_unbiased_on_gpt2():
    """Monte Carlo over probe seeds: the mean of subsampled C and K matches the full probe."""
    model = mt.gpt2().double()
    batches = mt.text_batches(16, 2, 1)
    full = probe(model, batches, sequence_loss, candidates=["transformer.h.1"], head=False, family="linear")
    stats = full.statistics["transformer.h.1"]
    runs = [
        probe(model, batches, sequence_loss, candidates=["transformer.h.1"], head=False, family="linear",
              position_subsample=4, seed=s).statistics["transformer.h.1"]
        for s in range(60)
    ]
    assert runs[0].n_positions == 4
    for field in ("sum_cross", "sum_gram", "sum_q_sq"):
        draws = np.stack([np.ravel(getattr(r, field)) for r in runs])
        se = draws.std(0, ddof=1) / np.sqrt(len(runs))
        err = np.abs(draws.mean(0) - np.ravel(getattr(stats, field)))
        assert np.all(err <= 5 * se + 1e-12), field
        # and the scaling matters: without sqrt(T/T') the mean would be T'/T of the truth
        assert np.linalg.norm(draws.mean(0)) > 0.7 * np.linalg.norm(np.ravel(getattr(stats, field)))


def test_float32_batch_sums_into_float64_totals():
    model = mt.gpt2()
    batches = mt.text_batches(16, 2, 2)
    a = probe(model, batches, sequence_loss, batch_dtype=torch.float32).statistics
    b = probe(model, batches, sequence_loss, batch_dtype=torch.float64).statistics
    for name in a:
        assert isinstance(a[name], CandidateStatistics) and a[name].sum_cross.dtype == np.float64
        assert np.linalg.norm(a[name].sum_cross - b[name].sum_cross) <= 1e-5 * np.linalg.norm(b[name].sum_cross)
