"""The budgeted expansion decisions: the frontier over K (``--blocks auto``) and the placement check (``--blocks K``).

The arithmetic (trial plan, log-linear extrapolation, choice) against independent computations
(``numpy.polyfit``, the plan's inequality checked at T and T + 1, constructed predictions); the trials
against a hand-written training loop with the same seed on tiny real Hugging Face models; the budget against
the passes and optimizer steps counted by hooks on the real model and optimizer; the command's words.
"""

from __future__ import annotations

import json
import math
import re
import sys

import numpy as np
import pytest

from satcore import InputError
from satcore.adapter_api import (Prediction, block_counts, choose_blocks, plan_trials, predict_change,
                                 uniform_groups, uniform_places)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from satcore import Recipe  # noqa: E402
from satcore.adapters.torch.expansion import expand, insert_blocks, split_batches  # noqa: E402
from satcore.adapters.torch.expansion_frontier import DecisionBudget  # noqa: E402

from test_expand import checkpoint, cli  # noqa: E402,F401  (the module-scoped checkpoint fixture)

T = transformers
SMALL = dict(vocab_size=64, max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=0,
             attn_implementation="eager")


def llama(layers=3, seed=0):
    torch.manual_seed(seed)
    return T.LlamaForCausalLM(T.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                            num_attention_heads=4, num_key_value_heads=2, **SMALL)).eval()


def gpt2(layers=3, seed=0):
    torch.manual_seed(seed)
    config = {k: v for k, v in SMALL.items() if k != "max_position_embeddings"}
    return T.GPT2LMHeadModel(T.GPT2Config(n_embd=16, n_layer=layers, n_head=4, n_positions=32, **config)).eval()


def windows(n, length=12, seed=1):
    """Token windows with structure to learn: each window counts up from a random start (mod 63, ids 1..63)."""
    start = torch.randint(0, 63, (n, 1), generator=torch.Generator().manual_seed(seed))
    return 1 + (start + torch.arange(length)) % 63


# --- the arithmetic ---------------------------------------------------------------------------------
def test_block_counts_and_uniform_places():
    assert block_counts(1) == (0, 1) and block_counts(4) == (0, 1, 2, 4) and block_counts(6) == (0, 1, 2, 4, 6)
    # LLaMA-Pro: 32 blocks, 8 new ones, one after every 4 original blocks
    assert uniform_places(32, 8) == [4, 8, 12, 16, 20, 24, 28, "head"]
    for n, k in ((8, 2), (8, 4), (6, 4), (3, 4), (5, 1)):
        groups, places = uniform_groups(n, k), uniform_places(n, k)
        assert [g[-1] for g in groups] == places  # each group ends at its uniform place
        assert sum(groups, []) == list(range(n)) + ["head"]  # and together they are every place, once, in order
    with pytest.raises(InputError, match="has 4 places"):
        uniform_places(3, 5)


def test_prediction_is_the_least_squares_line_in_log_steps_and_its_noise():
    rng = np.random.default_rng(0)
    steps, full = (3, 6, 12), 400
    changes = rng.normal(size=(3, 3, 40)) * 0.01 - 0.02 * np.log2(np.array(steps))[None, :, None]
    got = predict_change(changes, steps, full)
    # reference: numpy.polyfit per window and replicate, read at log2(400)
    x = np.log2(steps)
    per = np.array([[np.polyval(np.polyfit(x, changes[r, :, i], 1), math.log2(full)) for i in range(40)]
                    for r in range(3)])
    assert got.point == pytest.approx(per.mean(), abs=1e-12)
    assert got.se_sample == pytest.approx(per.mean(0).std(ddof=1) / math.sqrt(40), rel=1e-10)
    assert got.se_seed == pytest.approx(per.mean(1).std(ddof=1) / math.sqrt(3), rel=1e-10)
    half = 1.959963984540054 * math.hypot(got.se_sample, got.se_seed)
    assert got.interval == pytest.approx((got.point - half, got.point + half), abs=1e-12)
    one_seed = predict_change(changes[:1], steps, full)
    assert one_seed.se_seed == 0.0


@pytest.mark.parametrize("planned,fraction,arms,replicates,fixed,reading", [
    (1000, 0.1, 4, 2, 3.5, 1.25), (5000, 0.05, 5, 3, 10.0, 2.0), (300, 1.0, 2, 1, 1.0, 0.0)])
def test_the_plan_is_the_longest_trial_within_the_budget(planned, fraction, arms, replicates, fixed, reading):
    plan = plan_trials(planned, fraction, arms, replicates, fixed, reading)

    def cost(t):  # every pass: fixed, then each trial's steps and its 3 readings
        return fixed + arms * replicates * (t + 3 * reading)

    assert plan.cost_steps == pytest.approx(cost(plan.trial_steps))
    assert cost(plan.trial_steps) <= fraction * planned < cost(plan.trial_steps + 1)
    assert len(plan.checkpoints) == 3 and plan.checkpoints[-1] == plan.trial_steps


def test_a_budget_too_small_is_refused_naming_one_that_decides():
    with pytest.raises(InputError) as caught:
        plan_trials(200, 0.1, 4, 2, 3.0, 1.0)
    message = str(caught.value)
    assert "20 model-steps" in message and "\n" not in message
    fraction = float(re.search(r"--decision-budget ([0-9.]+)", message).group(1))
    steps = int(re.search(r"--steps (\d+)", message).group(1))
    assert plan_trials(200, fraction, 4, 2, 3.0, 1.0).trial_steps >= 4  # what it names is enough
    assert plan_trials(steps, 0.1, 4, 2, 3.0, 1.0).trial_steps >= 4
    with pytest.raises(InputError, match="needs at least"):  # more than the whole training: only --steps is named
        plan_trials(20, 1.0, 4, 2, 3.0, 1.0)


def _p(point):
    return Prediction(point, (point - 0.01, point + 0.01), 0.005, 0.0)


def test_the_choice_is_the_fewest_blocks_within_the_tolerance_of_the_best():
    target = {0: _p(-0.10), 1: _p(-0.14), 2: _p(-0.155), 4: _p(-0.16)}
    assert choose_blocks(target, None, 0.01).chosen_blocks == 2  # -0.155 is within 0.01 of -0.16, -0.14 is not
    assert choose_blocks(target, None, 0.03).chosen_blocks == 1
    no = choose_blocks(target, None, 0.07)
    assert no.chosen_blocks == 0 and no.best_blocks == 4 and no.reason.startswith("expanding does not pay here")
    general = {0: _p(0.30), 1: _p(0.02), 2: _p(0.08), 4: _p(0.12)}
    kept = choose_blocks(target, general, 0.01, max_forgetting=0.05)
    assert kept.chosen_blocks == 1 and kept.excluded == (0, 2, 4)
    none = choose_blocks(target, general, 0.01, max_forgetting=0.01)
    assert none.chosen_blocks == 0 and "every arm" in none.reason
    with pytest.raises(InputError, match="general"):
        choose_blocks(target, None, 0.01, max_forgetting=0.05)


# --- the trials -------------------------------------------------------------------------------------
def _hand_trained_change(model, ids, places, recipe, seed, steps):
    """The arm trained by hand: blocks at ``places``, AdamW on every parameter, minibatches of the training
    half drawn by a seeded permutation per pass, the held-out loss from the model's own ``.loss`` per window."""
    train, held = split_batches(ids)
    pool = torch.cat([b[0]["input_ids"] for b in train])
    heldout = torch.cat([b[0]["input_ids"] for b in held])
    grown, _ = insert_blocks(model, places)
    grown.eval()
    optimizer = torch.optim.AdamW(grown.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)

    def heldout_loss():
        with torch.no_grad():
            return float(np.mean([grown(input_ids=w[None], labels=w[None]).loss.item() for w in heldout]))

    before, generator, done = heldout_loss(), torch.Generator().manual_seed(seed), 0
    while done < steps:
        order = torch.randperm(len(pool), generator=generator)
        for start in range(0, len(pool) - recipe.batch_size + 1, recipe.batch_size):
            if done == steps:
                break
            batch = pool[order[start:start + recipe.batch_size]]
            loss = grown(input_ids=batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
    return heldout_loss() - before


@pytest.mark.parametrize("build", [llama, gpt2])
def test_frontier_fields_agree_with_the_trials_and_a_hand_trained_arm(build):
    model, ids = build(), windows(64)
    recipe = Recipe("adamw", lr=3e-3, steps=600, batch_size=4)
    expansion = expand(model, ids, blocks="auto", recipe=recipe, seed=5,
                       budget=DecisionBudget(0.2, general=windows(16, seed=9)))
    record = expansion.to_dict()
    frontier, plan = record["frontier"], record["decision"]["plan"]
    assert [a["blocks"] for a in frontier] == [0, 1] and [a["places"] for a in frontier] == [[], ["head"]]
    x = np.log2(plan["checkpoints"])
    for arm in frontier:
        # the prediction is the trials' mean curve fitted linearly in log2(steps), read at the planned steps
        for key, curve in (("predicted_heldout_change", "heldout_change"), ("predicted_general_change",
                                                                           "general_change")):
            mean_curve = np.mean(arm["trial"][curve], axis=0)
            assert arm[key] == pytest.approx(np.polyval(np.polyfit(x, mean_curve, 1), math.log2(600)), abs=1e-9)
        low, high = arm["interval"]
        assert low < arm["predicted_heldout_change"] < high
        assert arm["predicted_general_change"] != 0.0  # measured, not assumed zero
    # replicate 0 of the K = 1 arm, trained by hand with the same seed, reaches the same held-out change
    by_hand = _hand_trained_change(model, ids, ["head"], recipe, 5, plan["trial_steps"])
    assert frontier[1]["trial"]["heldout_change"][0][-1] == pytest.approx(by_hand, rel=1e-3, abs=1e-5)
    chosen = record["chosen_blocks"]
    assert record["positions"] == ([] if chosen == 0 else [len(find_layers(expansion)) - 1])
    assert 0 < record["decision_cost_fraction"] <= 0.2


def find_layers(expansion):
    from satcore.adapters.torch import find_blocks

    return find_blocks(expansion.model)


def test_the_budget_caps_every_pass_and_optimizer_step_actually_run():
    """Hooks on the real model's embedding (copied into every trial's copy) and on every optimizer count what ran:
    passes with gradients (the timing step and the trials' steps) and evaluations (forward only)."""
    model, ids = llama(4), windows(64)
    counts = {"grad_windows": 0, "eval_windows": 0, "optimizer_steps": 0}

    def count(module, args):
        counts["grad_windows" if torch.is_grad_enabled() else "eval_windows"] += args[0].shape[0]

    model.model.embed_tokens.register_forward_pre_hook(count)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(lambda *_: counts.__setitem__("optimizer_steps",
                                                                             counts["optimizer_steps"] + 1))
    recipe = Recipe("adamw", lr=1e-3, steps=800, batch_size=8)
    try:
        record = expand(model, ids, blocks="auto", recipe=recipe, max_blocks=2,
                        budget=DecisionBudget(0.1)).to_dict()
    finally:
        handle.remove()
    plan = record["decision"]["plan"]
    assert counts["optimizer_steps"] == 3 * 2 * plan["trial_steps"]  # arms K = 0, 1, 2, two seeds each
    assert counts["grad_windows"] == 8 * (2 + counts["optimizer_steps"])  # and the two timed steps
    spent = counts["grad_windows"] / 8 + counts["eval_windows"] / 8 / 3
    assert spent == pytest.approx(record["decision"]["cost_steps"]) and spent <= 0.1 * 800
    assert record["decision_cost_fraction"] == pytest.approx(spent / 800)


def test_the_plan_is_announced_before_any_step():
    model, ids = llama(), windows(64)
    seen, steps = [], []
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(lambda *_: steps.append(1))
    try:
        expand(model, ids, blocks="auto", recipe=Recipe("adamw", lr=1e-3, steps=600, batch_size=8),
               budget=DecisionBudget(announce=lambda text: seen.append((len(steps), text))))
    finally:
        handle.remove()
    (done_then, text), = seen
    assert done_then == 0 and steps
    assert re.search(r"cost: [0-9.]+ model-steps, [0-9.]+% of the planned 600 \([0-9,]+ tokens\); about", text)


def test_a_move_needs_a_credible_trial_else_the_places_are_uniform():
    """blocks=K with a budget: the screen proposes its first place in each group; with a recipe that cannot move
    the loss (lr 1e-12) no trial shows a credible gain, so the blocks stay at LLaMA-Pro's uniform places."""
    model, ids = llama(4), windows(64)
    expansion = expand(model, ids, blocks=2, recipe=Recipe("adamw", lr=1e-12, steps=600, batch_size=8),
                       budget=DecisionBudget(0.2))
    check = expansion.to_dict()["decision"]["placement_check"]
    assert check["uniform"] == [2, "head"] and expansion.inserted_before == [2, "head"]
    assert check["moves"] and not any(m["moved"] for m in check["moves"])
    ranking = expansion.decision.ranking()  # the screen's
    for move in check["moves"]:
        names = {("head" if p == "head" else f"model.layers.{p}"): p for p in move["group"]}
        assert move["proposed"] == names[next(n for n in ranking if n in names)] != move["uniform"]


# --- the command --------------------------------------------------------------------------------------
def test_cli_says_expanding_does_not_pay_and_inserts_nothing(checkpoint, tmp_path):  # noqa: F811
    """A constructed case where no expansion can help: a learning rate (1e-12) under which no arm moves the loss.
    Every arm is within the tolerance of the best, so K = 0: nothing inserted, said in plain words, and the
    record agrees."""
    folder, text = checkpoint
    out = tmp_path / "grown"
    result = cli("expand", folder, "--data", text, "--blocks", "auto", "-o", out, "--seq-len", "16", "--steps", "600",
                 "--lr", "1e-12", "--general-data", text, "--quiet")
    assert result.exit_code == 0, result.output
    assert "expanding does not pay here" in result.output.lower()
    assert "instead: continue training the model as it is (your 600 steps on it)" in result.output
    assert "the model unchanged (4 layers, no block inserted)" in result.output
    record = json.loads((out / "expansion.json").read_text())
    assert record["chosen_blocks"] == 0 and record["positions"] == [] and record["num_hidden_layers"]["after"] == 4
    assert record["decision"]["stop_reason"] == "expanding_does_not_pay" and record["decision"]["choice"] == 0
    assert record["trainable_layers"] == [] and "no block was inserted" in record["llama_factory"]["reason"]
    assert not (out / "peft").exists()
    assert [a["blocks"] for a in record["frontier"]] == [0, 1]
    assert all(set(a) >= {"blocks", "predicted_heldout_change", "interval", "predicted_general_change"}
               for a in record["frontier"])
    assert T.AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 4


def test_cli_quiet_has_no_plan_no_progress_and_the_default_prints_both_first(checkpoint, tmp_path):  # noqa: F811
    folder, text = checkpoint
    args = ["--data", text, "--blocks", "auto", "--seq-len", "16", "--steps", "600"]
    quiet = cli("expand", folder, *args, "-o", tmp_path / "q", "--quiet")
    assert quiet.exit_code == 0, quiet.output
    assert "model-steps [" not in quiet.output and "plan:" not in quiet.output and "defaults:" not in quiet.output
    talks = cli("expand", folder, *args, "-o", tmp_path / "t")
    assert talks.exit_code == 0, talks.output
    out = talks.output
    assert out.index("defaults: --batch-size 8, --lr 0.0002, --max-windows 64") < out.index("plan:")
    assert out.index("plan:") < out.index("model-steps [") < out.index("frontier:")  # plan, then the bar
    assert re.search(r"cost: [0-9.]+ model-steps, [0-9.]+% of the planned 600", out)


@pytest.mark.parametrize("extra,message", [
    (["--blocks", "auto", "--steps", "50"], "--steps"),
    (["--blocks", "auto", "--steps", "600", "--max-forgetting", "0.1"], "--max-forgetting needs --general-data"),
    (["--blocks", "2", "--steps", "600", "--general-data", "X"], "belong to --blocks auto"),
    (["--blocks", "auto", "--decision-budget", "1.5"], "--decision-budget"),
])
def test_cli_refusals_are_one_line(extra, message, checkpoint, tmp_path):  # noqa: F811
    folder, text = checkpoint
    extra = [str(text) if e == "X" else e for e in extra]
    result = cli("expand", folder, "--data", text, "--seq-len", "16", "-o", tmp_path / "o", *extra)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and message in lines[-1], result.output
    assert not any("Traceback" in line for line in lines) and not (tmp_path / "o").exists()


def test_cli_plot_is_skipped_with_one_line_without_matplotlib(checkpoint, tmp_path, monkeypatch):  # noqa: F811
    folder, text = checkpoint
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = cli("expand", folder, "--data", text, "--blocks", "auto", "--seq-len", "16", "--steps", "600",
                 "-o", tmp_path / "o", "--plot", tmp_path / "f.png", "--quiet")
    assert result.exit_code == 0, result.output
    assert "the figure was skipped" in result.output and not (tmp_path / "f.png").exists()
    assert (tmp_path / "o" / "expansion.json").exists()
