"""Expansion decided within a share of the training it informs: the frontier over K, and the placement check.

The user states the training they plan for the expanded model (a :class:`satcore.Recipe`:
steps, batch, lr); :class:`DecisionBudget` says what share of it the decision may spend
(default 10%).  Two decisions run on that budget, both from short trials of *arms*: a copy
of the model with identity blocks at given places, trained with the recipe in eval mode (no
dropout), its held-out losses read at a quarter, half and all of the trial, from several
seeds; the arithmetic (what the budget buys in FLOPs, the held-out windows it affords, the
extrapolation to the full training, the choice) is :mod:`satcore._decisions.frontier`'s.

* :func:`frontier_decision` (``expand(..., blocks="auto")``): how many blocks, if any.  The
  arms are ``K = 0`` (no expansion: the model as it is, every parameter trained with the
  recipe) and ``K = 1, 2, 4, ...`` up to ``max_blocks`` blocks at LLaMA-Pro's uniform places
  (Wu et al., "LLaMA Pro: Progressive LLaMA with Block Expansion"), trained as the user
  will (only the new blocks with ``train_new_only``, else every parameter).  With general
  (old-domain) data each arm's change of the general held-out loss is measured beside the
  target's.  The arms train side by side, checkpoint by checkpoint, and stop once no ``K > 0``
  can still beat ``K = 0`` credibly (``DecisionBudget.race``; the race in
  :mod:`satcore._decisions.frontier`'s docstring): the plan's cost is the ceiling, what the
  trials spent is counted.
* :func:`placement_check` (``expand(..., blocks=K)``): where ``K`` blocks go.  Uniform places
  are the prior; the first-order screen (:func:`~.expansion.first_order_decision`) proposes,
  in each uniform place's group of places, the place it ranks first; a trial of the uniform
  placement with that one block moved, paired with a trial of the uniform placement, moves
  the block only where the moved arm's predicted held-out change after the full training is
  credibly lower (its 95% interval below zero, its point below minus the tolerance).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from satcore import DecisionPolicy, InputError, ModelOnDataError, Recipe
from satcore.adapter_api import (CARRY_PER_DOUBLING, MIN_HELDOUT, RACE_MARGIN, FrontierChoice, Prediction, TrialPlan,
                                 affordable_heldout, block_counts, carry_error, choose_blocks, finite_real,
                                 new_positions, plan_trials, positive_count, predict_change, racing, read_batches,
                                 split_words, step_flops, uniform_groups, uniform_places, with_carry)

from .decide import per_sample_eval, recipe_minibatches, recipe_optimizer
from .input_bounds import check_trial_work
from .hf import sequence_loss
from .locate import HEAD
from .probe import call_model, to_device

# the frontier's own tolerance: a predicted decrease below 0.3% of the held-out loss is not worth a block (the trial
# decision's stop tolerance before it became a share of the generalization gap)
RELATIVE_TOLERANCE = 0.003


@dataclass(frozen=True)
class DecisionBudget:
    """What the budgeted decisions may spend and what they weigh.

    fraction : the most of the planned training's FLOPs (``recipe.steps`` planned steps) the decision spends.
    replicates : seeds per arm, each its own minibatch order; 1 (the default: the budget buys trials twice
        as long): the interval is the held-out windows' alone, 2 or more add the seeds' noise.
    general : token ids ``(N, T)`` (or batches) of the model's old domain, all held out; ``None``: the
        general loss is not measured.
    max_forgetting : arms whose predicted general loss change exceeds it (nats) are not chosen.
    tolerance : nats; ``None``: 0.3% of the model's held-out loss.
    progress : show a progress bar (tqdm, on stderr) while the trials run.
    race : the frontier's trials stop once no ``K > 0`` can still beat ``K = 0`` credibly
        (:func:`satcore.adapter_api.racing`), the budget not spent left to the training; off with ``max_forgetting``
        (an arm over it can leave ``K = 0`` out, and then there is nothing to beat).  The arms then train side by
        side, every arm's copy (and optimizer state) held at once; off, one arm after another.
    announce : called with the plan's lines before anything is trained (``None``: silent).
    carry_per_doubling : the frontier's carry error, nats of standard deviation per doubling from the trial's last
        checkpoint to ``recipe.steps``, added to each ``K > 0``'s paired difference from ``K = 0``
        (:func:`satcore.adapter_api.carry_error`); the default is fitted on the bench (0: the trials' noise alone).
    """

    fraction: float = 0.10
    replicates: int = 1
    general: object = None
    max_forgetting: float | None = None
    tolerance: float | None = None
    progress: bool = False
    race: bool = True
    announce: Callable[[str], None] | None = field(default=None, compare=False)
    carry_per_doubling: float = CARRY_PER_DOUBLING

    def __post_init__(self):
        # every number checked here, before any work: a NaN or inf tolerance or max_forgetting compared false and chose
        # silently, a text one failed as a TypeError after the trials; NumPy scalars are the numbers they are (Recipe's)
        fraction = finite_real(self.fraction, "decision budget: fraction", low=0.0, low_open=True)
        if fraction > 1:
            raise InputError(f"decision budget: fraction must be <= 1 (of the planned training), got {fraction:g}")
        object.__setattr__(self, "fraction", fraction)
        object.__setattr__(self, "replicates", positive_count(self.replicates, "decision budget: replicates"))
        object.__setattr__(self, "carry_per_doubling",
                           finite_real(self.carry_per_doubling, "decision budget: carry_per_doubling (nats)", low=0.0))
        for name in ("max_forgetting", "tolerance"):  # None: not set
            if getattr(self, name) is not None:
                object.__setattr__(self, name, finite_real(getattr(self, name), f"decision budget: {name} (nats)",
                                                           low=0.0))
        if self.max_forgetting is not None and self.general is None:
            raise InputError("max_forgetting needs general data (--general-data): the general loss is measured on it")

    @property
    def races(self) -> bool:
        """Whether the frontier's trials race: ``race``, and no ``max_forgetting`` (which can leave ``K = 0`` out)."""
        return self.race and self.max_forgetting is None


@dataclass(frozen=True)
class ArmTrials:
    """One arm: its new blocks' places and its trials' per-window changes, ``{split: (replicates, checkpoints,
    windows)}`` (loss after minus loss before)."""

    places: tuple
    changes: dict

    def curve(self, split: str = "heldout") -> list[list[float]]:
        """The mean change at each checkpoint, one list per replicate."""
        return self.changes[split].mean(2).tolist()

    @property
    def readings(self) -> int:
        """The checkpoints its trials read: every one of the plan's, unless the race stopped them."""
        return self.changes["heldout"].shape[1]


class _Costs:
    """Each pass of the decision in planned steps' FLOPs (:mod:`satcore._decisions.frontier`'s docstring): the
    unit is a step of ``K = planned`` blocks at uniform places, trained as the user will."""

    def __init__(self, model, seq_len: int, batch_size: int, planned: int, train_new_only: bool):
        from .expansion import decoder_stack

        self.n, self.batch_size, self.train_new_only = len(decoder_stack(model)[0]), batch_size, train_new_only
        self.block, self.head = _flops_per_token(model, seq_len)
        self.unit = self._flops(uniform_places(self.n, planned) if planned else [])

    def _flops(self, places) -> float:
        grown = self.n + len(places)
        if not places or not self.train_new_only:  # K = 0, or every parameter trains: backward through all
            return step_flops(grown, range(grown), True, self.block, self.head)
        return step_flops(grown, new_positions(places, self.n), False, self.block, self.head)

    def step(self, places) -> float:
        """One trial step of the arm with blocks before ``places``."""
        return self._flops(places) / self.unit

    def full(self) -> float:
        """A forward and backward pass of the model as it is with every parameter (``K = 0``'s step; the probe's per
        window)."""
        return step_flops(self.n, range(self.n), True, self.block, self.head) / self.unit

    def read(self, places, windows: int) -> float:
        """A forward pass over ``windows`` of the arm with blocks before ``places``."""
        forward = (self.n + len(places)) * self.block + self.head
        return windows / self.batch_size * forward / self.unit

    def probe(self, windows: int) -> float:
        """The first-order screen's probe of ``windows``: each a forward and backward pass of the model as it is
        (counted as every parameter's, an upper bound); its time is :func:`probe_time` of this."""
        return windows / self.batch_size * self.full()


# seconds of the first-order screen's probe per window over those of a forward and backward pass of the model (the
# timed step's): the native probe also runs the fresh block at every place and sums each window's feature Gram and
# cross products in float64.  Measured side by side (studies/expansion-budget-notes.md, "The screen's probe in the
# plan's time estimate"): SmolLM2-135M 2.8x per window, about 3.0x over the 64 windows a CPU reads by default; a
# 256-wide 8-block Llama 7.7x (the per-place work a larger share of a narrow model: the estimate runs short there)
PROBE_TIME_RATIO = 3.0


def probe_time(steps: float, passes: int = 1) -> float:
    """The time of ``passes`` probe passes that cost ``steps`` planned steps' FLOPs together (:meth:`_Costs.probe`),
    in planned steps' time: ``steps + (PROBE_TIME_RATIO - 1) steps / passes``, :data:`PROBE_TIME_RATIO` times
    ``steps`` in one pass.  Each pass runs the model's forward and backward (its FLOPs) and the work of its group of
    places only, which all passes together do once (on SmolLM2-135M in 16 passes, ``--max-statistics-gib 1``, the
    ratio on every pass priced the probe at 14.1 min where it took 4.2).  The plan's estimate and the bar price the
    probe so; what the decision spends and records (``cost_steps``) stays its FLOPs."""
    return steps + (PROBE_TIME_RATIO - 1) * steps / passes


def _flops_per_token(model, seq_len: int) -> tuple[float, float]:
    """Forward FLOPs per token of one decoder block (``2 x`` its weight matrices, plus ``4 T`` times the
    attention width for the scores and the weighted values over ``T`` positions) and of the output head."""
    from .expansion import decoder_stack

    config = model.config
    block = model.get_submodule(decoder_stack(model)[0][0])
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    width = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    weights = sum(p.numel() for p in block.parameters() if p.dim() >= 2)
    return 2.0 * weights + 4.0 * seq_len * width, 2.0 * model.get_output_embeddings().weight.numel()


class _Meter:
    """The decision's passes in planned steps' FLOPs, counted as they run (``done``), with an optional tqdm bar of
    their time in planned steps' time (``timed``: each pass at its FLOPs, the screen's probe at
    :func:`probe_time` of them), so that the bar's rate, and the time left it shows, hold through the probe and the
    trials alike.

    A long pass (the first-order screen's probe) moves the bar batch by batch (:meth:`probed`) and is counted whole
    when it ends (:meth:`add`), so ``done`` is the sum of the passes' costs whatever the bar showed.

    The time estimate comes from the decision's own first trial steps (:meth:`stepped`): the first warms up and is
    left out, the next :data:`TIMED_STEPS` (of whichever arms train them) give ``times``
    (:class:`StepTimes`, seconds per planned step's FLOPs), announced with ``total`` priced at them
    (``announce``; the bar shows the estimate beside its own time left)."""

    def __init__(self, total: float, show: bool, costs: _Costs, announce: Callable[[str], None] | None = None):
        self.done, self.timed, self.running, self.costs, self.total = 0.0, 0.0, 0.0, costs, total
        self.steps, self.times, self.announce = [], None, announce
        self.bar = None
        if show:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="step", desc="deciding", leave=False,
                            bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} planned steps' time [{elapsed}<{remaining}]")

    def forward(self, places, windows: int) -> None:
        self.add(self.costs.read(places, windows))

    @property
    def timing(self) -> bool:
        """Whether the trial steps are still being timed (no estimate yet)."""
        return self.times is None

    def stepped(self, places, seconds: float) -> None:
        """A trial step of the arm with blocks before ``places`` done in ``seconds`` (timed while :attr:`timing`)."""
        steps = self.costs.step(places)
        self.add(steps)
        if self.timing:
            self.steps.append((seconds, steps))
            if len(self.steps) > TIMED_STEPS:
                self.estimate()

    def estimate(self) -> None:
        """Make the time estimate from the steps timed so far (the warm-up left out where another step was timed):
        after :data:`TIMED_STEPS`, or when the trials end before (nothing where no trial step ran)."""
        if not self.timing or not self.steps:
            return
        timed = self.steps[1:] or self.steps
        self.times = StepTimes(tuple(s for s, _ in timed), tuple(w for _, w in timed), torch.get_num_threads(),
                               priced=self.total)
        if self.bar is not None:
            self.bar.set_postfix_str(f"estimate {_duration(self.total * self.times.mean)}")
        if self.announce is not None:
            lines = [f"  time: {self.times.words(self.total)} for the whole decision", *self.times.warning()]
            if self.bar is None:
                self.announce("\n".join(lines))
            else:
                with self.bar.external_write_mode():
                    self.announce("\n".join(lines))

    def add(self, steps: float, timed: float | None = None) -> None:
        """``steps`` planned steps' FLOPs done, taking ``timed`` planned steps' time (``None``: ``steps``)."""
        self.done += steps
        self.timed += steps if timed is None else timed
        self.running = 0.0
        self._show(self.timed)

    def probed(self, windows: int, passes: int) -> None:
        """``windows`` more of the screen's probe in ``passes`` passes done (:meth:`_Costs.probe`, at
        :func:`probe_time`): on the bar only, until the probe's cost is added."""
        self._ahead(probe_time(self.costs.probe(windows), passes))

    def reading(self, places) -> Callable[[int], None]:
        """The bar's count of a reading of the arm with blocks before ``places``, window by window (on the bar
        only, until :meth:`forward` adds the reading's cost)."""
        return lambda windows: self._ahead(self.costs.read(places, windows))

    def _ahead(self, steps: float) -> None:
        self.running += steps
        self._show(self.timed + self.running)

    def replan(self, total: float) -> None:
        """The bar's total once the decision knows its passes (the placement check's, once its screen has proposed
        the moves to try: fewer trials than the plan's most)."""
        self.total = total
        if self.bar is not None:  # never below what it shows: the float sums can land a rounding error under it
            self.bar.total = max(total, self.bar.n)
            self.bar.refresh()

    def _show(self, position: float) -> None:
        if self.bar is not None:  # the float sums may pass the total by a rounding error; the bar never goes back
            self.bar.update(max(0.0, min(position, self.bar.total) - self.bar.n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Arms:
    """Trains arms of one model on one recipe and reads their changes (module docstring)."""

    def __init__(self, model, recipe: Recipe, train: list, evaluate: dict, options: dict):
        from .expansion import insert_blocks

        self.insert, self.model, self.recipe, self.train, self.evaluate = insert_blocks, model, recipe, train, evaluate
        self.init, self.seed, self.replicates = options["init"], options["seed"], options["replicates"]
        self.train_new_only = options["train_new_only"]
        self.before = {}
        self.meter = None

    def read_model(self, meter: _Meter) -> dict:
        """The model's own per-window losses on every evaluated split (every arm starts from them: its blocks
        are identities)."""
        self.meter = meter
        for split in self.evaluate:
            self.before[split] = self.losses(self.model, split, [])
            if not np.isfinite(self.before[split]).all():  # before any step: no lr is to blame, as a trial's would be
                raise ModelOnDataError(f"the model's own {split_words(split)} loss, before any training, is "
                                       f"NaN or infinite on {int((~np.isfinite(self.before[split])).sum())} window(s) "
                                       "(its config or weights)", split=split)
            meter.forward([], self.before[split].size)
        return {split: float(losses.mean()) for split, losses in self.before.items()}

    def losses(self, model, split: str, places) -> np.ndarray:
        """``model``'s (the arm with blocks before ``places``) per-window losses on the evaluated ``split``; a batch it
        cannot take is refused naming the split (``"general"``: the user's other file, not the target data's)."""
        try:
            return per_sample_eval(model, self.evaluate[split], sequence_loss, progress=self.meter.reading(places))
        except ModelOnDataError as exc:
            raise ModelOnDataError(str(exc), split=split) from exc

    def run(self, places, checkpoints) -> ArmTrials:
        """Every replicate of the arm with blocks before ``places``: ``checkpoints[-1]`` steps each, replicate ``r``
        drawing its minibatches in the order of seed ``seed + r``; one replicate at a time (one copy held)."""
        rows = []
        for replicate in range(self.replicates):
            trial = _Trial(self, places, self.seed + replicate)
            for target in checkpoints:
                trial.advance(target)
            rows.append(trial.rows)
        return ArmTrials(tuple(places), _stacked(rows))

    def race(self, places: dict, checkpoints, going: Callable | None) -> dict:
        """``{K: ArmTrials}`` of the arms ``{K: places}`` trained side by side, checkpoint by checkpoint (as
        :meth:`run` each); after each checkpoint but the last, ``going({K: changes so far}, checkpoints so far)``
        names the arms that go on.  A stopped arm's trials hold the checkpoints it read.  Every arm's copies are
        held at once; ``going`` None (nothing stops early): :meth:`run`, one arm after another."""
        if going is None:
            return {k: self.run(p, checkpoints) for k, p in places.items()}
        trials = {k: [_Trial(self, p, self.seed + r) for r in range(self.replicates)] for k, p in places.items()}
        running = set(trials)
        for n, target in enumerate(checkpoints, 1):
            for k in sorted(running):
                for trial in trials[k]:
                    trial.advance(target)
            if 2 <= n < len(checkpoints):
                running &= set(going({k: _stacked([t.rows for t in trials[k]]) for k in running}, checkpoints[:n]))
            if not running:
                break
        return {k: ArmTrials(tuple(places[k]), _stacked([t.rows for t in ts])) for k, ts in trials.items()}


def _stacked(rows: list) -> dict:
    """``{split: (replicates, checkpoints read, windows)}`` of one arm's replicates' rows (:attr:`_Trial.rows`)."""
    return {split: np.stack([np.stack(r[split]) for r in rows]) for split in rows[0]}


class _Trial:
    """One replicate of one arm: the grown model, its optimizer and minibatch stream, and its per-window changes at
    each checkpoint read (``rows``)."""

    def __init__(self, arms: _Arms, places, seed: int):
        self.arms, self.places = arms, list(places)
        grown, new = arms.insert(arms.model, self.places, init=arms.init, seed=arms.seed)
        grown.eval()
        if arms.train_new_only and new:
            from .expansion import freeze_old

            freeze_old(grown, new)
        else:
            for p in grown.parameters():
                p.requires_grad_(True)
        params = [p for p in grown.parameters() if p.requires_grad]
        self.grown, self.optimizer = grown, recipe_optimizer(arms.recipe, params)
        self.stream = recipe_minibatches(arms.train, arms.recipe.batch_size, seed)
        self.device = params[0].device
        self.rows, self.done = {split: [] for split in arms.evaluate}, 0

    def advance(self, target: int) -> None:
        """Train to step ``target``, then read every evaluated split."""
        arms, meter = self.arms, self.arms.meter
        with torch.inference_mode(False), torch.enable_grad():
            while self.done < target:
                start = time.perf_counter()
                inputs, labels = next(self.stream)
                inputs, labels = to_device(inputs, self.device), to_device(labels, self.device)
                loss = sequence_loss(call_model(self.grown, inputs), labels).mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                if meter.timing and self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self.done += 1
                meter.stepped(self.places, time.perf_counter() - start)
            for split in arms.evaluate:
                after = arms.losses(self.grown, split, self.places)
                if not np.isfinite(after).all():
                    raise InputError(f"the trial of blocks before {self.places} diverged at step {self.done} (lr "
                                     f"{arms.recipe.lr:g}): its {split_words(split)} loss is not finite; lower --lr")
                self.rows[split].append(after - arms.before[split])
                meter.forward(self.places, after.size)


# the budgeted decisions' trial steps timed after the first (which warms up and is left out): their mean gives the
# estimate, their fastest and slowest its range.  One step, or the faster of two, read ~10x short with 2 threads on 2
# busy cores: each parallel op there waits for a thread the OS has put off, so a pass takes 0.05 to 0.23 s where one in
# an idle moment takes 0.006 s (studies/expansion-budget-notes.md, "The plan's time estimate on a busy CPU").  Timing
# the trials' own steps costs nothing (the five passes the decision once ran first cost 6.7 of 400 planned steps)
TIMED_STEPS = 4
# passes of the model :func:`timed_step` runs for the first-order screen's plan (``--decision screen``, no trial to
# time): the first warms up, the other TIMED_STEPS are timed
TIMING_PASSES = 1 + TIMED_STEPS
# trials that pass over their training windows more often than this are announced as such: at 2000 planned steps on
# the command's 64 CPU windows (32 training the trials, 13 passes) the K = 0 trial over-fitted them (+0.64 nats at its
# last reading) where 512 windows gave a falling curve (studies/expansion-budget-notes.md); 1.3 passes (400 steps) did not
MAX_TRIAL_PASSES = 2.0
# what a decision records of its plan's time estimate (:meth:`StepTimes.to_dict`; each None where none was made)
TIMING_KEYS = ("seconds_per_step", "timed_step_seconds", "threads")


@dataclass(frozen=True)
class StepTimes:
    """Wall seconds of the timed steps (the warm-up left out), each one's work in the estimate's unit (``work``: a
    budgeted decision's trial steps in planned steps' FLOPs, :meth:`_Meter.stepped`; the screen's passes of the model,
    each its windows over the recipe's batch, :func:`timed_step`), the threads torch ran them on and what each timed
    step was, in words (the screen's are passes of the model over fewer windows than a batch where its training
    windows hold fewer: called steps, their seconds read as a batch's).  ``priced``: the work of the whole decision
    its announced time estimate priced (None where none was announced), held against the time it took
    (:func:`decision_time_line`)."""

    seconds: tuple
    work: tuple
    threads: int
    timed: str = "steps"
    priced: float | None = None

    @property
    def mean(self) -> float:
        """The estimate's seconds per unit of work: the timed steps' seconds over their work, as the decision's time
        is the sum of its passes' (on a busy CPU their times are heavy-tailed: with 2 threads on 2 busy cores the
        median pass took 0.17 s, the mean 0.46 s, studies/expansion-budget-notes.md)."""
        return sum(self.seconds) / sum(self.work)

    @property
    def rates(self) -> list[float]:
        """Each timed step's seconds per unit of work."""
        return [s / w for s, w in zip(self.seconds, self.work)]

    @property
    def spread(self) -> float:
        """The slowest timed step over the fastest, per unit of work."""
        return max(self.rates) / min(self.rates)

    def words(self, work: float) -> str:
        """The time here of ``work`` units: at the mean, and the range at the fastest and slowest step."""
        fastest, slowest = min(self.rates), max(self.rates)
        return (f"about {_duration(work * self.mean)} here ({_duration(work * fastest)} to "
                f"{_duration(work * slowest)} at the fastest and slowest of {len(self.seconds)} {self.timed} timed after a "
                f"warm-up, {min(self.seconds):.3g} to {max(self.seconds):.3g} s each)")

    def warning(self) -> list[str]:
        """A line where the timed passes varied over 2x on several threads (else none): the cores look shared."""
        if self.threads == 1 or len(self.seconds) < 2 or self.spread <= 2:
            return []
        return [f"  note: the timed steps varied {self.spread:.1f}x on {self.threads} threads: the cores look shared, "
                "so the time may run far outside the range; OMP_NUM_THREADS=1 may run faster and steadier"]

    def to_dict(self) -> dict:
        return dict(zip(TIMING_KEYS, (self.mean, list(self.seconds), self.threads)))


def timing_record(times: StepTimes | None) -> dict:
    """What a decision records of its time estimate: ``times``' :meth:`StepTimes.to_dict`, or each of
    :data:`TIMING_KEYS` None where no estimate was made (the screen announcing no plan, so timing nothing; a
    placement check that ran no trial)."""
    return dict.fromkeys(TIMING_KEYS) if times is None else times.to_dict()


def timed_step(model, train: list, recipe: Recipe) -> StepTimes:
    """Wall seconds of a forward and backward pass of ``model`` over a minibatch of the recipe, for the first-order
    screen's plan (``--decision screen`` trains nothing to time): :data:`TIMING_PASSES` passes, the first (warming up)
    left out, each the work of its windows over the recipe's batch, 1 for a full batch (gradients taken with
    ``torch.autograd.grad``, so nothing of ``model`` changes, not even ``.grad``).  Where ``train`` holds fewer
    windows than a batch the minibatch is all of them (:func:`~.decide.recipe_minibatches`), and its time is carried
    to the batch linearly: the screen trains nothing, so a batch above its windows is the planned training's, not
    refused."""
    inputs, labels = next(recipe_minibatches(train, recipe.batch_size, 0))
    from .expansion import _inputs_ids

    work = len(_inputs_ids(inputs)) / recipe.batch_size
    params = [p for p in model.parameters() if p.is_floating_point()]
    device = params[0].device
    inputs, labels = to_device(inputs, device), to_device(labels, device)
    flags = [p.requires_grad for p in params]
    times = []
    try:
        with torch.inference_mode(False), torch.enable_grad():
            for p in params:
                p.requires_grad_(True)
            for _ in range(TIMING_PASSES):
                start = time.perf_counter()
                loss = sequence_loss(call_model(model, inputs), labels).mean()
                torch.autograd.grad(loss, params)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - start)
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
    return StepTimes(tuple(times[1:]), (work,) * (len(times) - 1), torch.get_num_threads(),
                     f"passes of {len(_inputs_ids(inputs))} windows")


def _windows(batches) -> int:
    from .expansion import _inputs_ids

    return sum(len(_inputs_ids(b)) for b in batches)


def _general_batches(general, count: int | None = None) -> list:
    """The general data's batches, all held out (nothing trains on them); ``count``: token ids keep that many
    windows, evenly spaced, so reading them costs what the target's held-out set does."""
    from .expansion import _windows_batches, split_batches

    if general is None:
        return []
    if torch.is_tensor(general):
        # named as the general data here: a float tensor was otherwise the model's failure on "batch 0", and fewer
        # than 4 windows "expand needs at least 4 batches of data", both read as the target data's
        if general.dim() != 2 or general.is_floating_point() or general.is_complex() or len(general) < 4:
            raise InputError(f"decision budget: general: token ids must be an integer (windows, tokens) tensor of at "
                             f"least 4 windows, got {str(general.dtype).removeprefix('torch.')} "
                             f"{tuple(general.shape)}")
        if count is not None and count < len(general):
            return _windows_batches(general[_spaced(len(general), count)], 8)
        train, held = split_batches(general)
        return train + held
    return read_batches(general, "decision budget: general")


def _spaced(n: int, count: int) -> torch.Tensor:
    """``count`` indices evenly spaced over ``n`` (the held-out windows span the whole file, as the training ones)."""
    return torch.arange(count) * n // count


def _arm_counts(model, max_blocks: int | None) -> list:
    """The frontier's arms, K = 0, 1, 2, 4, ... up to :func:`~.expansion.max_blocks_cap` (one rule: the default a
    quarter of the layers, more than the layers refused)."""
    from .expansion import decoder_stack, max_blocks_cap

    return block_counts(max_blocks_cap(len(decoder_stack(model)[0]), max_blocks))


def _heldout_count(available: int, costs: _Costs, counts: list, recipe: Recipe, budget: DecisionBudget) -> int:
    """Held-out windows of ``available`` (per split): as many as the budget affords
    (:func:`satcore._decisions.frontier.affordable_heldout`), at least 8, at most half."""
    readings = 3 * budget.replicates  # trial_checkpoints: three readings per trial
    per_window = costs.read([], 1) + readings * sum(costs.read(uniform_places(costs.n, k), 1) for k in counts)
    splits = 1 + (budget.general is not None)
    return affordable_heldout(available, budget.fraction * recipe.steps, splits * per_window)


def _plan(costs: _Costs, counts: list, recipe: Recipe, budget: DecisionBudget, evaluated: list) -> TrialPlan:
    """The trials' plan (:func:`satcore._decisions.frontier.plan_trials`) when ``evaluated`` windows (one count per
    split read at each checkpoint) are held out."""
    read = {k: sum(costs.read(uniform_places(costs.n, k), w) for w in evaluated) for k in counts}
    # a plan that is fixed (its --steps) can give up the largest arm instead of a larger budget
    fewer = (f"; or fewer arms: --max-blocks {counts[-2]} (K = {', '.join(map(str, counts[:-1]))})"
             if len(counts) > 2 else "")
    return plan_trials(recipe.steps, budget.fraction, [costs.step(uniform_places(costs.n, k)) for k in counts],
                       [read[k] for k in counts], budget.replicates, read[0], otherwise=fewer)


def trial_windows(trial_steps: int, batch_size: int) -> int:
    """Training windows that trials of ``trial_steps`` steps of ``batch_size`` windows pass over at most
    :data:`MAX_TRIAL_PASSES` times."""
    return math.ceil(trial_steps * batch_size / MAX_TRIAL_PASSES)


def trial_passes(trial_steps: int, batch_size: int, train: list) -> float:
    """How many times trials of ``trial_steps`` steps of ``batch_size`` windows pass over the windows of ``train``."""
    return trial_steps * batch_size / max(_windows(train), 1)


def passes_warning(trained: int, passes: float, wanted: int) -> list[str]:
    """The plan's warning where each trial passes over its ``trained`` training windows ``passes`` times, more than
    :data:`MAX_TRIAL_PASSES` (else no line): a trial may then fit them, and its held-out change read the fit
    (the frontier's K = 0 trial over-fitted 32 windows at 13 passes and read as a harm); ``wanted``: the windows to
    give for at most that many passes."""
    if passes <= MAX_TRIAL_PASSES:
        return []
    return [f"  warning: each trial passes over its {trained} training windows {passes:.1f} times (more than "
            f"{MAX_TRIAL_PASSES:g}): a trial may fit them and its held-out change read the fit, not the blocks; "
            f"give about {wanted} windows (a larger --max-windows; where the file holds fewer, more data, or a "
            "shorter --seq-len, which cuts more windows from it)"]


def check_trial_batch(trained: int, held: int, batch_size: int, wanted: int) -> None:
    """Refuse trials whose ``trained`` training windows (``held`` more held out) are fewer than a batch of
    ``batch_size``: each trial step would train on all of them (:func:`~.decide.recipe_minibatches`), not on the batch
    the decision prices every trial step at and the planned training takes, so its cost and its trials would
    describe other work than what runs (every decision with trials: the frontier, the placement check, the
    unbudgeted trials of ``expand``).  One line naming ``--batch-size`` and the windows, and what to give:
    ``wanted`` windows (the budgeted decisions: :func:`passes_warning`'s, the count for at most
    :data:`MAX_TRIAL_PASSES` passes; the unbudgeted trials, which run up to the recipe's steps: two batches, half held
    out), or a batch the training windows hold."""
    if trained < batch_size:
        raise InputError(f"--batch-size {batch_size} is more than the {trained} windows the trials train on (of "
                         f"{trained + held} read, the rest held out): each "
                         f"trial step would train on all {trained}, not on a batch of {batch_size} as the decision "
                         f"prices it and your training takes; give about {wanted} windows (a larger --max-windows; "
                         f"where the file holds fewer, more data, or a shorter --seq-len, which cuts more windows from "
                         f"it) or --batch-size {trained} or less")


def frontier_windows(model, recipe: Recipe, *, seq_len: int, budget: DecisionBudget | None = None,
                     max_blocks: int | None = None, train_new_only: bool = False, least: int = 0) -> int:
    """Windows of ``seq_len`` tokens for ``expand(blocks="auto")``'s frontier to read so that each trial passes over
    its training windows at most :data:`MAX_TRIAL_PASSES` times: the held-out windows its budget affords plus
    :func:`trial_windows` of its plan, at least ``least``.  ``satcore expand`` reads this many without
    ``--max-windows``; ``expand`` takes the windows it is given, so this is the count to give it (with
    ``budget``, ``max_blocks`` and ``train_new_only`` as passed to ``expand``).

    The held-out count grows with the windows until the budget's share caps it, and the trials shorten as it
    grows: the count rises to the first that covers its own need, then falls to its need while that still
    covers itself (where the held-out count is capped, the need exactly: held-out + trial windows)."""
    budget = DecisionBudget() if budget is None else budget
    counts = _arm_counts(model, max_blocks)
    costs = _Costs(model, seq_len, recipe.batch_size, counts[-1], train_new_only)

    def need(total: int) -> int:
        held = _heldout_count(total, costs, counts, recipe, budget)
        plan = _plan(costs, counts, recipe, budget, [held] * (1 + (budget.general is not None)))
        return max(least, held + trial_windows(plan.trial_steps, recipe.batch_size))

    total = max(least, 2 * MIN_HELDOUT)
    for _ in range(64):  # held-out counts only grow along the way, so a few rounds reach the cap
        if need(total) <= total:
            break
        total = need(total)
    for _ in range(64):
        fewer = need(total)
        if fewer >= total or need(fewer) > fewer:
            break
        total = fewer
    return total


def _sized_split(windows, model, recipe: Recipe, budget: DecisionBudget, options: dict) -> tuple[list, list, int]:
    """``(train, held, held-out count)`` of ``(N, T)`` token ids: held out as many windows as the budget affords
    (:func:`_heldout_count`), the rest training the trials (training windows cost nothing to hold)."""
    from .expansion import _windows_batches

    counts = _arm_counts(model, options["max_blocks"])
    costs = _Costs(model, windows.shape[1], recipe.batch_size, counts[-1], options["train_new_only"])
    count = _heldout_count(len(windows), costs, counts, recipe, budget)
    held = torch.zeros(len(windows), dtype=torch.bool)
    held[_spaced(len(windows), count)] = True
    return _windows_batches(windows[~held], 8), _windows_batches(windows[held], 8), count


@dataclass(frozen=True)
class BudgetedDecision:
    """What a budgeted decision spent and measured (the base of :class:`FrontierDecision` and :class:`PlacementCheck`).

    ``plan``: the trials' plan (:class:`satcore._decisions.frontier.TrialPlan`); ``cost_steps``: the passes counted as
    they ran (at most ``plan.budget_steps``); ``losses``: the model's own held-out losses (``heldout``, ``general``);
    ``step_times``: the trial steps the time estimate was made from (:class:`StepTimes`; None: no trial ran).
    """

    plan: TrialPlan
    cost_steps: float
    losses: dict
    step_times: StepTimes | None
    tolerance: float | None  # None: no trial ran, nothing was compared

    @property
    def cost_fraction(self) -> float:
        return self.cost_steps / self.plan.planned_steps


@dataclass(frozen=True)
class ArmResult:
    """One arm of the frontier: ``blocks`` at ``places``, the predicted changes after the full training and the
    trials they come from."""

    blocks: int
    places: tuple
    target: Prediction
    general: Prediction | None
    trials: ArmTrials
    versus_none: Prediction | None = None  # this arm's held-out change minus K = 0's, paired on the same windows

    def to_dict(self) -> dict:
        versus = self.versus_none
        return {"blocks": self.blocks, "places": list(self.places),
                "predicted_heldout_change": self.target.point, "interval": list(self.target.interval),
                "predicted_minus_none": None if versus is None else versus.point,
                "minus_none_interval": None if versus is None else list(versus.interval),
                "minus_none_standard_errors": None if versus is None else {
                    "windows": versus.se_sample, "seeds": versus.se_seed, "carry": versus.se_carry},
                "predicted_general_change": None if self.general is None else self.general.point,
                "general_interval": None if self.general is None else list(self.general.interval),
                "standard_errors": {"windows": self.target.se_sample, "seeds": self.target.se_seed},
                "trial": {"heldout_change": self.trials.curve("heldout"),
                          "general_change": self.trials.curve("general") if "general" in self.trials.changes
                          else None}}


@dataclass(frozen=True)
class FrontierDecision(BudgetedDecision):
    arms: tuple = ()
    choice: FrontierChoice | None = None
    # the target windows the trials trained on and were read on, and the general windows read (None without)
    windows: dict = field(default_factory=dict)
    raced: bool = False  # whether the trials could stop early (DecisionBudget.race)
    carry_per_doubling: float = 0.0  # the carry error the paired differences weigh (DecisionBudget.carry_per_doubling)

    @property
    def stopped_at(self) -> int | None:
        """The trial step at which every trial stopped, the race over (None: they ran to the end)."""
        read = max(a.trials.readings for a in self.arms)
        return None if read == len(self.plan.checkpoints) else self.plan.checkpoints[read - 1]

    @property
    def race(self) -> dict:
        """The race in ``expansion.json``: on or off, its margin, where each arm's trials stopped (their last
        checkpoint's step), where every trial did, and the ceiling the plan printed (``cost_steps``: what was spent)."""
        return {"on": self.raced, "margin_half_widths": RACE_MARGIN if self.raced else None,
                "arm_steps": {str(a.blocks): self.plan.checkpoints[a.trials.readings - 1]
                              for a in self.arms},
                "stopped_at_step": self.stopped_at, "ceiling_cost_steps": self.plan.cost_steps}

    @property
    def chosen_places(self) -> tuple:
        return next(a.places for a in self.arms if a.blocks == self.choice.chosen_blocks)

    @property
    def chosen_cost_fraction(self) -> float | None:
        """The decision's cost over the planned steps of the arm it chose, trained as the user will (its own
        step's FLOPs, where ``cost_fraction``'s unit is the largest arm's): the share of the training that follows;
        None where every arm is over ``--max-forgetting`` (none chosen)."""
        if self.every_arm_excluded:
            return None
        step = next(s for a, s in zip(self.arms, self.plan.step_costs) if a.blocks == self.choice.chosen_blocks)
        return self.cost_steps / (self.plan.planned_steps * step)

    @property
    def every_arm_excluded(self) -> bool:
        """Every arm, ``K = 0`` included, is over ``--max-forgetting``: none is chosen."""
        return all(a.blocks in self.choice.excluded for a in self.arms)

    @property
    def stop_reason(self) -> str | None:
        """Why nothing is inserted (None: a block count was chosen)."""
        if self.every_arm_excluded:
            return "no_arm_within_max_forgetting"
        return None if self.choice.chosen_blocks else "expanding_does_not_pay"

    @property
    def instead(self) -> str | None:
        """What to do where nothing is inserted, in plain words (the command, ``expansion.json`` and the card say
        this after the choice's ``reason``, which says why: this says only what to do); None where a block count was
        chosen."""
        if self.every_arm_excluded:
            least = min(self.arms, key=lambda a: a.general.point)
            return (f"raise --max-forgetting past the least predicted general change (K = {least.blocks}'s, "
                    f"{least.general.point:.3g} nats), or train with a smaller lr or fewer steps")
        if self.choice.chosen_blocks:
            return None
        return f"continue training the model as it is (your {self.plan.planned_steps} steps on it)"

    @property
    def warning(self) -> str | None:
        """Where every arm's predicted held-out change is positive, that the planned recipe looks harmful; where an
        arm's is below minus the model's own held-out loss (a loss after below 0, which no training of a cross-entropy
        reaches), that its trials' curve does not extrapolate: a diverging recipe's first readings rise by orders of
        magnitude and fall back, and a line in log2(steps) through them runs past 0.  The decision stands; None
        otherwise."""
        if self.arms and all(a.target.point > 0 for a in self.arms):
            return ("the trials predict the planned training raises the held-out loss at every block count (K = 0 "
                    "included); check the recipe (lr, steps) before training")
        loss = self.losses.get("heldout")
        beyond = [a for a in self.arms if loss is not None and a.target.point < -loss]
        if not beyond:
            return None
        worst = min(beyond, key=lambda a: a.target.point)
        first = worst.trials.curve("heldout")[0][0]
        return (f"K = {worst.blocks}'s predicted held-out change ({worst.target.point:.4g} nats) is below minus the "
                f"model's held-out loss ({loss:.4g} nats), which no training reaches: its trials' curve (first reading "
                f"{first:+.4g} nats) does not extrapolate, as a diverging recipe's does not; check the recipe (lr, steps) "
                "before training")

    @property
    def rule(self) -> str:
        """The choice rule this decision applied, in plain words (``--max-forgetting`` may leave ``K = 0`` out, and
        then there is nothing to beat).  Where it left every arm out, the rule only: the choice's ``reason`` says that
        it did, once (the command's chosen line, the card's first line)."""
        if self.every_arm_excluded:
            return "arms predicted to raise the general loss by more than --max-forgetting are left out before the choice"
        if 0 in self.choice.excluded:
            return ("K = 0 is over --max-forgetting, so there is nothing to beat: of the arms within it, the fewest "
                    "blocks within the tolerance of the best")
        return ("K blocks are chosen only where they beat K = 0 credibly, paired on the same windows (interval below "
                "0, with the carry error, and point below minus the tolerance); of those, the fewest within the "
                "tolerance of the best")

    def to_dict(self) -> dict:
        return {"method": ("frontier: K = 0 (the model as it is, trained the same way) and K blocks at uniform places, "
                           "short trials, each window's change fitted linearly in log2(steps) and "
                           "read at the planned steps; 95% interval from the held-out windows' noise (and the seeds', with "
                           "several replicates, each its own minibatch order), a paired difference from K = 0's adding "
                           f"the carry error, {self.carry_per_doubling:g} nats per doubling carried; {self.rule}"),
                "stop_reason": self.stop_reason, "instead": self.instead, "warning": self.warning,
                "frontier": [a.to_dict() for a in self.arms], "chosen_blocks": self.choice.chosen_blocks,
                "best_blocks": self.choice.best_blocks, "tolerance": self.tolerance,
                "max_forgetting": self.choice.max_forgetting,
                "excluded_by_max_forgetting": list(self.choice.excluded), "reason": self.choice.reason,
                "resolvable_gain": self.choice.resolvable_gain, "plan": self.plan.to_dict(), "cost_steps": self.cost_steps, "race": self.race,
                "chosen_cost_fraction": self.chosen_cost_fraction, "windows": self.windows,
                "carry_error": {"per_doubling": self.carry_per_doubling,
                                # where the race stopped every trial, they ended there, and so did the line carried
                                "at_trial_end": carry_error(self.carry_per_doubling,
                                                            self.stopped_at or self.plan.trial_steps,
                                                            self.plan.planned_steps) if self.arms else None},
                "heldout_loss": self.losses["heldout"], "general_loss": self.losses.get("general"),
                **timing_record(self.step_times)}


# the plan's words for the time estimate, which the decision's own first trial steps make (_Meter.estimate)
ESTIMATE_FOLLOWS = f"the time estimate follows the first {1 + TIMED_STEPS} trial steps"


def _plan_lines(title: str, plan: TrialPlan, tokens_per_step: int, evaluated: dict, trained: int) -> list[str]:
    reads = ", ".join(str(c) for c in plan.checkpoints)
    windows = " + ".join(f"{n} {split.replace('heldout', 'held-out')} windows" for split, n in evaluated.items())
    seeds = ("1 seed (the interval from the held-out windows alone)" if plan.replicates == 1 else
             f"{plan.replicates} seeds (each its own minibatch order: the interval adds their noise)")
    return [title,
            f"  trials: {plan.arms} arm(s) x {seeds} x {plan.trial_steps} steps on {trained} training windows, "
            f"each read at steps {reads} on {windows}",
            f"  cost: {plan.cost_steps:.1f} planned steps' FLOPs, {plan.cost_fraction:.1%} of the planned "
            f"{plan.planned_steps} ({plan.cost_steps * tokens_per_step:,.0f} tokens' worth); {ESTIMATE_FOLLOWS}"]


def _duration(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def decision_time_line(seconds: float, times: StepTimes | None) -> str:
    """The line after a decision that gives the wall ``seconds`` it took beside the estimate announced before its
    work ran (``times``' :attr:`StepTimes.priced` at their mean; without one, the time alone): on a shared CPU the
    two can differ severalfold, and the estimate alone leaves the user to time it."""
    took = f"decision took {_duration(seconds)}"
    if times is None or times.priced is None:
        return took
    return f"{took} (estimated {_duration(times.priced * times.mean)})"


def _setting(model, train: list, held: list, recipe: Recipe, budget: DecisionBudget, sized: int | None) -> tuple:
    """``(evaluate, tokens per step, window length)``: the splits the arms are read on (the general data cut to
    ``sized`` windows where the held-out set was sized)."""
    evaluate = {"heldout": held}
    general = _general_batches(budget.general, sized)
    if general:
        evaluate["general"] = general
    first = recipe_minibatches(train, recipe.batch_size, 0)
    from .expansion import _inputs_ids

    ids = _inputs_ids(next(first)[0])
    return evaluate, int(ids.numel()), int(ids.shape[-1])


def frontier_decision(model, train: list, held: list, *, recipe: Recipe, budget: DecisionBudget, options: dict
                      ) -> FrontierDecision:
    """How many blocks (module docstring).  ``options``: ``max_blocks``, ``init``, ``seed``, ``train_new_only``.
    ``held`` None: ``train`` is ``(N, T)`` token ids, split here into the held-out windows the budget affords and
    the trials' training windows (the rest)."""
    counts = _arm_counts(model, options["max_blocks"])
    sized = None
    if held is None:
        train, held, sized = _sized_split(train, model, recipe, budget, options)
    evaluate, tokens, seq_len = _setting(model, train, held, recipe, budget, sized)
    costs = _Costs(model, seq_len, recipe.batch_size, counts[-1], options["train_new_only"])
    plan = _plan(costs, counts, recipe, budget, [_windows(b) for b in evaluate.values()])
    # the windows to give for at most two passes: where the held-out set is sized to the budget it grows with the
    # windows and the trials shorten, so the count is frontier_windows' (the held-out windows now plus the trials'
    # need named a count that, given, still warned: 1253 where 1446 were needed)
    wanted = (frontier_windows(model, recipe, seq_len=seq_len, budget=budget, max_blocks=options["max_blocks"],
                               train_new_only=options["train_new_only"]) if sized is not None
              else _windows(held) + trial_windows(plan.trial_steps, recipe.batch_size))
    check_trial_batch(_windows(train), _windows(held), recipe.batch_size, wanted)
    check_trial_work(plan.trial_steps * plan.arms * plan.replicates, recipe.batch_size,
                     f"steps {recipe.steps:,} with a decision budget of {budget.fraction:g}",
                     "plan fewer steps or a smaller decision budget")
    passes = trial_passes(plan.trial_steps, recipe.batch_size, train)
    if budget.announce is not None:
        budget.announce("\n".join(_plan_lines(
            f"plan: decide how many blocks (K = {', '.join(map(str, counts))}; K = 0 trains the model as it is) for "
            f"your training of {recipe.steps} steps of {recipe.batch_size} windows ({recipe.steps * tokens:,} "
            f"tokens), {recipe.optimizer} lr {recipe.lr:g}", plan, tokens,
            {s: _windows(b) for s, b in evaluate.items()}, _windows(train))
            + ([f"  held out: {sized} windows, what a quarter of the budget reads (at least {MIN_HELDOUT}, at most "
                f"half); the rest train the trials"] if sized is not None else [])
            + passes_warning(_windows(train), passes, wanted)
            + (["  the cost is a ceiling: the trials stop once no K > 0 can still beat K = 0 credibly (--no-race: "
                "every trial to its end)"] if budget.races else [])))
    meter = _Meter(plan.cost_steps, budget.progress, costs, budget.announce)
    readings = dict.fromkeys(counts, len(plan.checkpoints))  # while racing, the checkpoints each arm will have read

    def going(changes: dict, read: tuple) -> tuple:
        on = racing({k: c["heldout"] for k, c in changes.items()}, read, recipe.steps, tolerance,
                    carry_error(budget.carry_per_doubling, plan.trial_steps, recipe.steps))
        readings.update({k: len(read) for k in changes if k not in on})
        meter.replan(plan.cost_reached([readings[k] for k in counts]))
        return on

    try:
        arms = _Arms(model, recipe, train, evaluate, {**options, "replicates": budget.replicates})
        losses = arms.read_model(meter)
        tolerance = _tolerance(budget, losses)
        trials = arms.race({k: uniform_places(costs.n, k) for k in counts}, plan.checkpoints,
                           going if budget.races else None)
        meter.estimate()
    finally:
        meter.close()
    none = trials[0].changes["heldout"]

    def predict(changes, read: int) -> Prediction:  # from the checkpoints an arm read
        return predict_change(changes, plan.checkpoints[:read], recipe.steps)

    def versus_none(changes, read: int) -> Prediction:  # what the choice rests on: with the carry error
        return with_carry(predict(changes - none[:, :read], read),
                          carry_error(budget.carry_per_doubling, plan.checkpoints[read - 1], recipe.steps))

    results = tuple(ArmResult(k, t.places, predict(t.changes["heldout"], t.readings),
                              predict(t.changes["general"], t.readings) if "general" in t.changes else None, t,
                              versus_none(t.changes["heldout"], t.readings) if k else None)
                    for k, t in trials.items())
    choice = choose_blocks({a.blocks: a.target for a in results},
                           {a.blocks: a.general for a in results} if "general" in evaluate else None,
                           tolerance, budget.max_forgetting, {a.blocks: a.versus_none for a in results if a.blocks})
    return FrontierDecision(plan, meter.done, losses, meter.times, tolerance, results, choice,
                            {"train": _windows(train), "heldout": _windows(held), "heldout_sized": sized is not None,
                             "general": _windows(evaluate["general"]) if "general" in evaluate else None,
                             "trial_passes": passes},
                            budget.races, budget.carry_per_doubling)


@dataclass(frozen=True)
class Move:
    """One group's proposed move: the block at ``uniform`` to ``proposed`` (the screen's first place in
    ``group``), ``difference`` the moved arm's predicted held-out change minus the uniform arm's after the full
    training (paired: same seeds, same windows), ``moved`` whether it was credible enough to take."""

    group: tuple
    uniform: int | str
    proposed: int | str
    difference: Prediction | None
    moved: bool

    def to_dict(self) -> dict:
        return {"group": list(self.group), "uniform": self.uniform, "proposed": self.proposed,
                "predicted_difference": None if self.difference is None else self.difference.point,
                "interval": None if self.difference is None else list(self.difference.interval),
                "moved": self.moved}


@dataclass(frozen=True)
class PlacementCheck(BudgetedDecision):
    """Where ``K`` blocks go: uniform places unless a trial moved one (module docstring)."""

    uniform: tuple = ()
    groups: tuple = ()  # the places each uniform place stands for
    moves: tuple = ()
    screen: object = None  # the first-order screen's ScreenDecision

    @property
    def places(self) -> list:
        taken = {m.uniform: m.proposed for m in self.moves if m.moved}
        return [taken.get(p, p) for p in self.uniform]

    def to_dict(self) -> dict:
        return {"method": ("placement check: LLaMA-Pro's uniform places, a block moved to the place the first-order "
                           "screen ranks first in its group only where paired short trials predict a credible "
                           "decrease of the held-out loss after the planned steps (95% interval below 0, point below "
                           "minus the tolerance)"),
                "uniform": list(self.uniform), "moves": [m.to_dict() for m in self.moves],
                "tolerance": self.tolerance, "plan": self.plan.to_dict(),
                "cost_steps": self.cost_steps, "heldout_loss": self.losses.get("heldout"),
                **timing_record(self.step_times)}


def _probe_steps(model, train: list, held: list, costs: _Costs, policy: DecisionPolicy
                 ) -> tuple[float, float, int]:
    """``(FLOPs, time, passes)`` of the first-order screen's passes, in planned steps' FLOPs and time: every window of
    both splits probed (:meth:`_Costs.probe`, its time :func:`probe_time`) once per group of places that fits the
    policy's ``max_statistics_bytes``, and a forward pass more to plan the groups."""
    from .expansion import probe_passes

    probed = costs.probe(_windows(train) + _windows(held))
    if policy.max_statistics_bytes is None:
        return probed, probe_time(probed), 1
    passes, planning = probe_passes(model, train[0], policy), costs.read([], _windows(train[:1]))
    return passes * probed + planning, probe_time(passes * probed, passes) + planning, passes


def _screen_memory_line(model, batch, policy, places: int, passes: int) -> str:
    """The plan's line of what the screen's statistics hold at once (both splits, float64), before it starts: on a
    large model they, not the FLOPs, decide whether the command fits (SmolLM2-135M's 31 places: about 12 GiB)."""
    from .expansion import probe_memory_plan

    cap = policy.max_statistics_bytes
    if cap is not None:
        return (f"  memory: the screen holds at most {cap / 2**30:.3g} GiB of statistics at once "
                f"(--max-statistics-gib), in {passes} pass(es) over the windows")
    held = 2 * probe_memory_plan(model, batch, policy).device_bytes
    return (f"  memory: the screen holds the statistics of all {places} places at once, {held / 2**30:.3g} GiB (both "
            "splits, float64); --max-statistics-gib caps it, at one more pass over the windows per group of places")


def placement_check(model, train: list, held: list, *, recipe: Recipe, budget: DecisionBudget, options: dict
                    ) -> PlacementCheck:
    """Where ``options["blocks"]`` blocks go (module docstring).  ``options``: ``blocks``, ``init``, ``seed``,
    ``train_new_only``, ``policy`` (the :class:`satcore.DecisionPolicy` of the screen)."""
    from .expansion import decoder_stack, first_order_decision, native_policy

    names = decoder_stack(model)[0]
    n_blocks, k = len(names), options["blocks"]
    uniform, groups = uniform_places(n_blocks, k), uniform_groups(n_blocks, k)
    evaluate, tokens, seq_len = _setting(model, train, held, recipe, budget, None)
    costs = _Costs(model, seq_len, recipe.batch_size, k, options["train_new_only"])
    model_read = sum(costs.read([], _windows(b)) for b in evaluate.values())
    read = sum(costs.read(uniform, _windows(b)) for b in evaluate.values())
    # an arm's step priced as if group 0's block moved to its group's first place: the lowest a block can go, so
    # the backward's longest; the moves' actual steps are counted as they run
    step = costs.step([groups[0][0]] + uniform[1:])
    probe_steps, probe_timed, probe_passes = _probe_steps(model, train, held, costs, options["policy"])
    slower = probe_timed - probe_steps  # the probe's time beyond its FLOPs: on the estimate and the bar, not the cost
    fixed = probe_steps + model_read
    movable = sum(len(g) > 1 for g in groups)

    # the refusal says what --blocks K decides (each group's place, not a count among arms) and how to run without
    # this budget: first the uniform places themselves, which the check would keep unless a trial moved a block
    deciding = (f"checking the places of {k} block(s) (a trial of the uniform places and one per group the screen "
                f"may move a block in: {1 + movable} trials)" if movable else
                f"placing {k} block(s) (the first-order screen alone: no group has a second place)")
    forced = ",".join(map(str, uniform))

    def planned(arms: int, fixed_steps: float) -> TrialPlan:
        return plan_trials(recipe.steps, budget.fraction, [step] * arms, [read] * arms, budget.replicates,
                           fixed_steps, deciding, f"; or --at {forced} (LLaMA-Pro's uniform places, no decision, no "
                           "cost); or --decision screen (the first-order screen alone, its cost the probe) or --layout "
                           "ranked (trials of one block, up to the whole --steps), both experimental, neither held to "
                           "--decision-budget")

    # the longest trials if every group proposes a move: what the plan promises at most
    plan = planned(1 + movable if movable else 0, fixed)
    if movable:
        wanted = 2 * trial_windows(plan.trial_steps, recipe.batch_size)  # half held out
        check_trial_batch(_windows(train), _windows(held), recipe.batch_size, wanted)
    if budget.announce is not None:
        lines = [f"plan: place {k} block(s): uniform places {uniform} unless a trial shows a move credibly better, "
                 f"for your training of {recipe.steps} steps of {recipe.batch_size} windows "
                 f"({recipe.steps * tokens:,} tokens), {recipe.optimizer} lr {recipe.lr:g}",
                 f"  screen: the first-order probe of {n_blocks + 1} places ({probe_steps:.1f} planned steps' FLOPs; "
                 f"each window about {PROBE_TIME_RATIO:g} times a forward and backward pass)",
                 _screen_memory_line(model, train[0], options["policy"], n_blocks + 1, probe_passes)]
        if movable:
            trials = _plan_lines("", plan, tokens, {s: _windows(b) for s, b in evaluate.items()},
                                 _windows(train))[1]
            lines += [f"  then, if the screen proposes a move in every group: uniform and {movable} moved arm(s)",
                      trials + " (longer with fewer moves)",
                      f"  cost: at most {plan.budget_steps:g} planned steps' FLOPs, {budget.fraction:.0%} of the planned "
                      f"{recipe.steps} ({plan.budget_steps * tokens:,.0f} tokens); {ESTIMATE_FOLLOWS}"]
            warned = passes_warning(_windows(train), trial_passes(plan.trial_steps, recipe.batch_size, train), wanted)
            # why --blocks K does not size its windows to the budget as --blocks auto does (frontier_windows): there
            # the windows that train the trials cost nothing, here the screen probes each one within the budget
            lines += warned + ([f"  --blocks K reads --max-windows as given, half held out, where --blocks auto sizes "
                                "both to the budget: the screen probes every window read (each about "
                                f"{PROBE_TIME_RATIO:g} times a forward and backward pass, within the budget), so more "
                                "windows mean a longer probe and shorter trials"] if warned else [])
        else:
            lines.append("  no group has a second place: nothing to move, no trial to time (the progress bar shows the "
                         "probe's time left)")
        budget.announce("\n".join(lines))
    meter = _Meter(plan.cost_steps + slower, budget.progress, costs, budget.announce)
    try:
        screen = first_order_decision(model, train, held, policy=native_policy(options["policy"]),
                                      progress=lambda windows: meter.probed(windows, probe_passes))
        meter.add(probe_steps, probe_timed)
        ranking = screen.ranking()
        moves, losses, tolerance, proposals = [], {}, budget.tolerance, []
        for group, place in zip(groups, uniform):
            named = {HEAD if p == HEAD else names[p]: p for p in group}
            best = next((named[n] for n in ranking if n in named), place)
            if best != place:
                proposals.append((tuple(group), place, best))
        final_plan = (planned(1 + len(proposals), fixed) if proposals else
                      planned(0, probe_steps))
        meter.replan(final_plan.cost_steps + slower)
        if proposals:
            arms = _Arms(model, recipe, train, evaluate, {**options, "replicates": budget.replicates})
            losses = arms.read_model(meter)
            base = arms.run(uniform, final_plan.checkpoints)
            tolerance = _tolerance(budget, losses)
            for group, place, best in proposals:
                moved = arms.run([best if p == place else p for p in uniform], final_plan.checkpoints)
                difference = predict_change(moved.changes["heldout"] - base.changes["heldout"],
                                            final_plan.checkpoints, recipe.steps)
                credible = difference.interval[1] < 0 and difference.point < -tolerance
                moves.append(Move(group, place, best, difference, credible))
        meter.estimate()
    finally:
        meter.close()
    return PlacementCheck(final_plan, meter.done, losses, meter.times, tolerance, tuple(uniform),
                          tuple(tuple(g) for g in groups), tuple(moves), screen)


def _tolerance(budget: DecisionBudget, losses: dict) -> float:
    return RELATIVE_TOLERANCE * abs(losses["heldout"]) if budget.tolerance is None else budget.tolerance


__all__ = ["ArmResult", "ArmTrials", "BudgetedDecision", "DecisionBudget", "FrontierDecision", "Move",
           "PlacementCheck", "MAX_TRIAL_PASSES", "PROBE_TIME_RATIO", "RELATIVE_TOLERANCE", "StepTimes", "TIMED_STEPS",
           "TIMING_KEYS", "TIMING_PASSES", "decision_time_line", "frontier_decision", "frontier_windows", "placement_check", "probe_time", "timed_step",
           "timing_record", "trial_windows"]
