"""``satcore expand``'s exports for training exactly the new blocks, held against the tools that read them.

A tiny Llama checkpoint in bfloat16 with tied embeddings is grown at forced places (``--at``: no decision,
so the test is fast), non-uniform and uniform.  References: real ``peft`` (``LoraConfig.from_pretrained``
and ``get_peft_model`` on the grown model: adapters exactly on the new blocks), LLaMA-Factory's own module
selection (``_setup_freeze_tuning`` and ``_setup_lora_tuning`` of ``llamafactory.model.adapter``, where it
imports; it pins transformers <= 5.6 and peft <= 0.18, so it is skipped in the test environment), PEFT's
``target_modules`` matching for the LoRA list LLaMA-Factory hands it, and safetensors' own reader for the dtype.

LLaMA-Factory's checks ran (LLaMA-Factory 0.9.5, transformers 5.6.0, peft 0.18.1, torch 2.13.0 CPU) in a virtual
environment of their own: ``python3.11 -m venv lf && lf/bin/pip install llamafactory torch==2.13.0``, then
``lf/bin/pip uninstall -y torchvision torchaudio`` (the torchvision it pulls does not load beside that torch, and
transformers then refuses to import), ``lf/bin/pip install pytest``, ``lf/bin/pip install --no-deps -e .`` and
``lf/bin/python -m pytest tests/test_expand_exports.py`` from the repository root.
"""

from __future__ import annotations

import json
import os
import re

import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from click.testing import CliRunner  # noqa: E402

from satcore.cli.main import main  # noqa: E402

LAYERS = 4
LINEAR_MAPS = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj"}


@pytest.fixture(scope="module")
def bf16_tied(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bf16") / "model"
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=LAYERS,
                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = T.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(folder)
    return folder, model


def grow(folder, out, at):
    result = CliRunner().invoke(main, ["expand", str(folder), "--at", at, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "expansion.json").read_text())


def new_layer_of(name: str) -> int | None:
    match = re.search(r"model\.layers\.(\d+)\.", name)
    return None if match is None else int(match.group(1))


def test_bf16_in_bf16_out_with_tied_embeddings_kept(bf16_tied, tmp_path):
    from safetensors import safe_open

    folder, original = bf16_tied
    out = tmp_path / "grown"
    grow(folder, out, "1,3")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), "pt") as stored:
        keys = list(stored.keys())
        assert {stored.get_tensor(k).dtype for k in keys} == {torch.bfloat16}
    assert "lm_head.weight" not in keys  # tied: stored once, as the embedding
    grown = T.AutoModelForCausalLM.from_pretrained(out).eval()
    assert grown.dtype == torch.bfloat16 and grown.config.tie_word_embeddings
    assert grown.lm_head.weight.data_ptr() == grown.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(grown(ids).logits, original(ids).logits)  # every new block adds an exact 0


@pytest.mark.parametrize("at, uniform", [("1,3", False), ("2,head", True)])
def test_peft_config_puts_adapters_on_exactly_the_new_blocks(bf16_tied, tmp_path, at, uniform):
    folder, _ = bf16_tied
    out = tmp_path / "grown"
    record = grow(folder, out, at)
    positions = record["positions"]
    assert positions == ([1, 4] if not uniform else [2, 5]) and record["trainable_layers"] == positions
    config = peft.LoraConfig.from_pretrained(str(out / "peft"))
    assert sorted(config.layers_to_transform) == positions
    grown = T.AutoModelForCausalLM.from_pretrained(out)
    adapted = peft.get_peft_model(grown, config)
    wrapped = {name.split("base_model.model.", 1)[1].rsplit(".lora_A", 1)[0]
               for name, _ in adapted.named_parameters() if ".lora_A." in name}
    assert wrapped == {f"model.layers.{p}.{m}" for p in positions for m in LINEAR_MAPS}
    trainable = {new_layer_of(n.split("base_model.model.", 1)[1]) for n, p in adapted.named_parameters()
                 if p.requires_grad}
    assert trainable == set(positions)


# --at, the positions it makes in the 6 (5) layers, and the form of LLaMA-Factory's freeze tuning that selects them
FREEZE_FORMS = [("1,3", [1, 4], None),  # none: LoRA
                ("2,head", [2, 5], {"freeze_trainable_layers": 2, "use_llama_pro": True}),  # every 3rd: 2, 5
                ("head,head", [4, 5], {"freeze_trainable_layers": 2}),  # the last 2
                ("0", [0], {"freeze_trainable_layers": -1})]  # the first 1


@pytest.mark.parametrize("at, positions, form", FREEZE_FORMS)
def test_llama_factory_settings_train_exactly_the_new_blocks(bf16_tied, tmp_path, at, positions, form):
    folder, _ = bf16_tied
    out = tmp_path / "grown"
    record = grow(folder, out, at)
    assert record["positions"] == positions
    freeze, lora = record["llama_factory"], record["llama_factory_lora"]
    assert freeze == ({"expressible": False, "reason": freeze.get("reason")} if form is None
                      else {"finetuning_type": "freeze", "freeze_trainable_modules": "all", **form})
    yaml_text = (out / "llamafactory.yaml").read_text()
    assert ('finetuning_type: "lora"' in yaml_text) is (form is None)
    # PEFT's matching of the list LLaMA-Factory hands it (lora_target split at commas, as target_modules)
    grown = T.AutoModelForCausalLM.from_pretrained(out)
    adapted = peft.get_peft_model(grown, peft.LoraConfig(target_modules=lora["lora_target"].split(","),
                                                         task_type="CAUSAL_LM"))
    assert {new_layer_of(n) for n, p in adapted.named_parameters() if p.requires_grad} == set(positions)
    factory = pytest.importorskip("llamafactory.model.adapter")  # LLaMA-Factory's own selection, where it imports
    from llamafactory.hparams import FinetuningArguments, ModelArguments

    def freeze_selects(settings) -> set:
        model = T.AutoModelForCausalLM.from_pretrained(out)
        factory._setup_freeze_tuning(model, FinetuningArguments(**settings), True, False)
        return {new_layer_of(n) for n, p in model.named_parameters() if p.requires_grad}

    if form is not None:
        assert freeze_selects(freeze) == set(positions)
    else:  # LLaMA-Pro's settings for 2 layers of 6 select its uniform places, 2 and 5, not the new blocks 1 and 4
        assert freeze_selects({"finetuning_type": "freeze", "freeze_trainable_modules": "all",
                               "freeze_trainable_layers": 2, "use_llama_pro": True}) == {2, 5}
    model = T.AutoModelForCausalLM.from_pretrained(out)
    adapted = factory._setup_lora_tuning(model.config, model, ModelArguments(model_name_or_path=str(out)),
                                         FinetuningArguments(**lora), True, False)
    assert {new_layer_of(n.split("base_model.model.", 1)[1]) for n, p in adapted.named_parameters()
            if p.requires_grad} == set(positions)


def test_model_card_names_base_places_and_how_to_train(bf16_tied, tmp_path, monkeypatch):
    folder, _ = bf16_tied
    out = tmp_path / "grown"
    grow(folder, out, "1,3")
    card = (out / "README.md").read_text()
    assert f"Base model: `{folder}`, grown from {LAYERS} to {LAYERS + 2} layers" in card
    assert "| 1 | 1 | 0 |" in card and "| 4 | 3 | 2 |" in card  # position, inserted before, copied from
    assert "None: the places were forced (`--at 1,3`)." in card
    assert "Train layers [1, 4] only" in card
    # the card's PEFT line loads as printed from any working directory (tmp_path here, not OUT_DIR)
    printed = re.search(r"peft\.LoraConfig\.from_pretrained\((\"[^\"]+\")\)", card).group(1)
    assert json.loads(printed) == os.path.join(os.path.abspath(out), "peft")
    peft = pytest.importorskip("peft")
    monkeypatch.chdir(tmp_path)
    assert peft.LoraConfig.from_pretrained(json.loads(printed)).layers_to_transform == [1, 4]
    assert "llamafactory-cli train llamafactory.yaml" in card and "model.layers.1. model.layers.4." in card
    # [1, 4] is no form of LLaMA-Factory's freeze tuning: its file is LoRA, and the card says so, as for PEFT's
    assert ('finetuning_type: "lora"' in (out / "llamafactory.yaml").read_text()
            and "`llamafactory-cli train llamafactory.yaml`; LoRA on those layers" in card)
    assert "puts LoRA adapters (rank 8) on exactly those layers: low-rank updates, not those layers' full" in card


@pytest.mark.parametrize("at, k, divides", [("1,2,head", 3, False), ("1,3", 2, True)])
def test_llama_factory_refusal_of_a_count_not_dividing_the_layers_is_named(bf16_tied, tmp_path, at, k, divides):
    """K blocks at LLaMA-Pro's uniform places in 4 layers: K = 3 makes 7 layers, which LLaMA-Factory's use_llama_pro
    refuses for n = 3 (not a multiple), so the record and the card say why and which K would do; K = 2 at
    non-uniform places gets no such words: what stops the freeze form there is the places."""
    folder, _ = bf16_tied
    out = tmp_path / "grown"
    record = grow(folder, out, at)
    reason = record["llama_factory"]["reason"]
    card = (out / "README.md").read_text()
    words = (f"its use_llama_pro needs the {LAYERS + k} layers to be a multiple of n = {k}: K blocks at uniform "
             f"places are its every (layers/n)-th layer where K divides the original {LAYERS}")
    assert (words in reason, words in card) == (not divides, not divides)
    assert 'finetuning_type: "lora"' in (out / "llamafactory.yaml").read_text()
    if not divides:
        factory = pytest.importorskip("llamafactory.model.adapter")  # LLaMA-Factory's own refusal, where it imports
        from llamafactory.hparams import FinetuningArguments

        with pytest.raises(ValueError, match="divisible"):
            factory._setup_freeze_tuning(T.AutoModelForCausalLM.from_pretrained(out), FinetuningArguments(
                finetuning_type="freeze", freeze_trainable_layers=k, use_llama_pro=True), True, False)


@pytest.mark.parametrize("train", ["all", "new_blocks"])
def test_model_card_trains_what_the_decision_priced(train):
    """Without ``--freeze-old`` the decision priced training every parameter (``K = 0`` against ``K`` blocks, all
    trained): the card says to train so, and offers the new blocks alone (LLaMA-Pro's recipe) as not priced; with
    it, training the new blocks alone is the priced recipe.  (The card used to say "Train layers [...] only" under
    a decision of ``"train": "all"``.)"""
    from satcore.adapters.torch.expansion_exports import model_card

    record = {"num_hidden_layers": {"before": 4, "after": 6}, "positions": [2, 5], "inserted_before": [2, "head"],
              "copied_from": [1, 3], "init": "copy", "source": "base", "layout": "uniform", "train": train,
              "data": {"file": "new.txt", "windows": 64, "seq_len": 32}, "recipe": {"optimizer": "adamw"},
              "cost_block_steps": 16, "frontier": None, "decision": {"method": "m"}, "trainable_layers": [2, 5],
              "llama_factory": {"finetuning_type": "freeze"},
              "ms_swift": {"trainable_parameters": ["model.layers.2.", "model.layers.5."]}}
    card = model_card(record, "out")
    priced_all = "The decision priced training every parameter of the grown model"
    assert (priced_all in card) is (train == "all")
    assert ("To train layers [2, 5] only (LLaMA-Pro's recipe, which this decision did not price) instead" in card) is (
        train == "all")
    assert ("Train layers [2, 5] only (LLaMA-Pro's recipe, the one the decision priced)" in card) is (
        train == "new_blocks")
    assert "`llamafactory-cli train llamafactory.yaml`: full training of those layers (freeze tuning)" in card


# expansion.json's keys the card reads where --blocks auto added no block (the decision's own keys apart)
UNEXPANDED = {"num_hidden_layers": {"before": 4, "after": 4}, "positions": [], "source": "base", "layout": "uniform",
              "data": {"file": "new.txt", "windows": 64, "seq_len": 32}, "recipe": {"optimizer": "adamw"}}
RACED = "The trials raced: an arm with new blocks stops once it can no longer beat K = 0 (no new block, the same " \
        "training) credibly, and K = 0 with the last of them. Here "


@pytest.mark.parametrize("race, spent, said", [
    ({"on": True, "arm_steps": {"0": 5, "1": 5, "2": 5}, "stopped_at_step": 5},
     21.6, RACED + "every trial stopped at step 5 of 10. The decision spent 21.6 planned steps' FLOPs (5.4% of the "
                   "planned 400 steps' FLOPs) of a ceiling of 39.6 (9.9%), printed before it started; the rest is "
                   "your training's."),
    ({"on": True, "arm_steps": {"0": 10, "1": 5, "2": 10}, "stopped_at_step": None},
     35.5, RACED + "K = 1 stopped at step 5 of 10; the other arms trained all 10 steps. The decision spent 35.5 "
                   "planned steps' FLOPs (8.9% of the planned 400 steps' FLOPs) of a ceiling of 39.6 (9.9%), printed "
                   "before it started; the rest is your training's."),
    ({"on": True, "arm_steps": {"0": 10, "1": 10}, "stopped_at_step": None},
     39.6, RACED + "no trial stopped early: every arm trained all 10 steps. The decision spent 39.6 planned steps' "
                   "FLOPs (9.9% of the planned 400 steps' FLOPs) of a ceiling of 39.6 (9.9%), printed before it "
                   "started."),
    ({"on": False, "arm_steps": {"0": 10, "1": 10}, "stopped_at_step": None}, 39.6, None),  # --no-race
])
def test_model_card_says_what_the_race_stopped_and_spent(race, spent, said):
    """Where --blocks auto raced, the card says which arms stopped at which step and what the decision spent
    against the ceiling printed before it started (the card said nothing of the race); the numbers are the
    recorded far-pair rows' (studies/results/expansion_budget_timing_race_far.jsonl: 400 planned steps, trials of
    10 read at 2, 5, 10, a ceiling of 39.6 planned steps)."""
    from satcore.adapters.torch.expansion_exports import model_card

    plan = {"planned_steps": 400, "trial_steps": 10, "checkpoints": [2, 5, 10], "cost_steps": 39.623,
            "cost_fraction": 39.623 / 400}
    record = {**UNEXPANDED, "frontier": [{"blocks": 0}], "decision_cost_fraction": spent / 400,
              "decision": {"method": "m", "stop_reason": "expanding_does_not_pay", "plan": plan, "cost_steps": spent,
                           "race": {**race, "margin_half_widths": 1.0 if race["on"] else None,
                                    "ceiling_cost_steps": 39.623}}}
    card = model_card(record, "out").splitlines()
    raced = [line for line in card if "raced" in line]
    assert raced == ([] if said is None else [said])
    assert f"it cost {spent:.1f} planned steps' FLOPs, {spent / 400:.1%} of the planned 400 steps' FLOPs." in \
        "\n".join(card)  # the cost line the command printed, beside it


@pytest.mark.parametrize("frontier, keys", [([{"blocks": 0}, {"blocks": 1}], "(`frontier`, `decision`)"),
                                            (None, "(`evidence`, `decision`)")])
def test_model_card_points_at_the_key_that_holds_the_evidence(frontier, keys):
    """``--blocks auto`` records its evidence per arm in ``frontier`` and leaves ``evidence`` (per place) empty; the
    card's pointer names the key that holds it, per arm or per place."""
    from satcore.adapters.torch.expansion_exports import model_card

    record = {**UNEXPANDED, "cost_block_steps": 16, "frontier": frontier, "evidence": {} if frontier else {"head": {}},
              "decision": {"method": "m", "stop_reason": "expanding_does_not_pay"}}
    card = model_card(record, "out")
    place = "arm's" if frontier else "candidate place's"
    assert f"Every {place} evidence is in `expansion.json` {keys}." in card
