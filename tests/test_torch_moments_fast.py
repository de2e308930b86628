"""The fast per-batch sums equal the direct ones: the ``conv`` family's sums from the
hidden map (channel correlations by FFT or by 13 shifted products, exact border
corrections, per-image gradients by one split-offset product per image or nine shifted products) against the core's NumPy sums on explicit ``unfold3x3`` patches, the
symmetric ``dsyrk`` Gram against a plain product, and the probe's conv route
against the generic patch route on a real ResNet."""

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore import batch_moments as core_batch_moments
from satcore.adapters.torch import build_feature_map, probe
from satcore.adapters.torch.moments import (
    batch_moments,
    complete_lower,
    conv_batch_moments,
    SAMPLE_GRADIENT_IMAGES,
    conv_sample_gradients,
    float64_device,
    gram,
    kernel_inner_products,
)
from satcore._formulas.families import conv_gradients, unfold3x3
from roundoff import EPS32, relative_error

torch.set_num_threads(1)


# (M, N, C, H, W): square, oblong, single row / column / pixel, 2-pixel sides (every border case)
SHAPES = [(3, 4, 5, 6, 7), (2, 3, 2, 1, 1), (2, 3, 2, 2, 5), (3, 5, 4, 1, 6), (2, 2, 3, 5, 2), (1, 1, 1, 3, 3)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variance", [False, True])
@pytest.mark.parametrize("heavy_border", [False, True])
def test_conv_moments_equal_explicit_patches(shape, variance, heavy_border, gram_route):
    """Every field against ``satcore.batch_moments(conv_gradients(g), unfold3x3(h))`` in float64."""
    M, N, C, H, W = shape
    g = torch.Generator().manual_seed(sum(shape))
    grad = torch.randn(M, N, H, W, generator=g, dtype=torch.float64)
    hidden = torch.randn(M, C, H, W, generator=g, dtype=torch.float64)
    if heavy_border:  # the border corrections carry most of the Gram: a wrong one cannot hide
        hidden[:, :, [0, -1], :] *= 1e3
        hidden[:, :, :, [0, -1]] *= 1e3
    got = conv_batch_moments(grad, hidden, variance=variance).as_dict()
    ref = core_batch_moments(conv_gradients(grad.numpy()), unfold3x3(hidden.numpy()), variance=variance).as_dict()
    assert set(got) == set(ref)
    assert got["n_samples"] == ref["n_samples"]
    for field in set(ref) - {"n_samples"}:
        assert relative_error(got[field], ref[field]) < 1e-12, field
    assert got["sum_gram"].shape == (9 * C, 9 * C) and torch.equal(got["sum_gram"], got["sum_gram"].T)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("split", [True, False])
def test_conv_sample_gradients_equal_explicit_patch_products(shape, split):
    """Both routes of the per-image gradients (one product per image with the kernel offset split between
    the shifted gradient and the shifted map; nine shifted products, the GPUs' route) == ``G_m U_m^T`` with
    ``U_m`` the explicit ``unfold3x3`` patches, image by image (more images than one product takes)."""
    M, N, C, H, W = shape
    M += SAMPLE_GRADIENT_IMAGES  # a full group and a partial one
    g = torch.Generator().manual_seed(sum(shape) + 1)
    grad = torch.randn(M, N, H, W, generator=g, dtype=torch.float64)
    hidden = torch.randn(M, C, H, W, generator=g, dtype=torch.float64)
    got = conv_sample_gradients(grad, hidden, split=split)  # (M, kh, N, kw, C)
    assert got.shape == (M, 3, N, 3, C)
    patches = unfold3x3(hidden.numpy())  # (M, H W, 9 C)
    positions = grad.numpy().reshape(M, N, H * W)
    for m in range(M):
        assert relative_error(got[m].permute(1, 3, 0, 2).reshape(N, 9 * C), positions[m] @ patches[m]) < 1e-13


def test_conv_moments_float32_sums(gram_route):
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(4, 3, 6, 5, generator=g)
    hidden = torch.randn(4, 2, 6, 5, generator=g).relu()
    got = conv_batch_moments(grad, hidden, variance=True, dtype=torch.float32).as_dict()
    ref = core_batch_moments(conv_gradients(grad.double().numpy()), unfold3x3(hidden.double().numpy()), variance=True).as_dict()
    for field in ("sum_q_sq", "sum_cross", "sum_gram", "sum_xi_sq", "sum_xtx"):
        assert relative_error(got[field], ref[field]) < 1e-5, field
        assert got[field].dtype == torch.float64


def test_conv_float32_sum_of_squares_accumulates_in_float64():
    """``sum ||X_m||^2`` of float32 per-image gradients is summed in float64.  The entries' own float32
    errors are independent and average out over the 590 k squares (measured ~1e-9 relative); a float32
    sum of the squares drifts with their count (1.5e-6 here, 9e-5 on the probe bench's ResNet-8)."""
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(64, 32, 16, 16, generator=g, dtype=torch.float64) + 1.0  # all-positive mean: a drifting sum
    hidden = torch.randn(64, 32, 16, 16, generator=g, dtype=torch.float64).relu()
    exact = conv_batch_moments(grad, hidden).sum_xi_sq
    fast = conv_batch_moments(grad.float(), hidden.float(), dtype=torch.float32).sum_xi_sq
    assert fast.dtype == torch.float64
    assert relative_error(fast, exact) < torch.finfo(torch.float32).eps


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-13), (torch.float32, 1e-5)])
def test_symmetric_gram_equals_product(dtype, tol):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 11, generator=g, dtype=torch.float64)
    ref = x.numpy().T @ x.numpy()
    for view in (x, x.T.contiguous().T, x[::2]):  # contiguous, column-major, strided
        got = gram(view.to(dtype))
        assert got.dtype == torch.float64
        assert torch.equal(got, got.T)  # exactly symmetric on every route (dsyrk or mirrored product)
        ref_view = view.numpy().T @ view.numpy()
        assert relative_error(got, ref_view) < tol
    assert relative_error(gram(x.to(dtype)), ref) < tol
    assert gram(x[:0]).shape == (11, 11) and not gram(x[:0]).any()


def test_probe_conv_route_equals_patch_route():
    """``family="conv"`` (hidden-map route) == the same feature map given as a module (patch route)."""
    model = mt.digits_resnet().double()
    batches = mt.digits_batches(5, 2, dtype=torch.float64)
    name = "layer2.0"
    fast = probe(model, batches, mt.per_sample_ce, candidates=[name], head=False, family="conv", variance=True)
    z = {}
    hook = model.get_submodule(name).register_forward_pre_hook(lambda m, a: z.setdefault("z", a[0]))
    model(batches[0][0])
    hook.remove()
    patches = build_feature_map("conv", z["z"], seed=0)  # an nn.Module: probed as a user feature map
    slow = probe(model, batches, mt.per_sample_ce, candidates=[name], head=False, family=patches, variance=True)
    a, b = fast.statistics[name], slow.statistics[name]
    for field in ("sum_q_sq", "sum_cross", "sum_gram", "sum_xi_sq", "sum_xtx", "sum_batch_grad_norm"):
        assert relative_error(getattr(a, field), getattr(b, field)) < 1e-12, field
    assert a.score().growth_value == pytest.approx(b.score().growth_value, rel=1e-10)


# the last two take the kernel routes (T small against N and r); the first three the X_i route
@pytest.mark.parametrize("shape", [(3, 4, 9, 6), (2, 5, 5, 3), (4, 2, 3, 7), (3, 2, 12, 10), (2, 3, 16, 8)])
@pytest.mark.parametrize("factor", [True, False])
def test_variance_kernel_routes_equal_core(shape, factor):
    """``sum X_i^T X_i`` through the QR factor of ``Q_i^T`` (the CPU's route) or through
    ``K_i Psi_i`` (other devices') (T < N) on rank-deficient ``Q`` (a position with zero
    gradient, like a causal LM's last token) against the core."""
    M, T, N, r = shape
    g = torch.Generator().manual_seed(sum(shape))
    q = torch.randn(M, T, N, generator=g, dtype=torch.float64)
    q[:, -1] = 0.0
    q[0] = q[0, :1]  # sample 0: every position along one direction (rank 1)
    psi = torch.randn(M, T, r, generator=g, dtype=torch.float64)
    got = batch_moments(q, psi, variance=True, factor=factor).as_dict()
    ref = core_batch_moments(q.numpy(), psi.numpy(), variance=True).as_dict()
    for field in ("sum_xi_sq", "sum_xtx", "sum_gram", "sum_cross"):
        assert relative_error(got[field], ref[field]) < 1e-12, field
    assert torch.equal(got["sum_xtx"], got["sum_xtx"].T)


def test_float64_sums_leave_devices_without_float64():
    """Apple's MPS has no float64: its sums and totals go to the CPU; every other device keeps them."""
    assert float64_device(torch.device("mps")) == torch.device("cpu")
    for name in ("cpu", "cuda", "cuda:1", "xpu"):
        assert float64_device(torch.device(name)) == torch.device(name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("variance", [False, True])
def test_grams_added_into_running_totals_equal_returned_grams(dtype, variance):
    """``batch_moments(grams_into=totals)`` (dsyrk with beta = 1 into the totals' upper triangle on the
    CPU in float64) then :func:`complete_lower` == the totals plus the returned Grams."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(4, 3, 12, generator=g, dtype=torch.float64)  # T < N: the QR factor route for sum_xtx
    psi = torch.randn(4, 3, 10, generator=g, dtype=torch.float64)
    start = torch.randn(10, 10, generator=g, dtype=torch.float64)
    start = start + start.T
    totals = {"sum_gram": start.clone(), "sum_xtx": start.clone() * 3}
    got = batch_moments(q.to(dtype), psi.to(dtype), variance=variance, grams_into=totals).as_dict()
    ref = batch_moments(q.to(dtype), psi.to(dtype), variance=variance).as_dict()
    assert "sum_gram" not in got and "sum_xtx" not in got  # added to the totals, or not tracked
    for field in totals:
        complete_lower(totals[field])
        assert torch.equal(totals[field], totals[field].T)
    assert relative_error(totals["sum_gram"], start + ref["sum_gram"]) < 1e-13
    if variance:
        assert relative_error(totals["sum_xtx"], start * 3 + ref["sum_xtx"]) < 1e-13
    else:
        assert torch.equal(totals["sum_xtx"], start * 3)


def test_float32_gram_added_into_a_float64_total_within_its_error_bound():
    """A float32 Gram (``batch_dtype=torch.float32``: one ``ssyrk`` triangle on one CPU thread) added into a
    float64 total equals the float64 product of the same float32 rows within the dot-product bound
    ``|err| <= n eps32 |x|^T |x|`` entrywise (Higham, Accuracy and Stability, eq. 3.5)."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(300, 40, generator=g) * torch.logspace(-3, 3, 40)).float()  # columns on 6 decades
    start = torch.randn(40, 40, generator=g, dtype=torch.float64)
    start = start + start.T
    total = start.clone()
    batch_moments(x[:, None, :1], x[:, None, :], dtype=torch.float32, grams_into={"sum_gram": total})
    complete_lower(total)
    x64 = x.double()
    exact = start + x64.T @ x64
    bound = 300 * np.finfo(np.float32).eps * (x64.abs().T @ x64.abs()) + 1e-12 * start.abs()
    assert torch.equal(total, total.T)
    assert bool(((total - exact).abs() <= bound).all())
    assert float((total - exact).abs().max()) > 0  # the float32 products did round: the bound is what is checked


def test_centred_float32_cross_within_its_error_bound_and_far_below_a_plain_float32_product():
    """``sum_cross`` of float32 rows with float64 sums (a float32 model's default on the CPU:
    :func:`centred_cross`) against the float64 NumPy product of the same rows, features with a common
    offset of 50.  Entrywise within ``(n + 2) eps32 |Q|^T |Psi - 1 m^T|`` (``m`` the float32 mean of the
    rows with a gradient: the centring's rounding plus the dot-product bound, Higham, Accuracy and Stability, eq. 3.5),
    with padded rows (``Q`` and ``Psi`` zero) as without them; and 10x below a plain float32 product's
    error, which grows with the offset (``n eps32 |Q|^T |Psi|``)."""
    g = torch.Generator().manual_seed(12)
    q = torch.randn(3, 100, 8, generator=g)
    psi = 50.0 + torch.randn(3, 100, 30, generator=g) * torch.logspace(-2, 0, 30)
    Q, P = q.reshape(-1, 8).double().numpy(), psi.reshape(-1, 30).double().numpy()
    exact = Q.T @ P
    eps = np.finfo(np.float32).eps
    padding = torch.zeros(3, 20, 8), torch.zeros(3, 20, 30)
    errors = []
    for rows, features in ((q, psi), (torch.cat([q, padding[0]], 1), torch.cat([psi, padding[1]], 1))):
        got = batch_moments(rows, features).sum_cross
        assert got.dtype == torch.float64
        n = rows.shape[0] * rows.shape[1]
        live = rows.reshape(n, 8).ne(0).any(1).float()  # the padded rows leave the mean
        means = (live @ features.reshape(n, 30) / live.sum()).double().numpy()
        bound = (n + 2) * eps * (np.abs(Q).T @ np.abs(P - means))
        assert np.all(np.abs(got.numpy() - exact) <= bound)
        errors.append(np.linalg.norm(got.numpy() - exact))
    plain = (q.reshape(-1, 8).T @ psi.reshape(-1, 30)).double().numpy()
    assert max(errors) < 0.1 * np.linalg.norm(plain - exact)


def test_a_centred_cross_formed_into_zeros_has_the_bits_of_adding_it_to_zeros():
    """A fold's first batch is formed where it lies (``CentredCross.add_to_zeros``) instead of added to the
    fold's zeros: the same bytes, for a float32 model's rows and for a form whose entries are ``-0.0`` (a
    ``-0.0`` product plus ``+0 * m`` with ``m < 0``), which adding to zeros makes ``+0.0``."""
    from satcore.adapters.torch.moments import CentredCross, centred_cross

    g = torch.Generator().manual_seed(3)
    q, psi = torch.randn(40, 6, generator=g), torch.randn(40, 9, generator=g) + 2.0
    signed = CentredCross(torch.full((6, 9), -0.0), torch.zeros(6, dtype=torch.float64), -torch.ones(9))
    assert bool(torch.signbit(signed.formed()).all())
    for cross in (centred_cross(q, psi), signed):
        added = torch.zeros(6, 9, dtype=torch.float64)
        added += cross.formed()
        formed = torch.zeros(6, 9, dtype=torch.float64)
        cross.add_to_zeros(formed)
        assert formed.numpy().tobytes() == added.numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernel_inner_products_equal_per_sample_gradient_norms(dtype):
    """``sum_i <Q_i Q_i^T, Psi_i Psi_i^T>`` (one dsyrk triangle per sample on the CPU in float64)
    == ``sum_i ||Q_i^T Psi_i||^2`` formed explicitly, for contiguous and strided features."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(5, 6, 4, generator=g, dtype=torch.float64)
    psi = torch.randn(5, 9, 6, generator=g, dtype=torch.float64).transpose(1, 2)  # (5, 6, 9), strided
    ref = float(sum((q[i].T @ psi[i]).pow(2).sum() for i in range(5)))
    for features in (psi, psi.contiguous()):
        got = kernel_inner_products(q.to(dtype), features.to(dtype))
        assert got.dtype == torch.float64
        assert float(got) == pytest.approx(ref, rel=1e-13 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("chunk_bytes", [1, 3000])
@pytest.mark.parametrize("variance", [False, True])
def test_conv_moments_with_the_gram_in_image_groups_equal_explicit_patches(monkeypatch, chunk_bytes, variance, gram_route):
    """The CPU's cache-sized image groups of the Gram's FFTs (here one image, or a few, per group) add up to the
    explicit-patch sums, batch norm of eq. (2) included (it is of the whole batch, not a sum of groups)."""
    from satcore.adapters.torch import moments

    monkeypatch.setattr(moments, "CONV_CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(11)
    grad = torch.randn(5, 3, 4, 6, generator=g, dtype=torch.float64)
    hidden = torch.randn(5, 2, 4, 6, generator=g, dtype=torch.float64)
    got = conv_batch_moments(grad, hidden, variance=variance).as_dict()
    ref = core_batch_moments(conv_gradients(grad.numpy()), unfold3x3(hidden.numpy()), variance=variance).as_dict()
    assert set(got) == set(ref) and got["n_samples"] == 5
    for field in set(ref) - {"n_samples"}:
        assert relative_error(got[field], ref[field]) < 1e-12, field
    assert torch.equal(got["sum_gram"], got["sum_gram"].T)


@pytest.mark.parametrize("block", [512, 4])  # one block; blocks of 4 columns with a ragged last one (r = 10)
def test_symmetric_products_on_more_threads_use_torch_and_agree(monkeypatch, block):
    """With torch on 2 threads the Grams and kernels skip SciPy's dsyrk (its BLAS threads would fight
    torch's spinning OpenMP workers) and take torch's product, by blocks of the upper block triangle:
    same values, still exactly symmetric."""
    from satcore.adapters.torch import moments

    monkeypatch.setattr(moments, "GRAM_BLOCK", block)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 3, 12, generator=g, dtype=torch.float64)
    psi = torch.randn(4, 3, 10, generator=g, dtype=torch.float64)
    one = batch_moments(q, psi, variance=True).as_dict()
    assert moments._dsyrk_ready(psi)
    torch.set_num_threads(2)
    try:
        assert not moments._dsyrk_ready(psi)
        two = batch_moments(q, psi, variance=True).as_dict()
        kernels = kernel_inner_products(q, psi)
    finally:
        torch.set_num_threads(1)
    for field in ("sum_cross", "sum_gram", "sum_xi_sq", "sum_xtx"):
        assert relative_error(two[field], one[field]) < 1e-13, field
    for field in ("sum_gram", "sum_xtx"):
        assert torch.equal(two[field], two[field].T)
    assert float(kernels) == pytest.approx(float(kernel_inner_products(q, psi)), rel=1e-13)


@pytest.mark.parametrize("cancelling", [False, True])
def test_conv_moments_of_float32_maps_within_the_float32_product_bound(cancelling):
    """Float32 maps with float64 sums (the default probe of a float32 model on the CPU) take the per-image
    gradients ``X_m`` as float32 products of length ``K = HW``, summed over the images in float64.  Against
    the float64 sums of the same float32 numbers: ``sum_cross`` within the float32 dot-product bound
    ``gamma_K sum_m |G_m| |U_m|^T`` entry by entry (Higham, Section 3.1), ``sum ||X_m||^2`` within
    ``sum_m (2 ||X_m|| + d_m) d_m`` with ``d_m = gamma_K || |G_m| |U_m|^T ||``, every other field float64
    round-off.  ``cancelling``: the second half of the images nearly undoes the first (a saturated
    candidate), so the entrywise bound is thousands of times ``sum_cross``'s size."""
    M, N, C, H, W = 8, 3, 4, 12, 10
    g = torch.Generator().manual_seed(7)
    grad = torch.randn(M, N, H, W, generator=g)
    hidden = torch.randn(M, C, H, W, generator=g).relu()
    if cancelling:
        grad[M // 2 :] = -grad[: M // 2] * (1 + 1e-3 * torch.randn(M // 2, N, H, W, generator=g))
        hidden[M // 2 :] = hidden[: M // 2]
    got = conv_batch_moments(grad, hidden).as_dict()
    g64, h64 = grad.double().numpy(), hidden.double().numpy()
    exact = core_batch_moments(conv_gradients(g64), unfold3x3(h64)).as_dict()
    gamma = H * W * EPS32 / (1 - H * W * EPS32)
    per_image = [np.abs(g64[m].reshape(N, H * W)) @ np.abs(unfold3x3(h64[m : m + 1])[0]) for m in range(M)]
    kappa = np.linalg.norm(sum(per_image)) / np.linalg.norm(exact["sum_cross"])
    assert kappa > (1e3 if cancelling else 1.5)  # the cancellation the case stands for
    assert np.all(np.abs(got["sum_cross"].numpy() - exact["sum_cross"]) <= gamma * sum(per_image))
    sample_norms = [np.linalg.norm(g64[m].reshape(N, H * W) @ unfold3x3(h64[m : m + 1])[0]) for m in range(M)]
    bound = sum((2 * x + gamma * np.linalg.norm(a)) * gamma * np.linalg.norm(a) for x, a in zip(sample_norms, per_image))
    assert abs(float(got["sum_xi_sq"]) - exact["sum_xi_sq"]) <= bound
    for field in ("sum_q_sq", "sum_gram", "batch_grad_norm"):
        assert relative_error(got[field], exact[field]) < 1e-12, field
