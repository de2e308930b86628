"""The probe's running totals in their compact forms: Gram totals held packed (one CPU thread) and a
float32 model's batch ``sum_cross`` waiting unformed for its fold give the sums of whole float64
totals: the Grams to float64 round-off, the folds to the bit of adding each batch as it comes."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from satcore import CandidateStatistics
from satcore.adapters.torch.moments import (
    CentredCross,
    add_gram,
    add_packed,
    batch_moments,
    complete_lower,
    packed_zeros,
    squared_norm,
    unpacked,
)
from satcore.adapters.torch.running import RunningSums
from roundoff import EPS32, relative_error

torch.set_num_threads(1)


@pytest.mark.parametrize("r", [10, 9])  # the packed form's two layouts (r even, r odd)
@pytest.mark.parametrize("threads", [1, 2])  # dsfrk; a whole upper triangle from torch, packed and added
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_packed_gram_total_equals_the_whole_total(r, threads, dtype):
    """``add_gram`` into a packed total, unpacked, == the same batches into a whole total (completed),
    exactly symmetric; a start packed and unpacked again is the start's very bits."""
    g = torch.Generator().manual_seed(r)
    start = torch.randn(r, r, generator=g, dtype=torch.float64)
    start = start + start.T
    packed, whole = packed_zeros(r), start.clone()
    add_packed(packed, start)
    assert np.array_equal(unpacked(packed, r), start.numpy())
    torch.set_num_threads(threads)
    try:
        for rows in (7, 1, 12):
            x = torch.randn(rows, r, generator=g, dtype=torch.float64).to(dtype)
            add_gram(packed, x)
            add_gram(whole, x)
    finally:
        torch.set_num_threads(1)
    complete_lower(whole)
    got = unpacked(packed, r)
    assert np.array_equal(got, got.T)
    assert relative_error(got, whole) < 20 * np.finfo(np.float64).eps


@pytest.mark.parametrize("r", [41, 40])
def test_float32_gram_into_a_packed_total_within_its_error_bound(r):
    """Float32 rows (``batch_dtype=torch.float32``) into a packed total on one CPU thread: the batch's
    ``ssfrk`` triangle in the packed form, added into the float64 total, equals the float64 product of the
    same rows within the dot-product bound ``n eps32 |x|^T |x|`` entrywise (Higham, Accuracy and Stability,
    eq. 3.5), columns on 6 decades."""
    g = torch.Generator().manual_seed(r)
    n = 300
    x = (torch.randn(n, r, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, r, dtype=torch.float64)).float()
    start = torch.randn(r, r, generator=g, dtype=torch.float64)
    start = start + start.T
    packed = packed_zeros(r)
    add_packed(packed, start)
    add_gram(packed, x)
    x64 = x.double()
    error = (torch.from_numpy(unpacked(packed, r)) - (start + x64.T @ x64)).abs()
    assert bool((error <= n * EPS32 * (x64.abs().T @ x64.abs()) + 1e-12 * start.abs()).all())
    assert float(error.max()) > 1e-9 * float((x64.T @ x64).abs().max())  # float32 products: the bound is what is checked


def stream_moments(q, psi, totals, *, cross_formed):
    """A batch's moments as the probe adds them (Grams into ``totals``; stream sums of ``q`` as ``z``)."""
    moments = batch_moments(q, psi, grams_into=totals, cross_formed=cross_formed)
    return replace(moments, sum_z_sq=squared_norm(q), n_stream_vectors=q.shape[0] * q.shape[1])


def test_running_sums_hold_compact_totals_and_sync_to_the_batches_sums():
    """Five float32 batches into 2 folds (batches 0, 2, 4 share fold 0): between syncs the Gram total is
    packed and the last batch of each fold waits unformed; each sync gives the float64 Gram of the
    rows (to float64 round-off) and folds and ``sum_cross`` bit for bit those of the same batches added
    formed as they come (a probe on 2 threads: whole totals), which agree with ``Q^T Psi`` in float64."""
    g = torch.Generator().manual_seed(4)
    M, T, N, r = 3, 4, 5, 7
    batches = [(torch.randn(M, T, N, generator=g), 3.0 + torch.randn(M, T, r, generator=g)) for _ in range(6)]

    def running(threads):
        torch.set_num_threads(threads)
        try:
            return RunningSums(CandidateStatistics(N, r, T, n_folds=2, stream=True), torch.device("cpu"))
        finally:
            torch.set_num_threads(1)

    compact, whole = running(1), running(2)
    assert compact.matrices["sum_gram"].dim() == 1 and whole.matrices["sum_gram"].dim() == 2
    for synced_after in (5, 6):  # a sync, then one more batch and another sync
        new = range(compact.n_batches, synced_after)
        for q, psi in batches[new.start : new.stop]:
            compact.add(stream_moments(q, psi, compact.matrices, cross_formed=False))
            whole.add(stream_moments(q, psi, whole.matrices, cross_formed=True))
        assert all(isinstance(c, CentredCross) for c in compact.unformed_folds.values())
        assert set(compact.unformed_folds) == {i % 2 for i in new} and not whole.unformed_folds
        got, ref = compact.sync(), whole.sync()
        assert not compact.unformed_folds and compact.matrices["sum_gram"].dim() == 2
        assert np.shares_memory(compact.matrices["sum_gram"].numpy(), got.sum_gram)  # the totals from now on
        assert np.array_equal(got.fold_cross, ref.fold_cross) and np.array_equal(got.sum_cross, ref.sum_cross)
        assert np.array_equal(got.sum_gram, got.sum_gram.T)
        assert relative_error(got.sum_gram, ref.sum_gram) < 20 * np.finfo(np.float64).eps
        rows = [(q.reshape(-1, N).double().numpy(), psi.reshape(-1, r).double().numpy())
                for q, psi in batches[:synced_after]]
        assert relative_error(got.sum_gram, sum(p.T @ p for _, p in rows)) < 20 * np.finfo(np.float64).eps
        for fold in (0, 1):
            exact = sum(q.T @ p for q, p in rows[fold::2])
            assert relative_error(got.fold_cross[fold], exact) < 10 * M * T * np.finfo(np.float32).eps
        assert got.n_samples == M * synced_after and list(got.fold_samples) == [M * 3, M * (synced_after - 3)]


@pytest.mark.parametrize("subsample", [None, 8])  # the positions a batch keeps are drawn from its own seed
def test_batches_waiting_tapped_give_the_sums_of_batches_added_at_once(subsample, monkeypatch):
    """A CPU probe holds its first batches' streams and gradients (``Probe.tapped``) while they take fewer
    bytes than the Gram totals, and adds them at its result: the statistics of the batches added as
    they come, element for element; the last result's Gram, held packed until read, is the bits of a
    result the probe goes on after."""
    from satcore.adapters.torch import Probe, sequence_loss
    from zoo import models_torch as mt

    model, batches = mt.gpt2(), mt.text_batches(16, 3, 3)

    def probed(waits: bool, last: bool):
        if not waits:
            monkeypatch.setattr(Probe, "_holds_tapped", lambda self: False)
        state = Probe(model, sequence_loss, position_subsample=subsample)
        for batch in batches:
            state.update(batch)
            assert len(state.tapped) == (state.batches_done if waits else 0) and bool(state.running) != waits
        result = state.result(copy_sums=not last)
        monkeypatch.undo()
        return result.statistics

    waited = probed(True, last=True)
    for got, ref in zip(waited.values(), probed(False, last=False).values()):
        assert got == ref and got.n_batches == len(batches)
    assert all(a == b for a, b in zip(waited.values(), probed(False, last=True).values()))
