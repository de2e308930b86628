"""Per-batch sums on the model's device, in float64.

:func:`batch_moments` is the torch twin of :func:`satcore.batch_moments`
(same fields, same choice of the cheaper ``sum ||X_i||^2`` route); it runs in
``dtype`` (float64 by default, float32 for speed) and returns a
:class:`satcore.BatchMoments` of float64 tensors on the input's device (0-d for
the scalars), which :class:`.running.RunningSums` adds up without leaving the device.  :func:`conv_batch_moments` gives the
same sums for the ``conv`` family straight from the hidden map, without
forming the patches.

Position subsampling (:func:`subsample_positions`): keep ``T'`` of ``T``
positions, drawn uniformly without replacement once per batch, and scale
both ``q`` and ``psi`` by ``sqrt(T / T')``.  Each position is kept with
probability ``T'/T``, so every sum that is linear in the position products
``q_t psi_t^T``, ``psi_t psi_t^T`` and ``||q_t||^2`` (``sum_cross``,
``sum_gram``, ``sum_q_sq``) is unbiased.  ``sum_xi_sq`` and ``sum_xtx`` then
describe the per-sample spread of the SUBSAMPLED gradient, which is the
variance the finite-sample test needs for the estimator actually used.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

from satcore import BatchMoments
from satcore import adapter_api
from satcore.adapter_api import PackedGram, forms_sample_gradients


def float64_device(device: torch.device) -> torch.device:
    """Where float64 sums of tensors on ``device`` live: that device, except Apple's MPS (no float64)."""
    return torch.device("cpu") if device.type == "mps" else device


def _float64(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(float64_device(x.device), torch.float64)


SQUARES_CHUNK = 1 << 17  # CPU: entries per float64 conversion of :func:`squared_norm` (1 MB, in cache)


def squared_norm(x: torch.Tensor) -> torch.Tensor:
    """``||x||^2`` in float64 (0-d, on :func:`float64_device`), read in ``x``'s own memory order.

    A float32 entry's square is exact in float64 (24-bit significands), so
    this is the float64 sum of the exact squares whatever ``x``'s dtype.  On
    the CPU a tensor not already float64 is converted :data:`SQUARES_CHUNK`
    entries at a time into one reused buffer instead of as a whole: a probe
    squares each candidate's stream and block update every batch, and a
    whole float64 copy of a ResNet-8 map (8 MB) is fresh pages written
    then read (0.8 against 0.5 ms for the chunks on one core, more with the
    page faults of a probe's churning allocations).
    """
    flat = _memory_order(x.detach()).reshape(-1)
    if flat.dtype == torch.float64 or flat.device.type != "cpu" or flat.numel() <= SQUARES_CHUNK:
        flat = _float64(flat)
        return torch.dot(flat, flat)
    total = torch.zeros((), dtype=torch.float64)
    buffer = torch.empty(SQUARES_CHUNK, dtype=torch.float64)
    for part in flat.split(SQUARES_CHUNK):
        converted = buffer[: part.numel()].copy_(part)
        total += torch.dot(converted, converted)
    return total


def _memory_order(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its dimensions permuted by decreasing stride: a view that is contiguous whenever ``x`` is
    dense in some order (a channels-last map, a transposed matrix), so that flattening it copies nothing."""
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    return x.permute(order)


def _sums_device(dtype, device: torch.device) -> torch.device:
    """Where sums in ``dtype`` of tensors on ``device`` are formed: :func:`float64_device` for float64."""
    return float64_device(device) if dtype == torch.float64 else device


def _in_dtype(dtype, *tensors):
    """``tensors`` in ``dtype``, moved to :func:`float64_device` when that is float64."""
    return [t.to(_sums_device(dtype, t.device), dtype) for t in tensors]


def mirror_upper(x: torch.Tensor) -> torch.Tensor:
    """The exactly symmetric matrix with ``x``'s upper triangle.

    A general product ``x^T x`` is symmetric only to round-off; running totals
    of exactly symmetric batches stay exactly symmetric (as dumps require) and
    add up the same way whether or not a probe was resumed.
    """
    return x.triu() + x.triu(1).T


def _upper_ready(x: torch.Tensor) -> bool:
    """Whether ``x``'s Grams are added by upper triangle (:func:`add_gram`): float64 on the CPU."""
    return x.device.type == "cpu" and x.dtype == torch.float64 and x.shape[0] > 0


def _dsyrk_ready(x: torch.Tensor) -> bool:
    """Whether ``x``'s symmetric products go to SciPy's BLAS ``dsyrk`` (half the flops of torch's product).

    Only while torch runs one thread: with more, torch's OpenMP workers spin
    between its own ops and starve SciPy's BLAS threads (a float32 product
    then a ``dsyrk`` took 83 ms on 2 threads against 26 ms for the two
    apart), so products stay in torch's own thread pool.
    """
    return _upper_ready(x) and torch.get_num_threads() == 1


def _ssyrk_ready(x: torch.Tensor) -> bool:
    """Whether float32 rows ``x`` go to SciPy's ``ssyrk`` (one thread, as :func:`_dsyrk_ready`)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.shape[0] > 0 and torch.get_num_threads() == 1


GRAM_BLOCK = 512  # columns per block of the upper block triangle torch computes on several threads


def gram(x: torch.Tensor) -> torch.Tensor:
    """``x^T x`` (float64, on ``x``'s device, exactly symmetric) for ``x`` ``(n, r)``.

    On CPU in float64 this is :func:`add_gram` into zeros (the product is
    symmetric: one triangle, about half the flops of a general product) and
    :func:`complete_lower`.  torch has no symmetric rank-k update on other
    devices, where it is the general product, mirrored.
    """
    if not _upper_ready(x):
        return mirror_upper(_float64(x.T @ x))
    total = torch.zeros((x.shape[1], x.shape[1]), dtype=torch.float64)
    add_gram(total, x)
    complete_lower(total)
    return total


def complete_lower(total: torch.Tensor) -> None:
    """Copy ``total``'s upper triangle onto its lower one, in place, after :func:`add_gram`.

    Only CPU totals need it (elsewhere :func:`add_gram` adds whole symmetric
    Grams); row by row, 3x faster than forming the mirrored matrix.
    """
    if total.device.type == "cpu":
        adapter_api.complete_lower(total.numpy())


def packs_grams(device: torch.device) -> bool:
    """Whether fresh Gram totals on ``device`` are held packed (:func:`packed_zeros`): on the CPU with torch
    on one thread, where :func:`add_gram`'s packed update is one LAPACK ``dsfrk``, as fast as the
    ``dsyrk`` of the whole matrix (13.4 against 13.2 ms at ``n = 512``, ``r = 1024``).  On more threads
    the packed update would go through a whole-matrix temporary (a third slower on 2 threads)."""
    return device.type == "cpu" and torch.get_num_threads() == 1


def packed_zeros(r: int) -> torch.Tensor:
    """An ``r x r`` symmetric total of zeros held packed: the ``r (r + 1) / 2`` float64 entries of its
    upper triangle in LAPACK's rectangular full packed form (``transr='N'``, lower triangle of the
    column-major matrix, which is the row-major upper one), half the bytes of the matrix."""
    return torch.zeros(r * (r + 1) // 2, dtype=torch.float64)


def add_packed(packed: torch.Tensor, upper: torch.Tensor) -> None:
    """``packed += upper`` for a :func:`packed_zeros` total and an ``r x r`` float64 CPU matrix of which
    only the upper triangle is read (LAPACK ``dtrttf``; the same additions as on the whole matrix)."""
    from scipy.linalg.lapack import dtrttf

    triangle, _ = dtrttf(upper.detach().contiguous().numpy().T, transr="N", uplo="L")
    packed += torch.from_numpy(triangle)


def unpacked(packed: torch.Tensor, r: int) -> np.ndarray:
    """The exactly symmetric ``r x r`` C-ordered float64 matrix of a :func:`packed_zeros` total (``dtfttr``)."""
    return PackedGram(packed.numpy(), r).whole()


def add_gram(total: torch.Tensor, x: torch.Tensor) -> None:
    """``total += x^T x`` in ``total``'s UPPER triangle at least; :func:`complete_lower` makes it whole.

    On CPU in float64 (``total`` a C-ordered float64 CPU tensor), with torch
    on one thread, this is one ``dsyrk`` with ``beta = 1`` straight into
    ``total`` (its transpose is the Fortran-ordered lower triangle BLAS
    writes): no ``r x r`` temporary, no mirroring and no separate addition
    per batch, 25% of the Gram's time at ``r = 1024``.  On more threads it is
    torch's ``addmm_`` into the blocks of the upper block triangle
    (:data:`GRAM_BLOCK` columns a block: 3 of 4 block products at
    ``r = 1024``), in torch's thread pool (:func:`_dsyrk_ready`).  Float32
    rows (``batch_dtype=torch.float32``) on one CPU thread are one ``ssyrk``
    (float32 products at twice the float64 rate, half the multiply-adds of a
    general product) whose triangle is added to the float64 total.  Elsewhere
    the exactly symmetric :func:`gram` is added.  A total held packed
    (:func:`packed_zeros`, 1-d) takes one LAPACK ``dsfrk`` (the same
    symmetric rank-k update on the packed form) where ``dsyrk`` would run,
    else the batch's triangle from this routine into zeros, packed and added.
    """
    x = x.detach()
    if total.dim() == 1:
        r = x.shape[1]
        if _dsyrk_ready(x):
            from scipy.linalg.lapack import dsfrk

            dsfrk(r, x.shape[0], 1.0, x.contiguous().numpy().T, 1.0, total.numpy(), transr="N", uplo="L",
                  trans="N", overwrite_c=1)
            return
        upper = torch.zeros((r, r), dtype=torch.float64)
        add_gram(upper, x)
        add_packed(total, upper)
        return
    if _ssyrk_ready(x) and total.device.type == "cpu" and total.is_contiguous():
        from scipy.linalg.blas import ssyrk

        # the float32 triangle (Fortran lower: C-ordered upper), added into the float64 total
        np.add(total.numpy(), ssyrk(1.0, x.contiguous().numpy().T, trans=0, lower=1).T, out=total.numpy())
        return
    if not (_upper_ready(x) and total.device.type == "cpu" and total.is_contiguous()):
        total += gram(x)
        return
    if _dsyrk_ready(x):
        from scipy.linalg.blas import dsyrk

        dsyrk(1.0, x.contiguous().numpy().T, beta=1.0, c=total.numpy().T, trans=0, lower=1, overwrite_c=1)
        return
    r = x.shape[1]
    for i in range(0, r, GRAM_BLOCK):
        for j in range(i, r, GRAM_BLOCK):
            total[i : i + GRAM_BLOCK, j : j + GRAM_BLOCK].addmm_(x[:, i : i + GRAM_BLOCK].T, x[:, j : j + GRAM_BLOCK])


def _centred_cross_ready(q: torch.Tensor, psi: torch.Tensor, dtype) -> bool:
    """Whether :func:`batch_moments` takes ``sum_cross`` from :func:`centred_cross`: float32 rows on the CPU
    (a float32 model's) whose sums are asked for in float64."""
    return (dtype == torch.float64 and q.dtype == psi.dtype == torch.float32 and q.device.type == "cpu"
            and q.numel() > 0 and psi.numel() > 0)


@dataclass(frozen=True)
class CentredCross:
    """``Q^T Psi`` (``N x r``) as :func:`centred_cross` takes it, not yet formed: the float32 product
    ``Q^T (Psi - 1 m^T)`` of the centred features, ``Q^T 1`` (float64) and the centre ``m`` (float32).

    Half the bytes of the float64 matrix it stands for: the probe's running
    sums hold a batch's ``sum_cross`` this way until its fold is written
    (:class:`.running.RunningSums`), so the folds the batches reach since the
    last sync take half their float64 memory while the model's graph is held
    (25 MB less at a GPT-2 probe's peak, 8 candidates, ``N = 256``, ``r = 1024``).
    """

    product: torch.Tensor
    column_sums: torch.Tensor
    means: torch.Tensor

    def formed(self) -> torch.Tensor:
        """``Q^T (Psi - 1 m^T) + (Q^T 1) m^T`` in float64: the same bits whenever it is formed."""
        return _float64(self.product).addr_(self.column_sums, self.means.to(torch.float64))

    def add_to_zeros(self, zeros: torch.Tensor) -> None:
        """``zeros += self.formed()`` for a float64 CPU tensor of zeros, formed where it lies: the float32
        product converted straight into it, the rank-one term added there, then ``+ 0`` (what adding to zeros
        does to a ``-0.0``): the same bits, without a float64 temporary, and fresh pages (a lazily mapped
        fold's) written first instead of read (4.8 against 7.2 ms for a GPT-2 candidate's 4 folds)."""
        zeros.copy_(self.product).addr_(self.column_sums, self.means.to(torch.float64)).add_(0.0)


def formed_cross(cross) -> torch.Tensor:
    """``sum_cross`` of a batch as a float64 tensor (:meth:`CentredCross.formed` where it is one)."""
    return cross.formed() if isinstance(cross, CentredCross) else cross


def centred_cross(q: torch.Tensor, psi: torch.Tensor) -> CentredCross:
    """``Q^T Psi`` of float32 rows ``q`` ``(n, N)`` and ``psi`` ``(n, r)``, from one float32 product of
    the centred features (:meth:`CentredCross.formed` gives it, float64 ``N x r``).

    For any float32 ``m``, ``Q^T Psi = Q^T (Psi - 1 m^T) + (Q^T 1) m^T``
    exactly; the first term is a float32 product, the rank-one second is
    formed in float64.  A float32 product's round-off grows with the
    magnitude of what it sums, and centring takes out the features' common
    offset, which sets that magnitude: ``m`` is the features' mean over the
    rows whose gradient is not zero (a row with a zero gradient adds
    nothing to ``C`` whatever ``m``, so padded rows, ``q`` and ``psi`` zero,
    do not pull the mean toward zero).  On the GPT-2 of the masks test,
    growth values of a padded batch and of its samples one per batch agreed
    to 1.5e-6 this way against 2.0e-5 for a plain float32 product (``mlp``
    family; 1e-5 is the test's bound; float64 products: 3.5e-7).  Half the multiply-add time
    of the float64 product (3.7 against 6.1 ms at ``n = 512``, ``N = 256``,
    ``r = 1024`` on one CPU thread).
    """
    live = q.ne(0).any(1).to(psi.dtype)
    means = (live @ psi) / live.sum().clamp(min=1)
    return CentredCross(q.T @ (psi - means), q.sum(0, dtype=torch.float64), means)


def kernel_inner_products(q: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """``sum_i <Q_i Q_i^T, Psi_i Psi_i^T>_F`` (``= sum_i ||Q_i^T Psi_i||_F^2``), float64, 0-d.

    Both ``T x T`` kernels ``K_i = Q_i Q_i^T`` and ``P_i = Psi_i Psi_i^T`` are
    symmetric: on the CPU in float64 each is one ``dsyrk`` (its upper triangle,
    ``K^u_i`` and ``P^u_i``, zeros below: half the multiply-adds of the product,
    which is most of this sum's cost) and
    ``<K_i, P_i> = 2 <K^u_i, P^u_i> - <diag K_i, diag P_i>``, one dot product of
    the triangles as BLAS wrote them (no stacked copy, no elementwise product):
    2.8 against 3.6 ms a GPT-2 candidate and batch (``T = 128``, ``N = 256``,
    ``r = 1024``, 4 samples) with ``K_i`` as a general product.
    """
    if not (_dsyrk_ready(psi) and psi.shape[1] > 0):
        kq = q @ q.transpose(1, 2)
        return _float64((kq * (psi @ psi.transpose(1, 2))).sum(dtype=torch.float64))
    from scipy.linalg.blas import dsyrk

    qs, ps = q.detach().contiguous().numpy(), psi.detach().contiguous().numpy()
    total = 0.0
    for q_i, p_i in zip(qs, ps):
        kq, kp = dsyrk(1.0, q_i.T, trans=1, lower=0), dsyrk(1.0, p_i.T, trans=1, lower=0)  # both Fortran-ordered
        total += 2.0 * float(np.dot(kq.ravel(order="K"), kp.ravel(order="K"))) - float(
            np.dot(np.diagonal(kq), np.diagonal(kp)))
    return torch.tensor(total, dtype=torch.float64)


def batch_moments(q: torch.Tensor, psi: torch.Tensor, *, variance: bool = False, dtype=torch.float64,
                  factor: bool | None = None, grams_into: dict | None = None,
                  cross_formed: bool = True) -> BatchMoments:
    """Sums of one batch (``satcore.batch_moments``'); ``q`` ``(M, T, N)``, ``psi`` ``(M, T, r)``.

    ``sum_q_sq = sum ||Q_i||^2``, ``sum_cross = sum Q_i^T Psi_i``,
    ``sum_gram = sum Psi_i^T Psi_i``, ``sum_xi_sq = sum ||X_i||_F^2`` and, when
    ``variance``, ``sum_xtx = sum X_i^T X_i`` with ``X_i = Q_i^T Psi_i``, plus
    the eq. (2) batch norm ``||Q_b||_F / |b|``.  As in the core, ``X_i`` is
    formed only when cheaper than the ``T x T`` kernel ``K_i = Q_i Q_i^T``
    (``||X_i||^2 = <K_i, Psi_i Psi_i^T>``, ``X_i^T X_i = Psi_i^T K_i Psi_i``).
    With ``variance`` and ``factor`` (default: on the CPU) the kernel is used
    through its factor ``R_i`` (QR of ``Q_i^T``, ``K_i = R_i^T R_i``):
    ``Y_i = R_i Psi_i`` has ``Y_i^T Y_i = X_i^T X_i`` and ``min(N, T)`` rows, so
    ``sum X_i^T X_i`` is one symmetric product.  Off the CPU there is no
    symmetric product and a batched QR costs more than it saves, so
    ``W_i = K_i Psi_i`` and ``sum X_i^T X_i = Psi^T W`` (mirrored) instead.
    ``grams_into`` (running float64 totals by field name): ``sum_gram`` and the
    symmetric-product ``sum_xtx`` are added into those totals' upper
    triangles by :func:`add_gram` instead (the moments then hold ``None`` for them).
    ``cross_formed=False``: a ``sum_cross`` from :func:`centred_cross` stays a
    :class:`CentredCross` (half the bytes until it is added, :func:`formed_cross`).
    """
    M, T, N = q.shape
    r = psi.shape[2]
    # of the float32 rows as given, before the float64 copies
    cross = None
    if _centred_cross_ready(q, psi, dtype):
        cross = centred_cross(q.reshape(M * T, N), psi.reshape(M * T, r))
        cross = cross if not cross_formed else cross.formed()
    q, psi = _in_dtype(dtype, q, psi)
    factor = q.device.type == "cpu" if factor is None else factor
    q2, p2 = q.reshape(M * T, N), psi.reshape(M * T, r)
    if cross is None:
        cross = _float64(q2.T @ p2)
    sum_q_sq = squared_norm(q2)  # float64 accumulation in any batch dtype
    out = {
        "n_samples": M,
        "n_vectors": M * T,
        "sum_q_sq": sum_q_sq,
        "sum_cross": cross,
        "batch_grad_norm": sum_q_sq.sqrt() / M,
    }

    def symmetric_sum(field, x):
        if grams_into is not None and field in grams_into:
            add_gram(grams_into[field], x)
        else:
            out[field] = gram(x)

    symmetric_sum("sum_gram", p2)
    # kernel_inner_products takes the Psi_i Psi_i^T as dsyrk triangles where it can
    if forms_sample_gradients(T, N, r, variance=variance, factor=factor, half_kernels=_dsyrk_ready(psi)):
        X = (q.transpose(1, 2) @ psi).reshape(M * N, r)
        out["sum_xi_sq"] = squared_norm(X)
        if variance:
            symmetric_sum("sum_xtx", X)
    elif variance and factor:
        Y = (torch.linalg.qr(q.transpose(1, 2), mode="r")[1] @ psi).reshape(M * min(N, T), r)  # R_i Psi_i
        out["sum_xi_sq"] = squared_norm(Y)
        symmetric_sum("sum_xtx", Y)
    elif variance:
        W = (q @ q.transpose(1, 2)) @ psi  # K_i Psi_i
        out["sum_xi_sq"] = _float64((W * psi).sum())
        out["sum_xtx"] = mirror_upper(_float64(p2.T @ W.reshape(M * T, r)))
    else:
        out["sum_xi_sq"] = kernel_inner_products(q, psi)
    return BatchMoments(**{"sum_gram": None} | out)  # None: added into grams_into


class _FlatImages:
    """Images ``(M, C, H, W)`` laid out so that every shift of up to 2 pixels is a plain offset.

    Each image gets two zero columns and two zero rows (pitch ``P = W + 2``,
    ``L = (H + 2) P`` entries per image), images follow each other, and a zero
    margin of ``2P + 2`` entries sits at both ends.  Then pixel ``(a + dh,
    b + dw)`` of an image is entry ``u + dh P + dw`` of pixel ``(a, b)`` at
    ``u``, for ``|dh|, |dw| <= 2``, and a shift that leaves the image lands on
    a zero, never on another image: the zero padding of a 3x3 ``unfold``.
    """

    def __init__(self, x: torch.Tensor, dtype):
        M, C, H, W = x.shape
        self.M, self.C, self.H, self.W = M, C, H, W
        self.pitch = W + 2
        self.length = (H + 2) * self.pitch
        self.margin = 2 * self.pitch + 2
        self.data = x.new_zeros((C, 2 * self.margin + M * self.length), dtype=dtype)
        self.data[:, self.margin : self.margin + M * self.length].view(C, M, H + 2, self.pitch)[:, :, :H, :W] = (
            x.transpose(0, 1)
        )

    def shifted(self, dh: int, dw: int) -> torch.Tensor:
        """``(C, M L)``: entry ``u`` is the pixel ``(dh, dw)`` away from the pixel at ``u``."""
        start = self.margin + dh * self.pitch + dw
        return self.data[:, start : start + self.M * self.length]

    def per_image(self, dh: int, dw: int) -> torch.Tensor:
        """:meth:`shifted` as ``(M, C, L)`` (one matrix per image, no copy)."""
        start = self.data.storage_offset() + self.margin + dh * self.pitch + dw
        return self.data.as_strided((self.M, self.C, self.length), (self.length, self.data.stride(0), 1), start)


CONV_FFT_BYTES = 32 << 20  # the largest cross-spectra (C^2 per frequency) the FFT route may hold


def _fft_size(n: int) -> int:
    """The smallest ``2^a 3^b 5^c >= n``: FFTs of such lengths are the fast ones."""
    size = n
    while True:
        rest = size
        for p in (2, 3, 5):
            while rest % p == 0:
                rest //= p
        if rest == 1:
            return size
        size += 1


def channel_correlations(x: torch.Tensor, step: int | None = None, dtype=None) -> torch.Tensor:
    """``S[dh + 2, dw + 2] = sum_m sum_u x_m[u] x_m[u + d]^T`` (``C x C``) for ``|dh|, |dw| <= 2``.

    ``x`` ``(M, C, H, W)`` is zero outside each image; ``step`` images go
    through at a time (default: all), each group converted to ``dtype``
    (default: ``x``'s) as it is copied into the zero-padded grid the FFTs
    read, so a float32 map never has a whole float64 copy.  By the correlation theorem, over an
    ``n_h x n_w`` grid with ``n >= H + 2`` (so that lags up to 2 never wrap
    onto the image), ``S_d`` is the inverse DFT at lag ``-d`` of the
    cross-spectra ``P(f) = sum_m X_m(f) X_m(f)^H``: one real FFT per image and
    channel, one ``C x M`` by ``M x C`` complex product per frequency (4 real
    multiply-adds per pixel and pair of channels, the other half of the
    spectrum being its conjugate, instead of 13 for the 13 shifted products
    ``S_d``, ``S_{-d} = S_d^T``), and the 25 wanted lags of the inverse as one
    product with their DFT weights (a conjugate pair of frequencies counted
    twice, by its real part).  The cross-spectra take ``C^2 n_h n_w / 2``
    complex numbers, ``n_h n_w / 81`` times the Gram: past
    :data:`CONV_FFT_BYTES` (large maps), and on Apple's MPS, the shifted
    products are used.
    """
    M, C, H, W = x.shape
    n_h, n_w = _fft_size(H + 2), _fft_size(W + 2)
    step = step or M
    dtype = dtype or x.dtype
    spectra_bytes = C * C * n_h * (n_w // 2 + 1) * 2 * dtype.itemsize
    # Apple's MPS (float32 sums only) has partial complex support: it keeps the real products
    if spectra_bytes > CONV_FFT_BYTES or _sums_device(dtype, x.device).type == "mps":
        return _shifted_correlations(x, step, dtype)
    cross = None
    # only [..., :H, :W] is ever written
    grid = torch.zeros((min(step, M), C, n_h, n_w), dtype=dtype, device=_sums_device(dtype, x.device))
    for start in range(0, M, step):
        images = grid[: min(step, M - start)]
        images[..., :H, :W] = x[start : start + step]
        spectra = torch.fft.rfft2(images)  # (m, C, n_h, n_w // 2 + 1)
        per_frequency = spectra.permute(2, 3, 1, 0).reshape(-1, C, spectra.shape[0]).contiguous()
        if cross is None:
            cross = torch.bmm(per_frequency, per_frequency.mH)
        else:
            cross.baddbmm_(per_frequency, per_frequency.mH)
    # the real parts of the 13 lags' sums as ONE real product: [Re w, -Im w] by [Re P; Im P], frequency by frequency
    parts = torch.view_as_real(cross).view(-1, C * C, 2).transpose(1, 2).reshape(-1, C * C)
    return _from_half_lags((_lag_weights(n_h, n_w, dtype, grid.device) @ parts).view(len(HALF_LAGS), C, C))


HALF_LAGS = [(dh, dw) for dh in range(3) for dw in range(-2, 3) if dh or dw >= 0]  # the other 12: S_{-d} = S_d^T


def _from_half_lags(half: torch.Tensor) -> torch.Tensor:
    """``(5, 5, C, C)`` correlations ``S_d`` from those of :data:`HALF_LAGS` (``half[i]`` = ``S_d``), ``S_{-d} = S_d^T``."""
    S = half.new_empty((5, 5) + half.shape[1:])
    for i, (dh, dw) in enumerate(HALF_LAGS):
        S[dh + 2, dw + 2] = half[i]
        if i:
            S[2 - dh, 2 - dw] = half[i].T
    return S


@functools.lru_cache(maxsize=64)
def _lag_weights(n_h: int, n_w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(13, 2 n_h (n_w // 2 + 1))``: real inverse-DFT weights of the lags :data:`HALF_LAGS` on a half spectrum.

    The complex weight of lag ``d`` at frequency ``f`` is
    ``w = e^{-2 pi i f d / n} / (n_h n_w)`` (``P(f) = X X^H`` is the spectrum of
    lag ``-d``), doubled where the column's conjugate is the half left out;
    ``S_d = Re sum_f w P(f) = sum_f (Re w Re P - Im w Im P)``, so row ``d``
    holds ``Re w, -Im w`` for each frequency in turn (the order of
    ``view_as_real``): a real product, a quarter of the multiply-adds of the
    complex one whose imaginary part was discarded, for half the lags.
    Cached: a probe asks for the same few grids every batch.
    """
    real = torch.float64 if dtype == torch.float64 else torch.float32
    lag_h = torch.tensor([dh for dh, _ in HALF_LAGS], dtype=real, device=device)
    lag_w = torch.tensor([dw for _, dw in HALF_LAGS], dtype=real, device=device)
    f_h = torch.arange(n_h, dtype=real, device=device)
    f_w = torch.arange(n_w // 2 + 1, dtype=real, device=device)
    pairs = torch.full_like(f_w, 2.0)
    pairs[0] = 1.0
    if n_w % 2 == 0:
        pairs[-1] = 1.0  # the Nyquist column is its own conjugate
    phase = lag_h[:, None, None] * f_h[:, None] / n_h + lag_w[:, None, None] * f_w / n_w  # (13, n_h, n_w // 2 + 1)
    weights = torch.polar(pairs / (n_h * n_w) * torch.ones_like(phase), -2 * math.pi * phase).reshape(len(HALF_LAGS), -1)
    return torch.stack([weights.real, -weights.imag], 2).reshape(len(HALF_LAGS), -1).contiguous()


def _shifted_correlations(x: torch.Tensor, step: int, dtype) -> torch.Tensor:
    """:func:`channel_correlations` as 13 products ``S_d`` of ``C x ML`` by ``ML x C`` (``S_{-d} = S_d^T``)."""
    M, C, H, W = x.shape
    half = torch.zeros((len(HALF_LAGS), C, C), dtype=dtype, device=_sums_device(dtype, x.device))
    for start in range(0, M, step):
        flat = _FlatImages(*_in_dtype(dtype, x[start : start + step]), dtype)
        base = flat.shifted(0, 0)
        for i, (dh, dw) in enumerate(HALF_LAGS):
            half[i] += base @ flat.shifted(dh, dw).T
    return _from_half_lags(half)


def _line_correlations(lines: torch.Tensor) -> torch.Tensor:
    """``out[r, s] = sum_m sum_j x[m, :, r, j] x[m, :, r, j + s - 2]^T`` (``C x C``) for ``lines`` ``(M, C, R, n)``.

    The lines of all images follow each other with two zeros after each, so a
    shift of up to 2 never reaches another image: the shifts 0, 1 and 2 are
    ONE batched ``C x M(n + 2)`` by ``M(n + 2) x 3C`` product with the three
    shifted copies stacked, and ``out[r, 2 - s] = out[r, 2 + s]^T``.  A fifth of
    the products of five separate shifts (each a ``C``-column product at
    MKL's small-matrix rate), a fifteenth of an ``einsum`` over copied windows.
    """
    M, C, R, n = lines.shape
    length = M * (n + 2)
    flat = torch.nn.functional.pad(lines, (0, 2)).permute(2, 1, 0, 3).reshape(R, C, length)
    flat = torch.nn.functional.pad(flat, (0, 2))  # (R, C, length + 2): room for the shifts of the last line
    shifted = flat.unfold(2, length, 1).reshape(R, 3 * C, length)  # row c * 3 + s: x_c shifted by s
    ahead = torch.bmm(flat[:, :, :length], shifted.transpose(1, 2)).view(R, C, C, 3).permute(0, 3, 1, 2)
    return torch.cat([ahead[:, 1:].flip(1).transpose(2, 3), ahead], 1)


def conv_gram(x: torch.Tensor, step: int | None = None, dtype=None) -> torch.Tensor:
    """``sum_m U_m U_m^T`` (``9C x 9C``, unfold order) of the zero-padded 3x3 patches ``U_m`` of ``x`` ``(M, C, H, W)``.

    Block ``(k, k')`` (kernel offsets ``k = (kh, kw)``) is
    ``sum_p x[p + k - 1] x[p + k' - 1]^T`` over the ``H x W`` output grid.  With
    ``d = k' - k`` it is the full-map channel correlation ``S_d``
    (:func:`channel_correlations`, 25 lags) minus the pixels the window of
    ``k`` leaves out: the last row for ``kh = 0``, the first for ``kh = 2``
    (likewise columns for ``kw``).  A left-out row only pairs with a pixel
    inside the map when ``kh' = kh``, so the exact corrections are one row
    correlation per ``(kh, kw' - kw)``, one column correlation per
    ``(kw, kh' - kh)`` and, where both apply with ``k' = k``, the corner
    pixel added back (inclusion-exclusion).  Symmetric to round-off (the
    FFT computes ``S_d`` and ``S_{-d}`` apart).  ``step``: images per FFT pass;
    ``dtype`` (default: ``x``'s): the sums', into which each group of images,
    border line and corner pixel is converted as it is read.

    The diagonal is set to the exact sums of squares (nine window sums of
    ``x^2``), and a feature that is exactly zero on every image (a dead ReLU
    channel, or an offset that only reads zero padding and zero pixels) gets an
    exactly zero row and column: the FFT leaves such features at round-off
    (+-1e-18 of the largest entry in float64), which the Jacobi scaling of the
    rank cut would blow up into O(1) entries of an indefinite matrix.
    """
    M, C, H, W = x.shape
    dtype = dtype or x.dtype
    step = step or M
    correlations = channel_correlations(x, step, dtype)
    k = torch.arange(3, device=correlations.device)
    lag = k[None, :] - k[:, None] + 2  # [k, k'] -> index of k' - k
    blocks = correlations[lag[:, None, :, None], lag[None, :, None, :]]  # (kh, kw, kh', kw', C, C)
    edges = {0: -1, 2: 0}  # kernel offset -> the row / column its window leaves out
    rows = _line_correlations(*_in_dtype(dtype, torch.stack([x[:, :, e] for e in edges.values()], 2)))  # (2, 5, C, C)
    cols = _line_correlations(*_in_dtype(dtype, torch.stack([x[:, :, :, e] for e in edges.values()], 2)))
    for i, offset in enumerate(edges):
        blocks[offset, :, offset, :] -= rows[i][lag]  # kh = kh' = offset
        blocks[:, offset, :, offset] -= cols[i][lag]  # kw = kw' = offset
    corners = list(itertools.product(edges.items(), edges.items()))
    pixels, = _in_dtype(dtype, torch.stack([x[:, :, row, col] for (_, row), (_, col) in corners], 2))  # (M, C, 4)
    for ((kh, _), (kw, _)), product in zip(corners, torch.einsum("mci,mdi->icd", pixels, pixels)):
        blocks[kh, kw, kh, kw] += product
    out = blocks.permute(4, 0, 1, 5, 2, 3).reshape(9 * C, 9 * C)
    squares = sum(images.square().sum(0) for images in _image_groups(x, step, dtype))
    energy = torch.nn.functional.pad(squares, (1, 1, 1, 1))  # (C, H + 2, W + 2)
    diagonal = torch.stack([energy[:, kh : kh + H, kw : kw + W].sum((1, 2)) for kh, kw in np.ndindex(3, 3)], 1)
    diagonal = diagonal.reshape(9 * C)  # unfold order: channel, then kernel offset
    alive = (diagonal != 0).to(out.dtype)
    out *= alive[:, None] * alive[None, :]  # one pass, no boolean indexing (and no device sync off the CPU)
    out.diagonal().copy_(diagonal)
    return out


def _float32_products_ready(grad: torch.Tensor, hidden: torch.Tensor, dtype) -> bool:
    """Whether :func:`conv_batch_moments` forms the per-image gradients ``X_m`` as float32 products: float32
    maps on the CPU (a float32 model's) whose sums are asked for in float64."""
    return (dtype == torch.float64 and grad.dtype == hidden.dtype == torch.float32 and grad.device.type == "cpu"
            and hidden.device.type == "cpu")


def _image_groups(x: torch.Tensor, step: int, dtype):
    """``x``'s images ``step`` at a time, each group converted to ``dtype`` (:func:`_in_dtype`) as it is read."""
    for start in range(0, x.shape[0], step):
        yield _in_dtype(dtype, x[start : start + step])[0]


SAMPLE_GRADIENT_IMAGES = 6  # CPU: images per product of the split route (4-8 were fastest at 8x8 to 32x32 maps)


def conv_sample_gradients(grad: torch.Tensor, hidden: torch.Tensor, split: bool | None = None) -> torch.Tensor:
    """Per-image parameter gradients ``X_m = G_m U_m^T`` as ``(M, 3, N, 3, C)``: ``out[m, kh, n, kw, c]``.

    That entry is ``sum_p g_n[p] x_c[p + k - 1]`` (``k = (kh, kw)``), column
    ``c*9 + kh*3 + kw`` of row ``n`` of ``X_m`` in unfold order: the weight
    gradient of a 3x3 convolution of image ``m`` alone.  ``split`` (default:
    on the CPU) splits the kernel offset between the two factors:
    ``out[m, kh, :, kw, :] = G_kh X_kw^T`` summed over the ``H x W`` grid, with
    ``G_kh`` the gradient shifted by ``kh - 1`` rows and ``X_kw`` the map by
    ``kw - 1`` columns (zero where they leave the map), so each image is ONE
    ``3N x HW`` by ``HW x 3C`` product, :data:`SAMPLE_GRADIENT_IMAGES` images
    per batched product: squarer than the ``N x 9C`` product of a
    convolution weight gradient (1.5x MKL's float64 rate at ResNet-8's sizes)
    from shifted copies of 6 maps instead of the 9 of an ``unfold``, and the
    output stays in this order (putting it in unfold order was a strided copy
    as long as the products at 8x8 maps).  Otherwise nine batched products of
    the gradient, placed in the map's padded layout (:class:`_FlatImages`),
    with shifted views of the map, one kernel each; GPUs keep that route
    until the split one has been measured there.
    """
    M, N, H, W = grad.shape
    C = hidden.shape[1]
    if hidden.device.type == "cpu" if split is None else split:
        X = grad.new_empty((M, 3 * N, 3 * C))
        step = min(M, SAMPLE_GRADIENT_IMAGES)
        rows = grad.new_empty((step, 3, N, H, W))  # [kh]: grad shifted by kh - 1 rows
        cols = hidden.new_empty((step, 3, C, H, W))  # [kw]: hidden shifted by kw - 1 columns
        rows[:, 0, :, H - 1] = 0
        rows[:, 2, :, 0] = 0
        cols[:, 0, :, :, 0] = 0
        cols[:, 2, :, :, W - 1] = 0
        for start in range(0, M, step):
            g, x = grad[start : start + step], hidden[start : start + step]
            m = g.shape[0]
            rows[:m, 0, :, : H - 1], rows[:m, 1], rows[:m, 2, :, 1:] = g[:, :, 1:], g, g[:, :, : H - 1]
            cols[:m, 0, :, :, 1:], cols[:m, 1], cols[:m, 2, :, :, : W - 1] = x[..., : W - 1], x, x[..., 1:]
            torch.bmm(rows[:m].view(m, 3 * N, H * W), cols[:m].view(m, 3 * C, H * W).transpose(1, 2),
                      out=X[start : start + m])
        return X.view(M, 3, N, 3, C)
    flat = _FlatImages(hidden, hidden.dtype)
    g = grad.new_zeros((M, N, H + 2, flat.pitch))
    g[:, :, :H, :W] = grad
    g = g.view(M, N, flat.length)
    X = g.new_empty((3, 3, M, N, C))
    for kh, kw in np.ndindex(3, 3):
        torch.bmm(g, flat.per_image(kh - 1, kw - 1).transpose(1, 2), out=X[kh, kw])
    return X.permute(2, 0, 3, 1, 4)


def unfold_order(C: int, device=None) -> torch.Tensor:
    """Index ``i`` such that ``v[..., i]`` is in unfold order (``c*9 + kh*3 + kw``) for ``v`` in ``(kh, kw, c)`` order."""
    return torch.arange(9 * C, device=device).view(3, 3, C).permute(2, 0, 1).reshape(-1)


CONV_CHUNK_BYTES = 2 << 20  # CPU: images per FFT pass of the Gram so that their padded map stays in cache


def conv_batch_moments(grad: torch.Tensor, hidden: torch.Tensor, *, variance: bool = False,
                       dtype=torch.float64) -> BatchMoments:
    """:func:`batch_moments` of ``q = positions(grad)`` and the ``conv`` family's
    ``psi = F.unfold(hidden, 3, padding=1).transpose(1, 2)``, without the patches.

    ``grad`` ``(M, N, H, W)`` is ``d loss / d z``, ``hidden`` ``(M, C, H, W)``
    the map whose 3x3 patches are the features (``r = 9C``).  The Gram comes
    from the map's channel correlations (:func:`conv_gram`), the per-sample
    gradients ``X_m`` from one product per image (:func:`conv_sample_gradients`);
    ``sum_cross = sum_m X_m``, ``sum_xi_sq = sum ||X_m||^2`` and
    ``sum_xtx = sum X_m^T X_m``.  Equal to the patch route to round-off.
    On the CPU the Gram's FFTs take the images in groups whose padded map
    takes at most :data:`CONV_CHUNK_BYTES`: a cache-sized group runs its
    small products from cache and reuses its temporaries instead of
    page-faulting them afresh.  For the same reason the maps are converted
    to ``dtype`` a group at a time as they are read, never as whole copies,
    and the ``X_m`` of :data:`SAMPLE_GRADIENT_IMAGES` images at a time are
    added into the sums and dropped (at ResNet-8's 8x8 maps all ``X_m`` of a
    batch of 64 took 19 MB).

    Float32 maps (a float32 model's) on the CPU whose sums are asked for in
    float64 (:func:`_float32_products_ready`) take each ``X_m`` as a float32
    product of the float32 maps, converted to float64 before anything adds
    them up: half the time of the float64 products (22 against 43 ms for the
    four candidates of a ResNet-8 batch of 64), the probe's largest share.
    The error is that of a float32 dot product of length ``K = HW`` (the
    products of float32 entries are exact, their float32 sums round):
    ``|fl(X_m) - X_m| <= gamma_K |G_m| |U_m|^T`` entrywise with
    ``gamma_K = K u / (1 - K u)``, ``u = 2^-24`` (Higham, "Accuracy and
    Stability of Numerical Algorithms", Section 3.1), so
    ``||Delta sum_cross||_F <= gamma_K kappa ||sum_cross||_F`` with the
    cancellation ``kappa = ||sum_m |G_m| |U_m|^T||_F / ||sum_m G_m U_m^T||_F``:
    the same size as what the float32 model's own round-off in ``G_m`` (about
    ``u |G_m|``) already puts into ``sum_cross``, times ``K``.  On the probe
    bench's ResNet-8 (``kappa`` 16-62, ``K`` 64-1024) ``sum_cross`` came out
    2-3e-7 from the float64 products, ``sum ||X_m||^2`` (exact float64
    squares of the float32 ``X_m``) 1e-9: the entries' errors are
    independent and do not add up.  The Gram stays float64 throughout (it
    enters inverted, and its round-off would land on the directions the
    rank cut keeps); ``tests/test_torch_moments_fast.py`` checks the bound.
    """
    M, C, H, W = hidden.shape
    N = grad.shape[1]
    device = _sums_device(dtype, hidden.device)
    on_cpu = device.type == "cpu"
    step = max(1, CONV_CHUNK_BYTES // (C * (H + 2) * (W + 2) * dtype.itemsize)) if on_cpu else M
    group = SAMPLE_GRADIENT_IMAGES if on_cpu else M  # the split route's images per product
    products = torch.float32 if _float32_products_ready(grad, hidden, dtype) else dtype
    cross = torch.zeros(3 * N * 3 * C, dtype=dtype, device=device)  # (kh, n, kw, c) order
    sum_q_sq = sum_xi_sq = torch.zeros((), dtype=torch.float64, device=float64_device(device))
    sum_xtx = torch.zeros((9 * C, 9 * C), dtype=torch.float64, device=float64_device(device)) if variance else None
    for g, x in zip(_image_groups(grad, group, products), _image_groups(hidden, group, products)):
        X, = _in_dtype(dtype, conv_sample_gradients(g, x))  # (m, kh, N, kw, C)
        m = X.shape[0]
        # over the images as a matrix-vector product: 3x faster than X.sum(0) at C = 64
        cross.addmv_(X.reshape(m, -1).T, X.new_ones(m))
        sum_q_sq = sum_q_sq + squared_norm(g)
        sum_xi_sq = sum_xi_sq + squared_norm(X)  # float64 accumulation: in float32, 2.4M squares lost 9e-5 of the sum
        if variance:  # rows (image, n), columns (kh, kw, c); the Gram's rows and columns then go to unfold order
            add_gram(sum_xtx, X.transpose(1, 2).reshape(m * N, 9 * C))
    order = unfold_order(C, device)
    out = {
        "n_samples": M,
        "n_vectors": M * H * W,
        "sum_gram": mirror_upper(_float64(conv_gram(hidden, step, dtype))),
        "sum_q_sq": sum_q_sq,
        "sum_cross": _float64(cross.view(3, N, 3, C).transpose(0, 1).reshape(N, 9 * C)[:, order]),
        "sum_xi_sq": sum_xi_sq,
    }
    if variance:
        complete_lower(sum_xtx)
        out["sum_xtx"] = sum_xtx[order][:, order]
    out["batch_grad_norm"] = out["sum_q_sq"].sqrt() / M
    return BatchMoments(**out)


def position_index(T: int, keep: int | None, generator: torch.Generator) -> torch.Tensor | None:
    """Uniform ``keep``-subset of ``range(T)`` (sorted), or ``None`` to keep all."""
    if keep is None or keep >= T:
        return None
    if keep < 1:
        raise ValueError(f"position_subsample must be >= 1, got {keep}")
    return torch.randperm(T, generator=generator)[:keep].sort().values


def subsample_positions(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """``x[:, index] * sqrt(T / T')`` for ``x`` ``(M, T, width)`` (identity when ``index`` is None)."""
    if index is None:
        return x
    T = x.shape[1]
    return x[:, index.to(x.device)] * math.sqrt(T / index.numel())
