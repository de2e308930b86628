"""Grow a pretrained decoder by identity blocks where the evidence says: ``expand`` and its exports.

What practitioners run today to add depth to a pretrained decoder is LLaMA-Pro's
block expansion (Wu et al., "LLaMA Pro: Progressive LLaMA with Block
Expansion"): copy blocks, zero their output projections so that each new block
is the identity, interleave them uniformly, train the new blocks on the new
corpus.  :func:`expand` does the same insertion but places the blocks where a
decision on the user's own data says (the first-order criterion of Liu et al.,
"Quantifying Depth Sufficiency in Residual Neural Networks: A First-Order
Criterion"), and :class:`Expansion` writes what the tools people already use
read: a mergekit passthrough YAML that rebuilds the same layer layout from the
original checkpoint, and the trainable-layer settings of LLaMA-Factory and
ms-swift.

The placement is ONE decision step over the candidates of the unexpanded model
(:func:`first_order_decision`: the native-family probe on a training and a
held-out split, and the predicted held-out change of the recipe's step per
candidate), then a ranking: ``blocks=K`` takes the ``K`` candidates with the
largest predicted held-out decrease.  (That is ``decision="screen"``, whose rows
are *not verified*: no trial, no interval, no ``P(decrease)``; it cannot price
``K = 0`` against ``K > 0``, so ``blocks="auto"`` needs trials.  The default
``"trial"`` verifies the screen's best places by short trials,
:func:`placement_decision`.)  ``layout="grouped"``
reads the decision group by group instead: one block in each of ``K``
contiguous groups of places, LLaMA-Pro's groups (:class:`GroupedPlacement`).
Why one step and not ``K`` rounds of decide-then-insert: an inserted identity
block leaves the stream, the loss and the gradients of the model unchanged, so
every other candidate's first-order statistics after an insertion are what they
were before; rounds without training between them would repeat one ranking at
``K`` times its cost.

Layout words: a new block's ``position`` is its index in the grown stack;
``inserted_before`` is the index of the ORIGINAL block it precedes, or
``"head"`` after the last one.  ``init="copy"`` (LLaMA-Pro) copies the original
block before the new one (block 0 for a block inserted before block 0) and
zeroes its output projections: Llama-style ``self_attn.o_proj`` and
``mlp.down_proj``, GPT-2 ``attn.c_proj`` and ``mlp.c_proj``, GPT-NeoX
``attention.dense`` and ``mlp.dense_4h_to_h`` (weights and biases);
``init="fresh"`` builds the block as the model builds its layers, drawn from
``seed``, with the same maps zeroed (:func:`~.native.insert_block`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from satcore import DecisionPolicy, InputError, ProbeError
from satcore import Recipe
from satcore.adapter_api import NOT_VERIFIED, render_decision, screen
from satcore.adapter_api import derived_seed, moved_keywords, read_batches, whole_number, yaml_quoted

from .expansion_exports import llama_factory_lora, llama_pro_stride_words
from .expansion_frontier import PROBE_TIME_RATIO, DecisionBudget, StepTimes, _windows, probe_time, timed_step, timing_record
from .hf import context_length, sequence_loss
from .input_bounds import check_new_block_count, check_token_ids, forked_rng
from .locate import HEAD, find_blocks
from .native import HF_TERMINALS, _check_hf, _has, insert_block
from .probe import ProbeConfig
from .splits import probe_splits_in_passes, statistics_passes

INITS = ("copy", "fresh")
# LLaMA-Pro's recipe (the paper trains the new blocks with AdamW at 2e-4); steps and batch size are the user's
DEFAULT_RECIPE = Recipe("adamw", lr=2e-4, steps=1000, batch_size=8, trainable="block")
# mergekit ``scale`` filters (substrings of tensor names) that zero a copied block's output projections
MERGEKIT_FILTERS = {
    ("attn.c_proj", "mlp.c_proj"): ("c_proj",),
    ("attention.dense", "mlp.dense_4h_to_h"): ("attention.dense", "dense_4h_to_h"),
    ("self_attn.o_proj", "mlp.down_proj"): ("o_proj", "down_proj"),
}


# --- the decision step ----------------------------------------------------------------------
@dataclass(frozen=True)
class ScreenDecision:
    """What :func:`first_order_decision` found: each candidate's first-order predicted held-out change of the
    recipe's step (negative: the loss goes down), as :meth:`satcore.CandidateDecision.screen_only` rows
    (``verified`` false, ``"not verified"``, no interval or ``P(decrease)``; why: :class:`satcore.CandidateDecision`).
    It ranks the places; no trial verified any, so it chooses none: whether to add a block is a trial's question
    (``choice`` and ``stop_reason`` None, no place :meth:`significant`).  ``step_times``: the timed passes of the
    time estimate of ``expand``'s announced plan (:class:`~.expansion_frontier.StepTimes`), None where no plan was
    announced (nothing timed)."""

    candidates: dict  # name -> CandidateDecision, the candidates' depth order
    cost_block_steps: int
    recipe: Recipe
    step_times: StepTimes | None = None

    @property
    def choice(self) -> None:
        return None

    @property
    def stop_reason(self) -> None:
        return None

    def ranking(self) -> list[str]:
        """Candidate names, largest predicted held-out decrease first."""
        return sorted(self.candidates, key=lambda n: self.candidates[n].predicted_heldout_change)

    def significant(self, name: str) -> bool:
        """False: a screen verifies no place."""
        return False

    def __str__(self) -> str:
        """The screen's table and notes (``print(decision)``), as an :class:`satcore.InsertionDecision` shows its
        own: the place it ranks first, its cost, each candidate's predicted held-out change, not verified."""
        return render_decision(self)

    def to_dict(self) -> dict:
        return {"cost_block_steps": self.cost_block_steps, "recipe": self.recipe.to_dict(),
                "candidates": {n: c.to_dict() for n, c in self.candidates.items()}, **timing_record(self.step_times)}


def first_order_decision(model: nn.Module, train, heldout, loss_fn=None, *, recipe: Recipe | None = None,
                         policy: DecisionPolicy | None = None, progress=None) -> ScreenDecision:
    """The first-order screen: probe ``model`` on ``train`` and ``heldout`` (:func:`~.splits.probe_splits`; the
    policy's probe, by default ``family="native"``: the tangent space of the block that will be inserted) and price
    the recipe's step at every candidate on the held-out folds (:func:`satcore._decisions.predictors.predict_gains`).

    The predicted step is ``recipe.steps`` steps of the recipe's optimizer (Adam for AdamW) on the
    new block's zeroed terminal maps, with the gradient held at its value at insertion.  The rows are
    :meth:`satcore.CandidateDecision.screen_only` (:class:`ScreenDecision`): ranked by that prediction, not
    verified, with no interval or ``P(decrease)`` and no choice.  Cost: each probed sample is one forward and
    backward pass of the model, as one training sample is, so the probe costs
    ``ceil(samples / recipe.batch_size)`` steps of training one block (block-steps).
    ``recipe`` or ``policy`` (:class:`satcore.DecisionPolicy`) as :func:`~.decide.decide` takes them: its
    ``candidates``, ``seed`` and ``probe`` are read, and ``max_statistics_bytes`` probes the candidates in
    groups whose statistics fit, as :func:`~.decide.decide` does (one pass over both splits per group, the cost
    counted per pass); its ``trials`` are not (no trial is run).  ``progress``: called with each probed batch's
    sample count as the probe goes (every pass's batches; ``None``: silent).
    """
    from .decide import decision_probe_options

    policy = DecisionPolicy.of(recipe, policy, by="first_order_decision")
    recipe = policy.recipe
    train, heldout = list(train), list(heldout)
    evidence = {}

    def read(_, split):
        # decide's screen (satcore.adapter_api.screen), its rows kept in the candidates' depth order
        rows = {row.name: row for row in screen(split.train.statistics, split.heldout.statistics, recipe)}
        for name in (n for n in split.heldout.statistics if n in rows):
            evidence[name] = rows[name].candidate()

    probe_options = decision_probe_options(policy, ProbeConfig(family="native"))
    passes = statistics_passes(model, train, loss_fn, policy.max_statistics_bytes, **probe_options)
    probe_splits_in_passes(model, train, heldout, loss_fn, read, passes=passes, progress=progress, **probe_options)
    samples = len(passes) * _windows(train + heldout)
    return ScreenDecision(evidence, math.ceil(samples / recipe.batch_size), recipe)


def probe_memory_plan(model: nn.Module, batch, policy: DecisionPolicy):
    """The :class:`~.probe.MemoryPlan` of the decision's probe of ``model`` under ``policy`` (the native family, the
    policy's places), from one forward pass of ``batch``: what ``max_statistics_bytes`` splits into passes, and the
    least it can be (:meth:`~.probe.MemoryPlan.least_max_bytes`, both splits), checked before any decision runs."""
    from .decide import decision_probe_options
    from .probe import plan

    return plan(model, batch, sequence_loss, **decision_probe_options(native_policy(policy)))


def probe_passes(model: nn.Module, batch, policy: DecisionPolicy) -> int:
    """Passes over the data the decision's probe makes under ``policy``: one, or with its ``max_statistics_bytes``
    one per group of places whose statistics fit (:func:`probe_memory_plan`, a forward pass of ``batch``)."""
    if policy.max_statistics_bytes is None:
        return 1
    return len(probe_memory_plan(model, batch, policy).passes(policy.max_statistics_bytes, splits=2))


def _screen_plan(model: nn.Module, train: list, heldout: list, policy: DecisionPolicy, blocks: int, layout: str,
                 passes: int, times: StepTimes) -> str:
    """The plan :func:`_screen_with_bar` announces before the screen starts, as the placement check's: what it reads
    (``passes`` passes over the windows of ``train`` and ``heldout``), its cost in block-steps (what it records,
    ``cost_block_steps``) and its time here, from ``times`` (:func:`~.expansion_frontier.timed_step`: passes of the
    model not counted in that cost) at the work it priced (:attr:`StepTimes.priced`, :func:`_screen_work`)."""
    recipe = policy.recipe
    trained, held = (_windows(split) for split in (train, heldout))
    cost = math.ceil(passes * (trained + held) / recipe.batch_size)
    tokens = recipe.steps * recipe.batch_size * _inputs_ids(train[0]).shape[-1]
    where = "one per group of places" if layout == "grouped" else "anywhere in the stack"
    return "\n".join([
        f"plan: place {blocks} block(s) at the places the first-order screen ranks first ({where}; --decision "
        f"screen, experimental: no trial verifies them), for your training of {recipe.steps} steps of "
        f"{recipe.batch_size} windows ({tokens:,} tokens), {recipe.optimizer} lr {recipe.lr:g}",
        f"  screen: the first-order probe of {len(decoder_stack(model)[0]) + 1} places on {trained} training + {held} "
        f"held-out windows, {passes} pass{'es' if passes > 1 else ''} over them",
        f"  cost: {cost} block-steps, {cost / recipe.steps:.1%} of the planned {recipe.steps} (not held to "
        f"--decision-budget); each window about {PROBE_TIME_RATIO:g} times a forward and backward pass, its places' "
        f"share split over the passes: {times.words(times.priced)}",
        *times.warning()])


def _screen_work(train: list, heldout: list, recipe, passes: int) -> float:
    """The first-order screen's work in the recipe's minibatches' passes of the model: :func:`probe_time` of
    ``passes`` passes over the windows of ``train`` and ``heldout``."""
    return probe_time(passes * (_windows(train) + _windows(heldout)) / recipe.batch_size, passes)


def _screen_with_bar(model: nn.Module, train: list, heldout: list, loss_fn, policy: DecisionPolicy,
                     options: "ExpansionOptions", blocks: int) -> ScreenDecision:
    """:func:`first_order_decision`, with ``options.announce`` called with its plan first (:func:`_screen_plan`; the
    decision keeps the timed passes of its time estimate, ``step_times``) and ``options.progress`` a tqdm bar
    (stderr) of the windows it probes, every pass's."""
    if not (options.progress or options.announce):
        return first_order_decision(model, train, heldout, loss_fn, policy=policy)
    passes = probe_passes(model, train[0], policy)
    times = None
    if options.announce is not None:
        times = replace(timed_step(model, train, policy.recipe),
                        priced=_screen_work(train, heldout, policy.recipe, passes))
        options.announce(_screen_plan(model, train, heldout, policy, blocks, options.layout, passes, times))
    if not options.progress:
        return replace(first_order_decision(model, train, heldout, loss_fn, policy=policy), step_times=times)
    from tqdm.auto import tqdm

    windows = _windows(train + heldout)
    bar = tqdm(total=passes * windows, unit="window", desc="probing", leave=False)
    try:
        return replace(first_order_decision(model, train, heldout, loss_fn, policy=policy, progress=bar.update),
                       step_times=times)
    finally:
        bar.close()


DECISIONS = ("trial", "screen")


class _ReadsDecision:
    """A placement's ``choice``, ``stop_reason``, ``candidates``, ``cost_block_steps``, ``heldout_samples`` and
    ``heldout_samples_needed``: those of the decision it reads (``wrapped``, a property of the subclass; a
    decision without the last two, the screen's, reads None: it resolves no stop)."""

    @property
    def choice(self):
        return self.wrapped.choice

    @property
    def stop_reason(self):
        return self.wrapped.stop_reason

    @property
    def candidates(self) -> dict:
        return self.wrapped.candidates

    @property
    def cost_block_steps(self) -> int:
        return self.wrapped.cost_block_steps

    @property
    def heldout_samples(self) -> int | None:
        return getattr(self.wrapped, "heldout_samples", None)

    @property
    def heldout_samples_needed(self) -> int | None:
        return getattr(self.wrapped, "heldout_samples_needed", None)


@dataclass(frozen=True)
class TrialRanking(_ReadsDecision):
    """:func:`~.decide.decide`'s :class:`satcore.InsertionDecision` read as a placement: candidates
    verified by a short trial of the recipe first (lowest calibrated held-out change first), then
    the ones the screen left out, in screen order; a candidate counts as significant when it was
    verified with a credible decrease (``p_decrease`` at least the calibration's threshold)."""

    decision: object  # satcore.InsertionDecision

    @property
    def wrapped(self):
        return self.decision

    def ranking(self) -> list[str]:
        rows = list(self.candidates.values())
        verified = sorted((c for c in rows if c.verified), key=lambda c: c.predicted_heldout_change)
        return [c.name for c in verified] + [c.name for c in rows if not c.verified]

    def significant(self, name: str) -> bool:
        c = self.candidates[name]
        return c.verified and c.predicted_heldout_change < 0 and \
            c.p_decrease >= self.decision.calibration.p_threshold

    def to_dict(self) -> dict:
        return self.decision.to_dict()


LAYOUTS = ("ranked", "grouped")


def place_groups(n_blocks: int, k: int) -> list[list[int | str]]:
    """The unexpanded model's ``n_blocks + 1`` places (before blocks ``0 .. n_blocks - 1``, then
    ``"head"``) split into ``k`` contiguous groups, ``numpy.array_split`` (LLaMA-Pro's groups).
    For 8 blocks and ``k`` = 2 or 4 each group holds one of uniform interleave's places
    (``[0..4], [5..head]``; ``[0..2], [3, 4], [5, 6], [7, head]``)."""
    if not 1 <= k <= n_blocks + 1:
        raise InputError(f"blocks={k}: the model has {n_blocks + 1} places for a block ({n_blocks} blocks and the "
                         "head)")
    return [[HEAD if i == n_blocks else int(i) for i in part] for part in np.array_split(np.arange(n_blocks + 1), k)]


@dataclass(frozen=True)
class GroupedPlacement(_ReadsDecision):
    """A decision read group by group: one new block per group of contiguous places
    (:func:`place_groups`), at the place of the group that ``base`` ranks first
    (:class:`TrialRanking`: the verified place with the lowest calibrated held-out change, in
    screen order where none was trialled; :class:`ScreenDecision`: the largest predicted
    decrease, not verified).  ``ranking()`` lists the groups' places first (in ``base`` 's order), then
    every other candidate as ``base`` ranks it; only a group's place can be significant."""

    base: object  # TrialRanking or ScreenDecision
    groups: tuple  # of tuples of candidate names

    @property
    def wrapped(self):
        return self.base

    def choices(self) -> list[str]:
        """Each group's place, bottom group first."""
        ranked = self.base.ranking()
        return [next(n for n in ranked if n in group) for group in self.groups]

    def ranking(self) -> list[str]:
        ranked = self.base.ranking()
        chosen = set(self.choices())
        return [n for n in ranked if n in chosen] + [n for n in ranked if n not in chosen]

    def significant(self, name: str) -> bool:
        return name in self.choices() and self.base.significant(name)

    def to_dict(self) -> dict:
        return {**self.base.to_dict(), "groups": [list(g) for g in self.groups]}


def native_policy(policy: DecisionPolicy) -> DecisionPolicy:
    """``policy`` with its probe's family ``"native"``: the blocks :func:`expand` inserts are of the model's own
    kind, so its decisions probe exactly their tangent space."""
    return replace(policy, probe=replace(policy.probe or ProbeConfig(), family="native"))


def placement_decision(model: nn.Module, train, heldout, loss_fn=None, *, policy: DecisionPolicy,
                       options: "ExpansionOptions", blocks: int | str | None = None):
    """The ranking :func:`expand` places blocks by, under ``policy`` (:class:`satcore.DecisionPolicy`; its probe's
    family is ``"native"`` here, :func:`native_policy`).

    ``options`` (:class:`ExpansionOptions`) says how: ``decision="trial"``: :func:`~.decide.decide`
    (``policy.trials.max_trials`` trials, the even plan), read as a :class:`TrialRanking`; ``"screen"``:
    :func:`first_order_decision` (its rows not verified, none significant).
    ``layout="ranked"``: that ranking as it is (``expand`` takes its top ``K``);
    ``"grouped"``: a :class:`GroupedPlacement` over ``blocks`` groups of places
    (:func:`place_groups`; ``blocks="auto"``: ``max_trials`` groups, at most one per place), the trials spread over the
    groups (each group's first ``ceil(max_trials / groups)`` places in the screen's order,
    :func:`~.decide.grouped_trials`; their steps still add up to at most the recipe's).
    ``loss_fn`` ``None``: next-token cross-entropy (:func:`~.hf.sequence_loss`).  ``options.progress``: a tqdm bar
    (stderr) of the windows the screen probes (``decision="screen"``)."""
    decision, layout = options.decision, options.layout
    loss_fn = sequence_loss if loss_fn is None else loss_fn
    policy = native_policy(policy)
    max_trials = policy.trials.max_trials
    groups = None
    if layout == "grouped":
        if blocks != "auto" and not (isinstance(blocks, int) and not isinstance(blocks, bool)):
            raise InputError(f"layout='grouped' needs blocks, an integer or 'auto', got {blocks!r}")
        names, _ = decoder_stack(model)
        places = place_groups(len(names), min(max_trials, len(names) + 1) if blocks == "auto" else blocks)
        groups = tuple(tuple(HEAD if p == HEAD else names[p] for p in group) for group in places)
    if decision == "screen":
        ranked = _screen_with_bar(model, list(train), list(heldout), loss_fn, policy, options, blocks)
    else:
        from .decide import decide

        # the even plan: K places are taken from the ranking (one per group with the grouped layout), so
        # every trialled place needs a trial of the same length (docs/expansion.md measured it this way)
        if policy.trials.schedule != "even":
            raise InputError("expand: the placement's trials run the even plan (every place trialled as long, so "
                             f"that K places can be read off one ranking); the policy's schedule is "
                             f"{policy.trials.schedule!r}")
        trials = replace(policy.trials, groups=groups)
        ranked = TrialRanking(decide(model, train, heldout, loss_fn, policy=replace(policy, trials=trials)))
    return ranked if groups is None else GroupedPlacement(ranked, groups)


# --- the grown model --------------------------------------------------------------------------
@dataclass(frozen=True)
class NewBlock:
    """A block :func:`insert_blocks` added: where it sits, which original block it precedes, what it copies."""

    position: int
    inserted_before: int | str
    source: int | None  # the original block it copies (init="copy"), else None


def decoder_stack(model: nn.Module) -> tuple[list[str], tuple[str, str]]:
    blocks = find_blocks(model)
    if not blocks or not hasattr(model, "config"):
        raise ProbeError(f"{type(model).__name__}: no stack of decoder blocks recognised")
    terminals = next((pair for pair in HF_TERMINALS if all(_has(model.get_submodule(blocks[0]), p) for p in pair)),
                     None)
    if terminals is None:
        raise ProbeError(f"{type(model).__name__}: its blocks ({type(model.get_submodule(blocks[0])).__name__}) have "
                         "none of the output projections expand zeroes (o_proj/down_proj, c_proj, "
                         "attention.dense/dense_4h_to_h)")
    _check_hf(model)  # refused here, before a decision is paid for, not when the first block goes in
    return blocks, terminals


def _before_index(value, n_blocks: int) -> int:
    return n_blocks if value == HEAD else int(value)


def layout_of(inserted_before, n_blocks: int) -> list[int | None]:
    """The grown stack as original indices, ``None`` for a new block; new blocks before original
    block ``j`` (``"head"``: ``n_blocks``) in the order given."""
    counts = [0] * (n_blocks + 1)
    for value in inserted_before:
        counts[_before_index(value, n_blocks)] += 1
    layout: list[int | None] = []
    for j in range(n_blocks + 1):
        layout += [None] * counts[j]
        if j < n_blocks:
            layout.append(j)
    return layout


def insert_blocks(model: nn.Module, inserted_before, *, init: str = "copy", seed: int = 0
                  ) -> tuple[nn.Module, tuple[NewBlock, ...]]:
    """A copy of the Hugging Face decoder ``model`` with one identity block before each original block
    index in ``inserted_before`` (``"head"``: after the last block); ``model`` is not modified.

    The grown model's outputs equal the original's bit for bit; ``config.num_hidden_layers``,
    ``config.layer_types`` and every block's ``layer_idx`` follow, so generation with a cache and
    ``save_pretrained``/``from_pretrained`` work (:func:`~.native.insert_block`).
    """
    if init not in INITS:
        raise InputError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    blocks, _ = decoder_stack(model)
    n = len(blocks)
    before = []
    for value in inserted_before:
        if value != HEAD and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n):
            raise InputError(f"inserted_before: {value!r} is neither a block index 0..{n - 1} nor {HEAD!r}")
        before.append(_before_index(value, n))
    grown = model if before else copy.deepcopy(model)  # never the caller's object, even with no block to add
    # from the top down: an insertion before block j leaves the names of blocks 0..j-1 as they are
    for rank, j in enumerate(sorted(before, reverse=True)):
        at = HEAD if j == n else blocks[j]
        source = blocks[max(j - 1, 0)] if init == "copy" else None
        grown = insert_block(grown, at, seed=derived_seed(seed + rank), copy_of=source)
    layout = layout_of(before, n)
    new = []
    for position, original in enumerate(layout):
        if original is None:
            following = next((o for o in layout[position:] if o is not None), None)
            j = n if following is None else following
            new.append(NewBlock(position, HEAD if following is None else following,
                                max(j - 1, 0) if init == "copy" else None))
    return grown, tuple(new)


def max_blocks_cap(n_blocks: int, max_blocks: int | None) -> int:
    """The most blocks ``blocks="auto"`` inserts: ``max_blocks``, or a quarter of the ``n_blocks`` layers
    (LLaMA-Pro's ratio), at least 1.  A ``max_blocks`` above ``n_blocks`` is refused, not capped: the frontier's
    arms go up to the value recorded (``expansion.json``'s ``max_blocks``)."""
    if max_blocks is not None and max_blocks > n_blocks:
        raise InputError(f"max_blocks={max_blocks}: more than the model's {n_blocks} layers (give at most {n_blocks})")
    return max(1, n_blocks // 4) if max_blocks is None else max_blocks


def freeze_old(model: nn.Module, new_blocks) -> nn.Module:
    """Only the new blocks' parameters train (``requires_grad``), LLaMA-Pro's recipe; returns ``model``."""
    blocks, _ = decoder_stack(model)
    keep = {blocks[b.position] for b in new_blocks}
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(any(name.startswith(k + ".") for k in keep))
    return model


# --- the expansion and its exports --------------------------------------------------------------
@dataclass(frozen=True)
class Expansion:
    """What :func:`expand` did: the grown model, where the new blocks are, and the evidence.

    ``to_dict()`` is ``expansion.json``; :meth:`mergekit_yaml` and :meth:`trainer_settings`
    are the exports.
    """

    model: nn.Module
    new_blocks: tuple[NewBlock, ...]
    n_original: int
    init: str
    blocks_requested: int | str
    decision: ScreenDecision | None
    forced: tuple[str, ...]
    recipe: Recipe
    train_new_only: bool
    terminals: tuple[str, str]
    block_prefix: str = field(default="")
    layout: str = "ranked"
    max_blocks: int | None = None  # the cap blocks="auto" applied, else None
    budgeted: object = None  # a FrontierDecision (blocks="auto") or PlacementCheck (blocks=K with a budget)

    @property
    def positions(self) -> list[int]:
        return [b.position for b in self.new_blocks]

    @property
    def inserted_before(self) -> list[int | str]:
        return [b.inserted_before for b in self.new_blocks]

    @property
    def cost_block_steps(self) -> int:
        if self.budgeted is not None:  # every pass of the budgeted decision, in planned steps' FLOPs, rounded up
            return math.ceil(self.budgeted.cost_steps)
        return 0 if self.decision is None else self.decision.cost_block_steps

    @property
    def decision_cost_fraction(self) -> float:
        """The decision's cost over the planned training's steps (``recipe.steps``)."""
        if self.budgeted is not None:
            return self.budgeted.cost_fraction
        return self.cost_block_steps / self.recipe.steps

    @property
    def step_times(self) -> StepTimes | None:
        """The timed steps the decision's announced time estimate was made from (:class:`StepTimes`, its
        ``priced`` the work it priced): the budgeted decision's, else the screen's; None where none was made (no
        decision, an unbudgeted trial ranking, a decision that announced nothing)."""
        if self.budgeted is not None:
            return self.budgeted.step_times
        return getattr(getattr(self.decision, "base", self.decision), "step_times", None)

    def trainer_settings(self) -> dict:
        """The trainable layers in the forms LLaMA-Factory and ms-swift read (``finetuning_type: freeze``).

        LLaMA-Factory selects freeze-tuned layers by count only: the last ``n``
        (``freeze_trainable_layers: n``), the first ``n`` (``-n``), or with ``use_llama_pro: true``
        every ``stride``-th layer ``stride - 1, 2 stride - 1, ...`` (``stride = layers / n``,
        LLaMA-Pro's uniform interleave); other positions it cannot express, and the entry says
        so.  ``llama_factory_lora``: its LoRA on exactly the new blocks, any positions
        (:func:`~.expansion_exports.llama_factory_lora`; ``None`` without a new block).  ms-swift takes
        parameter-name prefixes: ``freeze_parameters_ratio: 1`` freezes everything and
        ``trainable_parameters`` unfreezes the new blocks; without a new block that would train
        nothing, so the entry is LLaMA-Factory's (``expressible: false`` and why).
        """
        total = self.n_original + len(self.new_blocks)
        layers = sorted(self.positions)
        k = len(layers)
        factory: dict = {"finetuning_type": "freeze", "freeze_trainable_modules": "all"}
        if k and total % k == 0 and layers == list(range(total // k - 1, total, total // k)):
            factory.update(freeze_trainable_layers=k, use_llama_pro=True)
        elif k and layers == list(range(total - k, total)):
            factory.update(freeze_trainable_layers=k)
        elif k and layers == list(range(k)):
            factory.update(freeze_trainable_layers=-k)
        elif not k:
            instead = getattr(self.budgeted, "instead", None)  # the frontier's advice, one text everywhere
            factory = {"expressible": False, "reason": "no block was inserted: there are no new layers to train"
                       + (f"; {instead}" if instead else "")}
        else:
            factory = {"expressible": False,
                       "reason": f"LLaMA-Factory's freeze tuning selects the last, the first or every "
                                 f"(layers/n)-th layer; layers {layers} of {total} are none of these"
                                 + llama_pro_stride_words(self.n_original, k) + ": llama_factory_lora trains them "
                                 "with its LoRA; ms-swift's trainable_parameters or the Python loop in the docs "
                                 "train them fully"}
        # with no new block, "freeze everything, unfreeze none" would train nothing: the same refusal as LLaMA-Factory's
        swift = {"train_type": "full", "freeze_parameters_ratio": 1,
                 "trainable_parameters": [f"{self.block_prefix}.{i}." for i in layers]} if k else dict(factory)
        lora = llama_factory_lora(self.model, find_blocks(self.model), layers) if layers else None
        return {"trainable_layers": layers, "llama_factory": factory, "llama_factory_lora": lora, "ms_swift": swift}

    def mergekit_yaml(self, source_dir: str, dtype: str) -> str:
        """A mergekit passthrough configuration that rebuilds this layer layout from ``source_dir``.

        Original blocks come as ``layer_range`` slices of ``source_dir``; each new block is a
        one-layer slice of the block it copies with ``scale`` 0 on its output projections
        (LLaMA-Pro's recipe in mergekit).  For ``init="copy"`` every tensor of the merge equals
        the grown checkpoint's (mergekit's ``x * 0`` writes ``-0.0`` where ``x < 0``); for
        ``init="fresh"`` the layout and the zeroed projections match, the new blocks' other
        weights are copies instead of fresh draws.
        """
        filters = MERGEKIT_FILTERS[self.terminals]
        source = mergekit_model(source_dir)
        lines = ["# written by satcore expand: mergekit-yaml THIS_FILE OUT rebuilds the expanded layer layout",
                 f"# from the original checkpoint ({len(self.new_blocks)} new block(s) at "
                 f"{self.positions}, init={self.init})"]
        if self.init == "fresh":
            lines.append("# init=fresh: the new blocks below are zeroed copies, the checkpoint's are fresh draws")
        lines += ["merge_method: passthrough", f"dtype: {dtype}", "slices:"]
        layout = layout_of(self.inserted_before, self.n_original)
        sources = iter(self.new_blocks)
        run: list[int] = []

        def flush():
            if run:
                lines.extend(["  - sources:", f"      - model: {source}",
                              f"        layer_range: [{run[0]}, {run[-1] + 1}]"])
                run.clear()

        for original in layout:
            if original is not None:
                run.append(original)
                continue
            flush()
            copied = next(sources).source
            copied = copied if copied is not None else 0
            lines += ["  - sources:", f"      - model: {source}", f"        layer_range: [{copied}, {copied + 1}]",
                      "        parameters:", "          scale:"]
            lines += [f"            - filter: {f}\n              value: 0.0" for f in filters]
            lines += ["            - value: 1.0"]
        flush()
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict:
        evidence = {}
        if self.decision is not None:
            for name, c in self.decision.candidates.items():
                evidence[name] = {"inserted_before": _original_index(name), **c.to_dict()}
        grouped = isinstance(self.decision, GroupedPlacement)
        method = self.decision.base if grouped else self.decision
        return {
            "format": "satcore-expansion/1",
            "positions": self.positions,
            "inserted_before": self.inserted_before,
            "copied_from": [b.source for b in self.new_blocks],
            "init": self.init,
            "blocks_requested": self.blocks_requested,
            "num_hidden_layers": {"before": self.n_original, "after": self.n_original + len(self.new_blocks)},
            "forced": list(self.forced),
            "max_blocks": self.max_blocks,
            "layout": self.layout,
            "groups": ([[_original_index(n) for n in g] for g in self.decision.groups] if grouped else
                       [list(g) for g in self.budgeted.groups] if hasattr(self.budgeted, "groups") else None),
            "decision": self._decision_record(method),
            "evidence": evidence,
            "cost_block_steps": self.cost_block_steps,
            "decision_cost_fraction": None if self.decision is None and self.budgeted is None
            else self.decision_cost_fraction,
            "frontier": [a.to_dict() for a in self.budgeted.arms] if hasattr(self.budgeted, "arms") else None,
            "chosen_blocks": self.budgeted.choice.chosen_blocks if hasattr(self.budgeted, "arms") else None,
            # forced places (--at): no decision priced a training, so none is recorded as if one had
            "recipe": None if self.decision is None and self.budgeted is None else self.recipe.to_dict(),
            "train": "new_blocks" if self.train_new_only else "all",
            **self.trainer_settings(),
        }


    def _decision_record(self, method) -> dict | None:
        """``expansion.json``'s ``decision``: the method, the choice and, when nothing is inserted, why."""
        if self.budgeted is not None and hasattr(self.budgeted, "arms"):
            return {**self.budgeted.to_dict(), "choice": self.budgeted.choice.chosen_blocks}
        if self.decision is None:
            return None
        record = {"method": ("first-order screen verified by short trials of the recipe (satcore.adapters.torch.decide)"
                             if isinstance(method, TrialRanking) else
                             "first-order screen (native family, predicted held-out change of the recipe's step, "
                             f"{NOT_VERIFIED} by a trial)"),
                  "choice": self.decision.choice, "stop_reason": self.decision.stop_reason,
                  "ranking": self.decision.ranking()}
        if self.decision.stop_reason == "heldout_too_small":  # what would resolve it: the decision's own numbers
            record.update(heldout_samples=self.decision.heldout_samples,
                          heldout_samples_needed=self.decision.heldout_samples_needed)
        if self.budgeted is None and isinstance(method, ScreenDecision):
            # what its plan's time estimate was made from, as the trials' record; under a placement check the plan
            # and its timing are the check's, recorded in placement_check (the screen inside it times nothing)
            record.update(timing_record(method.step_times))
        if self.budgeted is not None:
            record.update(placement_check=self.budgeted.to_dict(),
                          method=self.budgeted.to_dict()["method"] + "; the screen that proposes the moves: "
                          + record["method"])
        return record


def mergekit_model(path: str) -> str:
    """``path`` as the value of a mergekit ``model:`` key: a double-quoted scalar (:func:`satcore.adapter_api.yaml_quoted`),
    or where mergekit would split the string form (a ``+`` names a LoRA, an ``@`` a revision) its mapping form."""
    quoted = yaml_quoted(path)
    return quoted if "+" not in path and "@" not in path else f"{{model: {{path: {quoted}}}}}"


def _original_index(name: str) -> int | str:
    return HEAD if name == HEAD else int(name.rpartition(".")[2])


def _windows_batches(tokens: torch.Tensor, batch_size: int) -> list:
    return [({"input_ids": w}, w) for w in tokens.split(batch_size)]


def _inputs_ids(batch):
    inputs = batch[0] if isinstance(batch, tuple) else batch
    return inputs.get("input_ids") if isinstance(inputs, dict) else inputs


def check_context(model: nn.Module, batches) -> None:
    """Refuse windows longer than the model's context (:func:`~.hf.context_length`): GPT-2 would
    index past its position table, a rotary model would run on positions it never trained on."""
    context = context_length(model.config)
    if context is None:
        return
    key, positions = context
    for batch in batches:
        ids = _inputs_ids(batch)
        if torch.is_tensor(ids) and ids.dim() >= 1 and ids.shape[-1] > positions:
            raise InputError(f"data: windows of {ids.shape[-1]} tokens are longer than the model's context "
                             f"({key} {positions} in its config)")


def split_batches(data, heldout=None) -> tuple[list, list]:
    """``(train, heldout)`` batches: ``data`` as given (a ``(N, T)`` tensor of token ids becomes batches
    of up to 8 windows, at least 32 batches where ``N`` allows: 16 per split, one per fold of the
    held-out tests), the held-out split every other batch when ``heldout`` is ``None``."""
    def batches(value):
        if torch.is_tensor(value):
            if value.dim() != 2 or value.is_floating_point():
                raise InputError(f"token ids must be an integer (windows, tokens) tensor, got "
                                 f"{str(value.dtype).removeprefix('torch.')} {tuple(value.shape)}")
            return _windows_batches(value, max(1, min(8, len(value) // 32)))
        return read_batches(value, "expand: data")

    data = batches(data)
    if heldout is not None:
        return data, batches(heldout)
    if len(data) < 4:
        raise InputError(f"expand needs at least 4 batches of data (2 to train the decision on, 2 held out), "
                         f"got {len(data)}")
    return data[0::2], data[1::2]


def check_trials_batch(train: list, held: list, recipe: Recipe) -> None:
    """Refuse the unbudgeted trial decision (``layout="ranked"``, or a budget of None) on ``train`` and ``held``
    batches (:func:`split_batches`) whose training windows are fewer than ``recipe``'s batch, as the budgeted
    decisions do (:func:`~.expansion_frontier.check_trial_batch`): its trials train that batch for up to the
    recipe's steps, so the windows to give are two batches, half held out.  ``satcore expand`` checks before its
    defaults line, so that the refusal is one line."""
    from .expansion_frontier import check_trial_batch

    check_trial_batch(_windows(train), _windows(held), recipe.batch_size,
                      2 * recipe.batch_size)


def _budgeted(decision: str, layout: str, blocks, budget, loss_fn):
    """The :class:`~.expansion_frontier.DecisionBudget` of a budgeted decision, or None for the others: ``"auto"``
    with trials is the frontier (a default budget when none is given), ``K`` with trials, grouped and a budget the
    placement check; both train on next-token windows (``loss_fn`` None)."""
    if decision != "trial" or (blocks != "auto" and (layout != "grouped" or budget is None)):
        return None
    if loss_fn is not None:
        # blocks='auto' has no unbudgeted form: the screen cannot count blocks (expand refuses it)
        raise InputError("the budgeted decisions train next-token windows with the model's loss; loss_fn must be "
                         "None" + ("" if blocks == "auto" else " (or give decision='screen', or budget=None)"))
    if budget is None:
        budget = DecisionBudget()
    return budget


@dataclass(frozen=True)
class ExpansionOptions:
    """How :func:`expand` grows the model, besides the decision's own options (its :class:`satcore.DecisionPolicy`).

    Attributes
    ----------
    at : original block indices (or ``"head"``) to insert before, instead of the decision (then
        ``blocks`` and ``max_blocks`` must be None, ``data`` is not read, and the layout is
        recorded as ``"forced"``).
    init : ``"copy"`` (LLaMA-Pro) or ``"fresh"`` (module docstring).
    train_new_only : leave only the new blocks' parameters trainable.
    max_blocks : the most blocks ``blocks="auto"`` inserts (default a quarter of the layers, LLaMA-Pro's ratio).
    decision : ``"trial"`` (default): :func:`~.decide.decide`, the first-order screen verified by
        short trials of the recipe (at most one block's training in all); ``"screen"``: the
        first-order screen alone (:func:`first_order_decision`, cheaper; experimental: first-order values
        do not price a trained block's held-out gain, studies/decision-validity.md; its rows are not verified,
        with no interval or ``P(decrease)``, and with no trial it cannot price ``K = 0`` against ``K > 0``, so
        ``blocks="auto"`` with it is refused).  Both placements were
        measured to lose to LLaMA-Pro's uniform interleave (studies/expansion-head-to-head-notes.md);
        ``layout="grouped"`` tied it there with the decision's cost not charged and lost with it.
    layout : ``"grouped"`` (default): the ``L + 1`` places split into ``K`` contiguous groups
        (LLaMA-Pro's groups, :func:`place_groups`), one block per group at the place the decision
        ranks first within it, the trials spread over the groups (:func:`placement_decision`);
        ``"ranked"`` (experimental): the decision's top ``K`` places anywhere in the stack.  Grouped is the
        default because ranked put every block at the bottom of the stack and lost to uniform
        interleave even with its cost not charged, where grouped tied it (studies/expansion-head-to-head-notes.md; a
        choice made on that one bench, so not independent evidence).  ``blocks="auto"`` is the frontier's count at
        uniform places (``budget`` below); with it or ``at`` a layout other than the default is refused (it would
        go unused).
    budget : :class:`~.expansion_frontier.DecisionBudget`, optional
        The share of the planned training (the recipe) the decision may spend, and the general data
        and forgetting limit it weighs.  With ``decision="trial"``, ``blocks="auto"`` is the frontier
        (:func:`~.expansion_frontier.frontier_decision`: ``K = 0`` and ``K = 1, 2, 4, ...`` at uniform
        places, blocks only where they beat ``K = 0`` credibly, none when expanding does not pay;
        ``budget`` None: ``DecisionBudget()``); with ``layout="grouped"`` a budget makes ``blocks=K``
        the placement check (:func:`~.expansion_frontier.placement_check`: uniform places unless a
        trial credibly favours a move).  Without a budget ``blocks=K`` is the trial decision above,
        which costs up to one block trained with the whole recipe.
    progress : a tqdm bar (stderr) of the windows the first-order screen probes with ``decision="screen"`` (the
        budgeted decisions show theirs with ``budget.progress``; the unbudgeted trial decision, ``layout="ranked"``,
        shows none: docs/expansion-decision.md says why).
    announce : called with the first-order screen's plan (what it reads, its cost, its time here) before it starts,
        with ``decision="screen"`` (``None``: silent; the budgeted decisions announce theirs with
        ``budget.announce``).
    """

    at: object = None
    init: str = "copy"
    train_new_only: bool = False
    max_blocks: int | None = None
    decision: str = "trial"
    layout: str = "grouped"
    budget: object = None
    progress: bool = False
    announce: Callable[[str], None] | None = field(default=None, compare=False)

    def __post_init__(self):
        for name, choices in (("init", INITS), ("decision", DECISIONS), ("layout", LAYOUTS)):
            if getattr(self, name) not in choices:
                raise InputError(f"expansion options: {name} must be one of {', '.join(choices)}, got "
                                 f"{getattr(self, name)!r}")
        if not isinstance(self.train_new_only, bool):
            raise InputError(f"expansion options: train_new_only must be True or False, got {self.train_new_only!r}")
        if self.max_blocks is not None:
            object.__setattr__(self, "max_blocks", whole_number(self.max_blocks, "expansion options: max_blocks"))


@moved_keywords("expand")
@forked_rng()  # the caller's next random draws are those it would have made without the call
def expand(model: nn.Module, data, *, blocks: int | str, heldout=None, loss_fn=None, recipe: Recipe | None = None,
           policy: DecisionPolicy | None = None, options: ExpansionOptions | None = None) -> Expansion:
    """Grow the Hugging Face decoder ``model`` by identity blocks placed by one decision on ``data``.

    Parameters
    ----------
    model : a ``...ForCausalLM`` (Llama, Mistral, Qwen2/3, Gemma, GPT-2, GPT-NeoX, ...); not modified.
    data : batches ``({"input_ids": ...}, labels)`` (or a ``(N, T)`` tensor of token ids), split
        into a training half (even batches) and a held-out half (odd) unless ``heldout`` is given;
        the frontier (``blocks="auto"`` with trials) holds out of token ids the windows its budget
        affords (at least 8, at most half) and trains its trials on every other window.  It takes the
        windows it is given: for each trial to pass over its training windows at most twice, give at least
        :func:`~.expansion_frontier.frontier_windows` of them (what ``satcore expand`` reads without
        ``--max-windows``); fewer are used as given, and the plan warns.
    blocks : int, ``"auto"`` or None
        ``K``: the ``K`` candidates the decision ranks first (``layout="grouped"``: one per
        group); ``"auto"``: the frontier's count (``options.budget``; trials only, at most
        ``options.max_blocks``); None with ``options.at``.  Windows longer than the model's context
        (``max_position_embeddings``, GPT-2's ``n_positions``) are refused.
    heldout : batches (or a ``(N, T)`` tensor of token ids), optional
        The held-out split, read as ``data`` is; then all of ``data`` trains the decision.
    loss_fn : ``loss_fn(outputs, targets) -> (B,)`` per-sample losses, optional
        ``None``: next-token cross-entropy (:func:`~.hf.sequence_loss`); the budgeted decisions (the frontier,
        the placement check) train on next-token windows and refuse another.
    recipe : :class:`satcore.Recipe`, default LLaMA-Pro's (AdamW, lr 2e-4): the step the decision prices; the
        shorthand of ``policy=DecisionPolicy(recipe)``.
    policy : :class:`satcore.DecisionPolicy`, optional
        The decision's options (give it or ``recipe``): its ``recipe``; its ``seed``, which also seeds the new
        blocks' draws (``init="fresh"``); ``trials.max_trials`` (the even plan; the grouped layout spreads the
        trials over its groups); ``max_statistics_bytes``, the decision's probe in groups of places whose
        statistics fit (:func:`~.decide.decide`; the same decision, one pass over ``data`` per group); and
        ``probe`` (``position_subsample``, ``batch_dtype``, ...; the family is ``"native"``).
    options : :class:`ExpansionOptions`, optional
        The forced places, the new blocks' init, what trains, the cap, the decision, the layout and the
        decision budget.

    Returns
    -------
    Expansion
    """
    if recipe is None and policy is None:
        recipe = DEFAULT_RECIPE
    policy = DecisionPolicy.of(recipe, policy, by="expand")
    recipe, seed = policy.recipe, policy.seed
    options = ExpansionOptions() if options is None else options
    if not isinstance(options, ExpansionOptions):
        raise InputError(f"expand: options must be an ExpansionOptions, got {type(options).__name__}")
    at, init, max_blocks, layout = options.at, options.init, options.max_blocks, options.layout
    names, terminals = decoder_stack(model)
    n = len(names)
    if (blocks is None) == (at is None):
        raise InputError("give blocks (an integer or 'auto') or at (the places to force), not both"
                         if at is not None else "give blocks (an integer or 'auto'), or at to force the places")
    if max_blocks is not None and blocks != "auto":
        given = "at" if at is not None else f"blocks={blocks!r}"
        raise InputError(f"max_blocks caps blocks='auto' only; with {given} it would be ignored")
    cap = max_blocks_cap(n, max_blocks) if blocks == "auto" else None  # refused here, before any work
    if blocks == "auto" and options.decision == "screen":
        raise InputError("blocks='auto' with decision='screen': the first-order screen runs no trial, so it cannot "
                         "price K = 0 against K > 0; give blocks=K with decision='screen', or decision='trial' for "
                         "the frontier")
    if layout != "grouped" and (blocks == "auto" or at is not None):  # as the command's --layout: it would go unused
        given, places = ("at", "places as given") if at is not None else ("blocks='auto'", "arms at uniform places")
        raise InputError(f"layout={layout!r} places blocks=K's blocks; with {given} (its {places}) it would be ignored")
    if at is not None and policy.max_statistics_bytes is not None:
        raise InputError("max_statistics_bytes caps the decision's probe; with at no decision is made, so it "
                         "would be ignored")
    train_new_only = options.train_new_only
    method, decision, forced, limit = options.decision, None, (), None
    if at is not None:
        chosen = read_batches(at, "expand: at")
        if not chosen:
            raise InputError("at: give at least one block index or 'head'")
        check_new_block_count(len(chosen), n, "expand: at")
        forced = tuple(str(a) for a in chosen)
        layout = "forced"
    else:
        if blocks != "auto" and not (isinstance(blocks, int) and not isinstance(blocks, bool) and blocks >= 1):
            raise InputError(f"blocks must be an integer >= 1 or 'auto', got {blocks!r}")
        if blocks != "auto" and blocks > n + 1:
            raise InputError(f"blocks={blocks}: the model has {n + 1} places for a block ({n} blocks and the head)")
        train, held = split_batches(data, heldout)
        check_context(model, train + held)
        for i, batch in enumerate(train + held):
            ids = _inputs_ids(batch)
            if torch.is_tensor(ids):
                check_token_ids(ids, model.config.vocab_size, f"expand: data: batch {i}")
        budgeted = _budgeted(method, layout, blocks, options.budget, loss_fn)
        if budgeted is not None:
            from . import expansion_frontier

            settings = {"blocks": blocks, "max_blocks": cap,
                        "init": init, "seed": seed, "train_new_only": train_new_only, "policy": policy}
            run = expansion_frontier.frontier_decision if blocks == "auto" else expansion_frontier.placement_check
            if blocks == "auto" and heldout is None and torch.is_tensor(data):
                train, held = data, None  # the frontier holds out what its budget affords, trains on the rest
            budgeted = run(model, train, held, recipe=recipe, budget=budgeted, options=settings)
            if blocks == "auto":
                chosen, limit = list(budgeted.chosen_places), settings["max_blocks"]
            else:
                chosen, decision = budgeted.places, budgeted.screen
            grown, new = insert_blocks(model, chosen, init=init, seed=seed)
            if train_new_only:
                freeze_old(grown, new)
            return Expansion(grown, new, n, init, blocks, decision, forced, recipe, train_new_only, terminals,
                             names[0].rpartition(".")[0], "uniform" if blocks == "auto" else layout, limit,
                             budgeted)
        if method == "trial":
            check_trials_batch(train, held, recipe)
        decision = placement_decision(model, train, held, loss_fn, policy=policy, options=options, blocks=blocks)
        # blocks is K here: "auto" is the frontier (trials) or refused above (the screen)
        chosen = [_original_index(c) for c in decision.ranking()[:blocks]]
    grown, new = insert_blocks(model, chosen, init=init, seed=seed)
    if train_new_only:
        freeze_old(grown, new)
    prefix = names[0].rpartition(".")[0]
    return Expansion(grown, new, n, init, blocks if at is None else len(chosen), decision, forced, recipe,
                     train_new_only, terminals, prefix, layout, limit)

