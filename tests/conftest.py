import os

import pytest

# Keep BLAS single-threaded in tests: the machine has two cores and suites run side by side.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(params=["spectral", "shifted"])
def gram_route(request, monkeypatch):
    """The conv Gram's channel correlations by FFT (small maps) or by 13 shifted products (large maps)."""
    from satcore.adapters.torch import moments

    if request.param == "shifted":
        monkeypatch.setattr(moments, "CONV_FFT_BYTES", 0)
    return request.param
