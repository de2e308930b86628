"""Training exactly the new blocks of an :class:`~.expansion.Expansion`: PEFT, LLaMA-Factory, the model card.

``satcore expand`` writes, beside the grown checkpoint and ``expansion.json``:

* ``peft/adapter_config.json``: a LoRA configuration on exactly the new blocks
  (``layers_to_transform`` = their positions, ``layers_pattern`` = the stack's name, ``target_modules`` =
  every linear map of a block), which ``peft.LoraConfig.from_pretrained(OUT_DIR + "/peft")`` loads and
  ``peft.get_peft_model`` applies: adapters on the new blocks and nowhere else;
* ``llamafactory.yaml``: LLaMA-Factory settings that train exactly the new blocks.  Its freeze tuning
  picks layers by count only (the last ``n``, the first ``n``, or with ``use_llama_pro`` every
  ``(layers / n)``-th; ``llamafactory/model/adapter.py``, ``_setup_freeze_tuning``), so full training of
  the new blocks is written where the positions are one of those; otherwise its LoRA, whose
  ``lora_target`` list reaches PEFT's ``target_modules`` unchanged (a full module name matches that
  module only), with every linear map of the new blocks named (``llama_factory_lora`` in
  ``expansion.json`` holds the same settings either way);
* ``README.md``: the model card (base model, places, the decision, how to train).
"""

from __future__ import annotations

import json
import os

from torch import nn

from satcore.adapter_api import heldout_samples_words, yaml_quoted

PEFT_DIR = "peft"  # OUT_DIR/peft/adapter_config.json: peft.LoraConfig.from_pretrained(OUT_DIR/peft)
LLAMA_FACTORY_FILE = "llamafactory.yaml"
LORA_RANK, LORA_ALPHA = 8, 16  # PEFT's and LLaMA-Factory's defaults


def block_linear_maps(model: nn.Module, block: str) -> list[str]:
    """The linear maps of the block ``block`` (``nn.Linear``, and transformers' ``Conv1D`` of GPT-2), as
    names relative to it, in the block's order."""
    maps = []
    for name, module in model.get_submodule(block).named_modules():
        if name and (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"):
            maps.append(name)
    return maps


def lora_adapter_config(model: nn.Module, blocks: list[str], positions: list[int], base_model: str) -> dict:
    """``adapter_config.json`` of a LoRA on exactly the blocks at ``positions`` of ``model``'s stack
    ``blocks`` (the grown model's block names)."""
    maps = block_linear_maps(model, blocks[0])
    conv1d = any(type(model.get_submodule(f"{blocks[0]}.{m}")).__name__ == "Conv1D" for m in maps)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": LORA_RANK, "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0, "bias": "none",
            "target_modules": sorted({m.rpartition(".")[2] for m in maps}),
            "layers_to_transform": sorted(positions), "layers_pattern": blocks[0].rpartition(".")[0].rpartition(".")[2],
            "fan_in_fan_out": conv1d,  # GPT-2's Conv1D stores its weight transposed
            "inference_mode": False}


def llama_factory_lora(model: nn.Module, blocks: list[str], positions: list[int]) -> dict:
    """LLaMA-Factory's LoRA settings on exactly the new blocks: ``lora_target`` names every linear map of
    each by its full name (LLaMA-Factory splits it at commas and hands the list to PEFT, where a full
    name matches that module alone)."""
    names = [f"{blocks[p]}.{m}" for p in sorted(positions) for m in block_linear_maps(model, blocks[p])]
    return {"finetuning_type": "lora", "lora_rank": LORA_RANK, "lora_alpha": LORA_ALPHA,
            "lora_target": ",".join(names)}


def llama_pro_stride_words(original: int, k: int) -> str:
    """Why LLaMA-Factory's ``use_llama_pro`` cannot select ``k`` new blocks in ``original + k`` layers, where
    that is divisibility (else ""): it refuses a layer count that ``n`` does not divide, and K blocks at
    LLaMA-Pro's uniform places are its every ``(layers / n)``-th layer exactly where K divides the original
    layers (then ``original + k`` is a multiple of ``k`` too)."""
    if not k or (original + k) % k == 0:
        return ""
    return (f"; its use_llama_pro needs the {original + k} layers to be a multiple of n = {k}: K blocks at uniform "
            f"places are its every (layers/n)-th layer where K divides the original {original}")


def llama_factory_yaml(record: dict, out_dir: str) -> str:
    """A LLaMA-Factory configuration training exactly the new blocks (module docstring); the dataset and
    output keys are the user's to add."""
    freeze = record["llama_factory"]
    method = freeze if freeze.get("expressible", True) else record["llama_factory_lora"]
    why = ("full training of the new blocks (freeze tuning selects them)" if method is freeze else
           "LoRA on the new blocks (freeze tuning selects the last, the first or every (layers/n)-th layer only)")
    lines = ["# written by satcore expand: trains exactly the new blocks " + json.dumps(record["trainable_layers"]),
             f"# {why}",
             "# add your dataset, template and output_dir, then: llamafactory-cli train THIS_FILE",
             f"model_name_or_path: {yaml_quoted(os.path.abspath(out_dir))}", "stage: pt", "do_train: true"]
    # strings as YAML double-quoted scalars (a path's DEL or line breaks escaped); numbers and flags as JSON's
    lines += [f"{key}: {yaml_quoted(value) if isinstance(value, str) else json.dumps(value)}"
              for key, value in method.items()]
    return "\n".join(lines) + "\n"


def model_card(record: dict, out_dir: str) -> str:
    """``README.md``: the base model, where the new blocks are, the decision, how to train them (or, where the
    decision added none, that the model is the base model and is to be trained as it is)."""
    layers = record["num_hidden_layers"]
    decision = record.get("decision") or {}
    # every arm over --max-forgetting: the first line says so, in the choice's reason; the rest say it no more
    reason_first = not record["positions"] and decision.get("stop_reason") == "no_arm_within_max_forgetting"
    lines = ["---", "library_name: transformers", "tags: [satcore, block-expansion, llama-pro]", "---", "",
             f"# {os.path.basename(os.path.abspath(out_dir))}", ""]
    if record["positions"]:
        lines += [f"Base model: `{record['source']}`, grown from {layers['before']} to {layers['after']} layers by "
                  f"`satcore expand` (identity blocks, init `{record['init']}`: each new block adds exactly 0, so the "
                  "model computes what the base model computes until the new blocks are trained).", "",
                  "## Where the new blocks are", "",
                  "| position in this model | inserted before original block | copied from |", "|---|---|---|"]
        for position, before, source in zip(record["positions"], record["inserted_before"], record["copied_from"]):
            lines.append(f"| {position} | {before} | {'-' if source is None else source} |")
    else:
        # why in the choice's own words where every arm is over --max-forgetting (decision.instead says only what
        # to do)
        why = (f", because {decision['reason']}" if reason_first else
               ", because the decision below could not show on this data whether expanding pays"
               if decision.get("stop_reason") == "heldout_too_small" else
               ", because the decision below did not show that expanding pays on this data (its trials could show "
               f"only a gain beyond about {decision['resolvable_gain']:.3g} nats; a smaller one is not ruled out)"
               if decision.get("resolvable_gain") is not None else
               ", because the decision below found that expanding does not pay on this data")
        instead = decision.get("instead")
        lines.append(f"Base model: `{record['source']}`, unchanged ({layers['before']} layers): `satcore expand` added "
                     f"no block{why}." + (f" Instead: {instead}." if instead else ""))
    if decision.get("warning"):
        lines += ["", f"**Warning:** {decision['warning']}."]
    lines += ["", "## The decision", ""]
    if record["layout"] == "forced":
        lines.append(f"None: the places were forced (`--at {','.join(record['forced'])}`).")
    else:
        data = record.get("data") or {}
        lines.append(f"Decided on `{data.get('file', 'the data')}` ({data.get('windows', '?')} windows of "
                     f"{data.get('seq_len', '?')} tokens) for the recipe {json.dumps(_recipe(record))}, layout "
                     f"`{record['layout']}`; it cost {_cost(record, decision)}.")
        lines.append(f"Method: {decision.get('method', 'a decision')}.")
        if decision.get("stop_reason") and not reason_first:
            lines.append(f"It stopped: `{decision['stop_reason']}`." + (
                "" if decision["stop_reason"] != "heldout_too_small" else
                " The held-out data cannot resolve a gain of the stop tolerance at some trialled place: "
                f"{heldout_samples_words(decision['heldout_samples'], decision['heldout_samples_needed'])}."))
        race = _race_words(record, decision)
        if race:
            lines.append(race)
        # --blocks auto's evidence is per arm (``frontier``); its ``evidence`` (per place) is empty
        lines.append("Every arm's evidence is in `expansion.json` (`frontier`, `decision`)." if record.get("frontier")
                     else "Every candidate place's evidence is in `expansion.json` (`evidence`, `decision`).")
    if not record["positions"]:
        return "\n".join(lines) + "\n"
    layers_only = f"layers {record['trainable_layers']} only (LLaMA-Pro's recipe"
    if record["layout"] == "forced" or _recipe(record)["train"] == "new_blocks":
        how = f"Train {layers_only}{'' if record['layout'] == 'forced' else ', the one the decision priced'}), with any of:"
    else:  # the decision priced training every parameter: the card may not send the user to another recipe unsaid
        how = ("The decision priced training every parameter of the grown model (the recipe's `\"train\": \"all\"`; "
               "`--freeze-old` prices training the new blocks only): train it so, with your trainer's full "
               f"fine-tuning. To train {layers_only}, which this decision did not price) instead, with any of:")
    lora_factory = not record["llama_factory"].get("expressible", True)
    lines += ["", "## How to train the new blocks", "", how, "",
              # the folder's absolute path, as llamafactory.yaml's model_name_or_path: "peft" alone loaded only
              # from inside OUT_DIR
              "* PEFT: `peft.get_peft_model(model, peft.LoraConfig.from_pretrained("
              f"{json.dumps(os.path.join(os.path.abspath(out_dir), PEFT_DIR))}))` puts LoRA "
              f"adapters (rank {LORA_RANK}) on exactly those layers: low-rank updates, not those layers' full training;",
              f"* LLaMA-Factory: `{LLAMA_FACTORY_FILE}` (add your dataset), `llamafactory-cli train "
              f"{LLAMA_FACTORY_FILE}`" + ("; LoRA on those layers, as PEFT's, since LLaMA-Factory's freeze tuning "
                                         "selects the last, the first or every (layers/n)-th layer only"
                                         + llama_pro_stride_words(layers["before"], len(record["positions"])) + ";"
                                         if lora_factory else ": full training of those layers (freeze tuning);"),
              "* ms-swift: `--train_type full --freeze_parameters_ratio 1 --trainable_parameters "
              + " ".join(record["ms_swift"]["trainable_parameters"]) + "`;",
              "* plain PyTorch: set `requires_grad` on parameters whose names start with "
              + ", ".join(f"`{p}`" for p in record["ms_swift"]["trainable_parameters"]) + " only.",
              "", "`mergekit.yaml` rebuilds the same layer layout from the base model (`mergekit-yaml`)."]
    return "\n".join(lines) + "\n"


def write_training_exports(folder: str, record: dict, peft_config: dict, out_dir: str) -> None:
    """Write ``peft/adapter_config.json`` (``peft_config``: :func:`lora_adapter_config`), ``llamafactory.yaml``
    (both only where a block was inserted) and ``README.md`` into ``folder``, the directory that becomes
    ``out_dir``; ``record``: ``expansion.json`` 's contents."""
    if record["positions"]:  # no new block: nothing to train, no adapter
        os.makedirs(os.path.join(folder, PEFT_DIR))
        with open(os.path.join(folder, PEFT_DIR, "adapter_config.json"), "w") as stream:
            json.dump(peft_config, stream, indent=1)
        with open(os.path.join(folder, LLAMA_FACTORY_FILE), "w") as stream:
            stream.write(llama_factory_yaml(record, out_dir))
    with open(os.path.join(folder, "README.md"), "w") as stream:
        stream.write(model_card(record, out_dir))


def _cost(record: dict, decision: dict) -> str:
    """The decision's cost as the command printed it: a budgeted decision's :func:`cost_words`, else block-steps."""
    budgeted = decision.get("placement_check") or decision
    if "cost_steps" not in budgeted:
        return f"{record['cost_block_steps']} block-steps"
    return cost_words(budgeted["cost_steps"], record["decision_cost_fraction"], budgeted["plan"]["planned_steps"],
                      decision.get("chosen_cost_fraction"), decision.get("choice"))


def _race_words(record: dict, decision: dict) -> str | None:
    """What the race did (``decision.race``, where ``--blocks auto`` raced; None where it did not): which arms'
    trials stopped early and at which step, and what the decision spent against the ceiling printed before it
    started (the unspent rest is the user's training's)."""
    race = decision.get("race") or {}
    if not race.get("on"):
        return None
    plan = decision["plan"]
    steps = plan["trial_steps"]
    stopped = {k: step for k, step in race["arm_steps"].items() if step < steps}
    if race["stopped_at_step"] is not None:
        what = f"every trial stopped at step {race['stopped_at_step']} of {steps}"
    elif stopped:
        what = (", ".join(f"K = {k} stopped at step {step}" for k, step in stopped.items())
                + f" of {steps}; the other arms trained all {steps} steps")
    else:
        what = f"no trial stopped early: every arm trained all {steps} steps"
    return ("The trials raced: an arm with new blocks stops once it can no longer beat K = 0 (no new block, the same "
            f"training) credibly, and K = 0 with the last of them. Here {what}. The decision spent "
            f"{decision['cost_steps']:.1f} planned steps' FLOPs ({record['decision_cost_fraction']:.1%} of the planned "
            f"{plan['planned_steps']} steps' FLOPs) of a ceiling of {race['ceiling_cost_steps']:.1f} "
            f"({plan['cost_fraction']:.1%}), printed before it started" + ("; the rest is your training's." if stopped
                                                                         else "."))


def cost_words(cost_steps: float, fraction: float, planned_steps: int, chosen_fraction: float | None = None,
               chosen_blocks: int | None = None) -> str:
    """A budgeted decision's cost in words, the one wording of the command's cost line and the model card: its
    planned steps' FLOPs and their share of the planned steps, and with a frontier's choice its share of the chosen
    arm's steps (``chosen_fraction``, None without one)."""
    words = f"{cost_steps:.1f} planned steps' FLOPs, {fraction:.1%} of the planned {planned_steps} steps' FLOPs"
    if chosen_fraction is not None:
        words += f"; {chosen_fraction:.1%} of {planned_steps} steps of the chosen K = {chosen_blocks}"
    return words


def _recipe(record: dict) -> dict:
    """The recipe as ``expansion.json`` states the training: what trains is its ``train`` (``all``, or
    ``new_blocks`` with ``--freeze-old``), not the recipe's own ``trainable``."""
    return {**{k: v for k, v in record["recipe"].items() if k != "trainable"}, "train": record.get("train", "all")}
