"""Token batches of different lengths, and ignored labels, score as in the torch adapter (docs/core.md, Conventions and Adapters).

The ONNX model is ``TokenModel`` of ``test_onnx_gradients`` exported with dynamic batch AND
sequence axes; the reference is the torch adapter's ``probe`` on the same module, with
``loss_i`` its ``sequence_loss`` (the mean over the sample's tokens whose label is not -100, 0
when none is) applied without the next-token shift, since ONNX cross_entropy targets line up
with the logits.  Batches have T = 12 and then T = 8, so the statistics cannot assume one T: their
``n_vectors`` counts 4 * 12 + 3 * 8 position vectors.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
adapter = pytest.importorskip("satcore.adapters.torch")

from test_onnx_gradients import TokenModel  # noqa: E402

from satcore.adapters.onnx import probe  # noqa: E402

SEED = 2
IGNORE = -100
RTOL = 1e-6  # float32 gradients from two runtimes, accumulated in float64 (measured: 1e-7)
FIELDS = ("sum_q_sq", "sum_xi_sq", "sum_cross", "sum_gram")


@pytest.fixture(scope="module")
def token_model(tmp_path_factory):
    torch.manual_seed(0)
    model = TokenModel().eval()
    path = tmp_path_factory.mktemp("seq") / "tok.onnx"
    torch.onnx.export(model, (torch.randn(4, 6, 5),), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch", 1: "T"}, "logits": {0: "batch", 1: "T"}})
    return model, path


def unshifted_sequence_loss(logits, labels):
    """``sequence_loss`` with token t scored against ``labels[:, t]``: a dummy last position and first label."""
    pad = torch.full_like(labels[:, :1], IGNORE)
    return adapter.sequence_loss(torch.cat([logits, logits[:, :1]], 1), torch.cat([pad, labels], 1))


def batches(ignored: bool):
    rng = np.random.default_rng(7)
    out = []
    for b, T in ((4, 12), (3, 8)):
        x = rng.standard_normal((b, T, 5)).astype(np.float32)
        y = rng.integers(0, 3, (b, T))
        if ignored:
            y[rng.random((b, T)) < 0.3] = IGNORE
            y[1] = IGNORE  # a sample with no counted token: counts in n with a zero gradient
        out.append((x, y))
    return out


@pytest.mark.parametrize("ignored", [False, True], ids=["all-labels", "ignore-index"])
def test_varying_lengths_and_ignored_labels_match_the_torch_adapter(token_model, ignored):
    model, path = token_model
    data = batches(ignored)
    got = probe(path, data, family="mlp", seed=SEED)
    ref = adapter.probe(model, [(torch.tensor(x), torch.tensor(y)) for x, y in data], unshifted_sequence_loss,
                        candidates=["blocks.0", "blocks.1"], family="mlp", seed=SEED)
    assert list(got.statistics) == list(ref.statistics) == ["blocks.0", "blocks.1", "head"]  # one naming
    for mine, theirs in zip(got.statistics.values(), ref.statistics.values()):
        assert (mine.n_samples, mine.n_positions, mine.n_batches) == (7, 12, 2)
        assert (theirs.n_samples, theirs.n_positions) == (7, 12)
        assert mine.n_vectors == theirs.n_vectors == sum(x.shape[0] * x.shape[1] for x, _ in data)
        for field in FIELDS:
            a, b = np.asarray(getattr(mine, field)), np.asarray(getattr(theirs, field))
            assert np.linalg.norm(a - b) <= RTOL * np.linalg.norm(b), field
        a, b = mine.score(), theirs.score()
        assert a.ag == pytest.approx(b.ag, rel=RTOL) and a.ag > 1e-3
        assert a.growth_value == pytest.approx(b.growth_value, rel=1e-5)
        assert 0.05 < a.realizability < 0.9999  # a proper projection, not a trivial value
