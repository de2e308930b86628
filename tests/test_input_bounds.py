"""The bounds decide and expand check before any work: read-only token ids (the .npz reader's) read quietly."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("torch")

from satcore import InputError
from satcore.adapters.torch.input_bounds import check_token_ids


def test_read_only_token_ids_are_checked_without_torchs_not_writable_warning():
    ids = np.arange(12, dtype=np.int32).reshape(3, 4)
    ids.flags.writeable = False  # as NpzArchive hands a .npz member
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_token_ids(ids, 12, "ids.npz")
    bad = np.array([0, 3, 12], dtype=np.int64)
    bad.flags.writeable = False
    with pytest.raises(InputError, match=r"^ids.npz: token id 12 is outside the model's vocabulary 0..11$"):
        check_token_ids(bad, 12, "ids.npz")
    with pytest.raises(InputError, match="token ids must be integers, got float32"):
        check_token_ids(np.zeros(3, dtype=np.float32), 12, "ids.npz")
