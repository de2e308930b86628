"""The conv route's Gram keeps features that are exactly zero on every image exactly zero (a dead ReLU
channel; on a 2x2 map, offsets that read only zero pixels): by FFT they came out at round-off, and the
Jacobi-scaled rank cut turned that into an indefinite matrix (eigenvalue -39.7 of 40.4 at a trained
digits ResNet's head)."""

import numpy as np
import pytest
import torch

from satcore import psd_spectrum
from satcore.adapters.torch.moments import conv_batch_moments
from satcore._formulas.families import unfold3x3


@pytest.mark.parametrize("H, W", [(2, 2), (4, 4), (3, 5)])
def test_zero_features_stay_exactly_zero_and_the_gram_is_psd(H, W, gram_route):
    g = torch.Generator().manual_seed(H * 10 + W)
    M, C, N = 24, 6, 3
    hidden = torch.relu(torch.randn(M, C, H, W, generator=g, dtype=torch.float64)) * 50
    hidden[:, 1] = 0  # a dead channel
    hidden[:, 2, 1:, :] = 0  # a channel alive in row 0 only: offsets reading below it see zeros
    grad = torch.randn(M, N, H, W, generator=g, dtype=torch.float64)
    got = conv_batch_moments(grad, hidden).sum_gram.numpy()
    patches = unfold3x3(hidden.numpy()).reshape(-1, 9 * C)
    ref = patches.T @ patches
    zero = np.diagonal(ref) == 0
    assert zero.sum() >= 9  # the dead channel's nine features at least
    assert np.all(got[zero] == 0) and np.all(got[:, zero] == 0)
    np.testing.assert_allclose(np.diagonal(got), np.diagonal(ref), rtol=1e-14)  # sums of squares, any order
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    spectrum = psd_spectrum(got)
    assert spectrum.lowest >= -1e-12 * spectrum.highest
