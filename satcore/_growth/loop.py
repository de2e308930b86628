"""The growth loop, framework-free: decide -> insert -> train -> measure -> keep or roll back, until a stop.

Each round of :func:`run_growth`

1. **decides** where a block goes, or that growth stops, with a pluggable step
   ``decide(model, seed)``.  The default, :class:`FirstOrderDecide`, probes the
   model on a split it does not train on and reads the paper's first-order
   verdicts (Liu et al., "Quantifying Depth Sufficiency in Residual Neural
   Networks: A First-Order Criterion", Theorem 2 and the fold tests of
   :mod:`satcore._decisions.verdicts`): a candidate qualifies when its test calls it
   *improvable* and its predicted first-order gain ``rho ||z||_S V`` is above the
   tolerance; the largest such gain gets the block.  Any :class:`Decision` (``choice``,
   a candidate or ``None``; ``stop_reason``; ``to_dict()``), such as the recipe-aware
   ``InsertionDecision``, can take its place;
2. **inserts** a zero-output block there (the adapter's ``insert``: the model's
   own kind, or the generic residual ``z + V psi(z)`` of a feature family with
   ``V = 0``), so the grown model computes what the old one did;
3. **trains** it with the user's ``train(model, round) -> model``;
4. **guards** the held-out loss (with held-out data): the change ``d`` of the
   mean per-sample held-out loss (after training minus before insertion, paired
   over the same samples) and its standard error ``se``.  A harm beyond noise,
   ``d > z_{1-alpha} se``, rolls the block back and stops (``heldout_knee``); a
   gain ``-d`` below the guard's tolerance keeps the block and stops
   (``heldout gain below tolerance``);
5. **logs** the round (:mod:`satcore._growth.log`) and saves the weights.

Stop reasons are :class:`StopReason` values; a pluggable decide step may stop
with reasons of its own (its ``stop_reason`` string is kept as given).

Resume.  With a log, a run that stopped or was killed after round ``k`` resumes:
the kept insertions are replayed (the adapter's ``replay``), the weights of the
last kept round are loaded, and round ``k + 1`` follows.  The resumed run equals
the uninterrupted one only if ``train(model, round)`` is deterministic (seeded by
its round).  A log that finished returns its model; a log written under other
settings is refused with what to do.

The adapter supplies the framework parts through a :class:`GrowthSteps` object (most of it
written once in :class:`AdapterSteps`) and its incremental probe, a
:class:`satcore._io.probe_result.Probe`; nothing here imports a framework.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Callable, Protocol

import numpy as np
# scipy.special, not scipy.stats (whose ppf/cdf call these): a third of the import time, paid by every CLI run
from scipy.special import ndtri

from .._io.probe_result import Probe
from .._shared.errors import InputError
from .._shared.numbers import derived_seed
from .log import GrowthLog, GrowthLogContents, GrowthRound, read_growth_log
from .._decisions.policy import check_probe_options
from .._decisions.verdicts import look_schedule


class StopReason(str, Enum):
    """Why the growth loop stopped (the value is what logs and results hold)."""

    SATURATED = "saturated"
    INCONCLUSIVE = "inconclusive"
    NO_GAIN = "no gain above tolerance"
    HELDOUT_KNEE = "heldout_knee"
    SMALL_HELDOUT_GAIN = "heldout gain below tolerance"
    MAX_DEPTH = "max_depth"
    MAX_ROUNDS = "max_rounds"

    __str__ = str.__str__  # the words themselves in messages and f-strings
    __format__ = str.__format__


def _stop_reason(value):
    if value is None:
        return None
    try:
        return StopReason(value)
    except ValueError:
        return str(value)


def _number(name: str, value, *, low=None, high=None, integer=False, optional=False):
    if value is None and optional:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or (not integer and not math.isfinite(value)):
        raise InputError(f"growth: {name} must be {'an integer' if integer else 'a finite number'}, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InputError(f"growth: {name} must be {'a whole number' if integer else 'a number'} {bound}, "
                         f"got {value!r}")
    return value


@dataclass(frozen=True)
class GrowthCriteria:
    """The first-order decision's level and tolerance: ``alpha``, ``tolerance`` (loss units, for a block of
    relative size ``rho = ||h||_S / ||z||_S``) and ``rho`` (:func:`satcore._decisions.verdicts.decide`)."""

    tolerance: float
    rho: float = 0.01
    alpha: float = 0.05

    def __post_init__(self):
        _number("tolerance", self.tolerance, low=0)
        _number("rho", self.rho, low=0)
        _number("alpha", self.alpha, low=0, high=1)


@dataclass(frozen=True)
class GrowthBudget:
    """``max_depth`` (blocks in the model; ``None``: no limit) and ``max_rounds`` (rounds run)."""

    max_depth: int | None = None
    max_rounds: int = 10

    def __post_init__(self):
        _number("max_depth", self.max_depth, low=0, integer=True, optional=True)
        _number("max_rounds", self.max_rounds, low=0, integer=True)


@dataclass(frozen=True)
class HeldoutGuard:
    """What the held-out change after each round's training must show (module docstring, step 4).

    ``tolerance``: loss units; a realized held-out gain below it stops the loop (the block is kept).
    ``alpha``: one-sided level of "harm beyond noise" (``d > z_{1-alpha} se`` rolls the block back).
    """

    tolerance: float = 0.0
    alpha: float = 0.05

    def __post_init__(self):
        _number("guard tolerance", self.tolerance, low=0)
        _number("guard alpha", self.alpha, low=0, high=1)

    def noise(self, se: float) -> float:
        """The largest held-out harm still read as noise: ``z_{1-alpha} se``."""
        return float(ndtri(1.0 - self.alpha)) * se


@dataclass(frozen=True)
class GrowthOptions:
    """Everything that decides what a run does (its first six recorded in its log's header).

    ``criteria``: a :class:`GrowthCriteria`, or any object with ``alpha``, ``tolerance`` and ``rho``
    (such as the report's own criteria object), read by the first-order decisions only (``None``:
    none given; a run decided by a :class:`satcore.DecisionPolicy` or a decide step of its own then
    records ``GrowthCriteria(0.0)``'s); ``guard=None`` measures the held-out change without acting on
    it; round ``k`` decides and inserts with seed ``seed * 1000 + k``; ``first_look_batches``: start
    each round's probe with this many batches and enlarge it while inconclusive (docs/growth.md).

    ``probe``: the adapter's frozen probe options for the run's own probe and the blocks it inserts
    (``satcore.adapters.torch.ProbeConfig``: ``family``, ``candidates``, ``n_features``, ...; ``None``:
    the adapter's defaults, the ``native`` family in torch); ``zero``: which maps of a native block
    start at zero (torch's :func:`~satcore.adapters.torch.insert_block`); ``log_path``: the JSON-lines
    log (:mod:`satcore._growth.log`), the weights of each round beside it, an existing log resumed;
    ``progress``: a progress bar and one line per round on stderr (torch).

    Examples
    --------
    >>> from satcore import GrowthBudget, GrowthCriteria, GrowthOptions
    >>> options = GrowthOptions(GrowthCriteria(tolerance=1e-3), GrowthBudget(max_rounds=3))
    >>> options.settings()["tolerance"], options.budget.max_rounds, options.round_seed(2)
    (0.001, 3, 2)
    >>> GrowthOptions().deciding(first_order=False).criteria.tolerance
    0.0
    """

    criteria: GrowthCriteria | None = None
    budget: GrowthBudget = field(default_factory=GrowthBudget)
    guard: HeldoutGuard | None = field(default_factory=HeldoutGuard)
    seed: int = 0
    first_look_batches: int | None = None
    probe: object = None
    zero: str = "terminal"
    log_path: object = None
    progress: bool = False

    def __post_init__(self):
        _number("seed", self.seed, low=0, integer=True)
        _number("first_look_batches", self.first_look_batches, low=1, integer=True, optional=True)
        if self.probe is not None:
            check_probe_options(self.probe, "growth options: probe")

    def round_seed(self, k: int) -> int:
        """Round ``k`` decides and inserts with seed ``seed * 1000 + k``, brought back into ``0 .. MAX_SEED``
        (:func:`~satcore._shared.numbers.derived_seed`; unchanged below it), the range every seed is taken in."""
        return derived_seed(self.seed * 1000 + k)

    def deciding(self, *, first_order: bool = True) -> "GrowthOptions":
        """These options for a run whose rounds decide with :class:`FirstOrderDecide` (``first_order``), the only
        reader of the criteria, which must then be given; a decision of its own (a policy, a decide step) has its
        own criteria, so there ``criteria=None`` records ``GrowthCriteria(0.0)``."""
        if self.criteria is not None:
            return self
        if first_order:
            raise InputError("growth options: criteria: the growth loop needs tolerance= for its first-order decisions: "
                            "options=GrowthOptions(GrowthCriteria(tolerance=...))")
        return replace(self, criteria=GrowthCriteria(0.0))

    def settings(self) -> dict:
        c = self.deciding(first_order=False).criteria
        return {"alpha": c.alpha, "tolerance": c.tolerance, "rho": c.rho, **asdict(self.budget),
                "guard": None if self.guard is None else asdict(self.guard), "seed": self.seed,
                "first_look_batches": self.first_look_batches}


class Decision(Protocol):
    """What a pluggable decide step may return instead of a :class:`RoundDecision` (which
    :meth:`RoundDecision.of` reads it into).

    ``choice``: the candidate the block goes before, or ``None`` to stop; ``stop_reason``:
    why it stops (a :class:`StopReason` value or words of its own; ``None`` with a choice);
    ``to_dict()``: a JSON-ready record whose ``"candidates"`` maps each candidate's name to
    its row (or lists rows with a ``"name"``) and whose other keys are logged as the round's
    ``decision``.
    """

    choice: str | None
    stop_reason: str | None

    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class RoundDecision:
    """A round's decision: where the block goes (``choice``; ``None`` stops with ``stop_reason``), the
    depth-wide ``verdict``, one row per candidate for the log, and the probe's size (``probe_samples``,
    ``probe_looks``, ``look_alpha``); ``details``: what else a pluggable decision reported (logged as
    the round's ``decision``)."""

    choice: str | None
    stop_reason: str | None
    candidates: list
    verdict: str | None = None
    probe_samples: int | None = None
    probe_looks: int = 1
    look_alpha: float | None = None
    details: dict | None = None

    @classmethod
    def of(cls, decision: "RoundDecision | Decision") -> "RoundDecision":
        """A :class:`RoundDecision` from what a decide step returned: this class, or a :class:`Decision`
        (an object lacking one of its members is refused with a ``TypeError`` naming it)."""
        if isinstance(decision, cls):
            return decision
        for name in ("choice", "stop_reason", "to_dict"):
            if not hasattr(decision, name):
                raise TypeError(f"decide returned {type(decision).__name__}, which has no {name!r}")
        data = decision.to_dict()
        data = data if isinstance(data, dict) else {}
        rows = data.get("candidates", {})
        rows = [{"name": k, **v} for k, v in rows.items()] if isinstance(rows, dict) else list(rows)
        details = {k: v for k, v in data.items() if k not in ("choice", "stop_reason", "candidates")}
        return cls(decision.choice, decision.stop_reason, rows, details=details or None)


def candidate_rows(report) -> list:
    """One log row per candidate of a depth report: growth value, fold test, predicted gain."""
    rows = []
    for c in report.candidates:
        t = report.test(c.name)
        gain = t.predicted_gain
        rows.append({
            "name": c.name, "growth_value": c.growth_value, "p_value_adjusted": t.p_value_adjusted,
            "verdict": t.verdict, "growth_value_interval": list(t.growth_value_interval or (None, None)),
            "predicted_gain": None if gain is None else gain.value,
            "predicted_gain_interval": None if gain is None else list(gain.interval),
            "probe_size_to_decide": t.probe_size_to_decide,
        })
    return rows


def first_order_choice(report, tolerance: float):
    """``(candidate or None, stop reason or None)`` from a depth report (module docstring, step 1)."""
    if report.verdict.verdict == StopReason.SATURATED.value:
        return None, StopReason.SATURATED
    improvable = [t for t in report.tests if t.verdict == "improvable"]
    qualified = [t for t in improvable if t.predicted_gain is not None and t.predicted_gain.value > tolerance]
    if qualified:
        return max(qualified, key=lambda t: t.predicted_gain.value).name, None
    return None, StopReason.NO_GAIN if improvable else StopReason.INCONCLUSIVE


class FirstOrderDecide:
    """The default decide step: probe, read the first-order verdicts, pick the largest qualified gain.

    ``start_probe(model, seed)`` returns a fresh incremental probe of ``model``, a
    :class:`~satcore._io.probe_result.Probe` (``update(batch) -> samples``, ``batches_done``,
    ``result()``, whose ``report(alpha=, tolerance=, rho=)`` is read): the adapter's
    :meth:`GrowthSteps.start_probe`.  ``data`` is the probe split.  With ``first_look_batches`` the probe is enlarged while inconclusive at the levels of
    :func:`satcore._decisions.verdicts.look_schedule` (docs/growth.md); ``data`` then needs a ``len()``.
    ``on_samples(n)`` is called as samples are probed (a progress bar).
    """

    def __init__(self, start_probe: Callable[[object, int], Probe], data, criteria: GrowthCriteria,
                 first_look_batches: int | None = None,
                 on_samples: Callable[[int], None] | None = None):
        if first_look_batches is not None:
            try:
                len(data)
            except TypeError:
                raise TypeError("first_look_batches needs probe_data with a len() (a list, a DataLoader): the looks "
                                "are planned from the number of batches") from None
        self.start_probe, self.data, self.criteria = start_probe, data, criteria
        self.first_look_batches, self.on_samples = first_look_batches, on_samples

    def __call__(self, model, seed: int) -> RoundDecision:
        c = self.criteria
        state, stream = self.start_probe(model, seed), iter(self.data)  # streamed: one pass over the split

        def report_at(n_batches, level):
            for batch in itertools.islice(stream, None if n_batches is None else n_batches - state.batches_done):
                samples = state.update(batch)
                if self.on_samples is not None:
                    self.on_samples(samples)
            return state.result().report(alpha=level, tolerance=c.tolerance, rho=c.rho)

        if self.first_look_batches is None:
            report, looks, level = report_at(None, c.alpha), 1, c.alpha
        else:
            schedule = look_schedule(self.first_look_batches, len(self.data), c.alpha)
            report, used, looks = schedule.enlarge(report_at)
            level = schedule.alpha_at(used)
        choice, reason = first_order_choice(report, c.tolerance)
        return RoundDecision(choice, reason, candidate_rows(report), report.verdict.verdict,
                             max(x.n_samples for x in report.candidates), looks, level)


class GrowthSteps(Protocol):
    """What an adapter supplies to :func:`run_growth` (the framework's side of a round).

    ``start_probe(model, seed)``: a fresh :class:`~satcore._io.probe_result.Probe` of ``model``
    with the families drawn at ``seed`` (what :class:`FirstOrderDecide` feeds the probe split).
    ``depth(model)``: the blocks the model has (what ``max_depth`` bounds).
    ``insert`` returns a NEW model (the input stays as it was: rolling back is keeping it) and a
    JSON-ready record of the block for ``replay`` (``None`` when the candidate and seed suffice);
    ``replay(model, entry)`` inserts a logged round's block again (resume).
    ``train(model, round_index)`` returns the trained model.
    ``losses(model, split)`` returns per-sample losses on ``"train"`` (where training loss is
    measured) or ``"heldout"`` (``None`` without held-out data), in a fixed sample order.
    ``save(model, path)`` and ``load(model, path)`` write and read the weights beside the log
    (files ending ``weights_suffix``); ``settings()`` is the JSON-ready part of the log's
    header a resumed run must match.
    """

    weights_suffix: str  # the weights file's extension, ".pt" or ".npz"

    def start_probe(self, model, seed: int) -> Probe: ...

    def depth(self, model) -> int: ...

    def insert(self, model, at: str, seed: int) -> tuple[object, dict | None]: ...

    def replay(self, model, entry: GrowthRound): ...

    def train(self, model, round_index: int): ...

    def losses(self, model, split: str) -> np.ndarray | None: ...

    def save(self, model, path: str) -> None: ...

    def load(self, model, path: str): ...

    def settings(self) -> dict: ...


class AdapterSteps:
    """The part of :class:`GrowthSteps` every adapter writes alike, over its own functions.

    A subclass sets the attributes declared here (``per_sample_losses``, ``save_weights`` and
    ``load_weights`` as static methods of its framework) and writes the rest of
    :class:`GrowthSteps` (``start_probe``, ``depth``, ``insert``, ``replay``, ``settings``,
    ``weights_suffix``).
    """

    train_fn: Callable  # the user's train(model, round_index) -> the trained model
    loss_fn: object  # the framework's per-sample loss, as its probe takes it
    data: dict  # {"train": batches, "heldout": batches or None} (and the adapter's own splits)
    per_sample_losses: Callable[..., np.ndarray]  # (model, data, loss_fn) -> losses in a fixed sample order
    save_weights: Callable  # (model, path) -> None
    load_weights: Callable  # (model, path) -> the model with the weights read

    def train(self, model, round_index: int):
        trained = self.train_fn(model, round_index)
        if trained is None:  # a train that updates in place and forgets the return: the loop needs the model
            raise InputError(f"growth: train(model, {round_index}) returned None; it must return the trained model")
        return trained

    def losses(self, model, split: str):
        data = self.data.get(split)
        if data is None:
            return None
        losses = self.per_sample_losses(model, data, self.loss_fn)
        if losses.size == 0:
            raise InputError(f"growth: the {split} data yielded no samples")
        return losses

    def save(self, model, path: str) -> None:
        self.save_weights(model, path)

    def load(self, model, path: str):
        return self.load_weights(model, path)


@dataclass(frozen=True)
class GrowthResult:
    """The grown model, every round, why the loop stopped, its depth and log."""

    model: object
    rounds: tuple[GrowthRound, ...]
    stop_reason: str
    depth: int
    log_path: str | None = None

    def __str__(self) -> str:
        """What ``print(result)`` shows: why the run stopped and at what depth, then one line per round (the
        lines ``progress`` writes); the dataclass's own repr holds the model and every round's record."""
        stop = getattr(self.stop_reason, "value", self.stop_reason)
        lines = [f"growth: stopped ({stop}) at depth {self.depth} after {len(self.rounds)} round(s)"]
        lines += [round_summary(entry) for entry in self.rounds]
        if self.log_path is not None:
            lines.append(f"log: {self.log_path}")
        return "\n".join(lines)


def weights_path(log_path: str, round_index: int, suffix: str = ".pt") -> str:
    """Where round ``round_index``'s weights go: beside the log, ``<log>.round<k><suffix>``."""
    return f"{log_path}.round{round_index}{suffix}"


def paired_change(before: np.ndarray, after: np.ndarray) -> tuple[float, float]:
    """Mean of ``after - before`` over the same samples and its standard error ``sd / sqrt(n)``."""
    d = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    if d.ndim != 1 or d.size < 2:
        raise InputError(f"growth: the held-out guard needs at least 2 held-out samples, got {d.size}")
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))


def _mean(losses) -> float | None:
    return None if losses is None else float(np.mean(losses))


def _resume(log: GrowthLog, model, steps: GrowthSteps):
    """The model after the logged rounds (module docstring, Resume) and those rounds."""
    rounds = log.contents.rounds
    for entry in rounds:
        if entry.kept:
            model = steps.replay(model, entry)
    kept = [r.round for r in rounds if r.kept]
    if kept:  # the last round that kept a trained block wrote the weights (stop and rollback rounds write none)
        model = steps.load(model, weights_path(log.path, kept[-1], steps.weights_suffix))
    return model, list(rounds)


def _round(model, k: int, decide, steps: GrowthSteps, options: GrowthOptions):
    """One round: ``(model to go on with, its log entry)`` (module docstring, steps 1-4)."""
    depth, seed = steps.depth(model), options.round_seed(k)
    began = time.perf_counter()
    decision = RoundDecision.of(decide(model, seed))
    probe_seconds = time.perf_counter() - began
    at, reason = decision.choice, _stop_reason(decision.stop_reason)
    if at is not None and options.budget.max_depth is not None and depth >= options.budget.max_depth:
        at, reason = None, StopReason.MAX_DEPTH
    held_before = steps.losses(model, "heldout")
    entry = dict(round=k, depth=depth, seed=seed, verdict=decision.verdict, candidates=decision.candidates,
                 inserted_at=at, train_loss_before=_mean(steps.losses(model, "train")),
                 heldout_loss_before=_mean(held_before), loss_after_insert=None, train_loss_after=None,
                 heldout_loss_after=None, probe_seconds=probe_seconds, train_seconds=None,
                 probe_samples=decision.probe_samples, probe_looks=decision.probe_looks,
                 look_alpha=decision.look_alpha, decision=decision.details)
    if at is None:
        return model, GrowthRound(**entry, stop_reason=reason)
    grown, block = steps.insert(model, at, seed)
    entry.update(inserted_block=block, loss_after_insert=_mean(steps.losses(grown, "train")))
    began = time.perf_counter()
    grown = steps.train(grown, k)
    entry.update(train_seconds=time.perf_counter() - began, train_loss_after=_mean(steps.losses(grown, "train")))
    if held_before is None:
        return grown, GrowthRound(**entry)
    held_after = steps.losses(grown, "heldout")
    change, se = paired_change(held_before, held_after)
    entry.update(heldout_loss_after=_mean(held_after), heldout_change=change, heldout_change_se=se)
    if options.guard is None:
        return grown, GrowthRound(**entry)
    if change > options.guard.noise(se):
        return model, GrowthRound(**entry, rolled_back=True, stop_reason=StopReason.HELDOUT_KNEE)
    if -change < options.guard.tolerance:
        return grown, GrowthRound(**entry, stop_reason=StopReason.SMALL_HELDOUT_GAIN)
    return grown, GrowthRound(**entry)


def run_growth(model, steps: GrowthSteps, decide: Callable, options: GrowthOptions, *, log_path=None,
               on_round: Callable[[GrowthRound], None] | None = None) -> GrowthResult:
    """Rounds of decide -> insert -> train -> guard until a stop (module docstring).

    Parameters
    ----------
    model
        The trained model; not modified (each insertion makes a new model).
    steps : GrowthSteps
        The adapter's side of a round.
    decide : callable
        ``decide(model, seed)`` -> :class:`RoundDecision` or an object with ``choice``,
        ``stop_reason`` and ``to_dict()`` (e.g. :class:`FirstOrderDecide`).
    options : GrowthOptions
        Criteria, budget, guard, seed.
    log_path : path, optional
        The JSON-lines log (:mod:`satcore._growth.log`); weights go beside it; an existing log is resumed,
        or returned if it finished.  Its folder must exist (checked before any work).
    on_round : callable, optional
        Called with each new :class:`GrowthRound` once it is logged (progress).
    """
    log = None if log_path is None else GrowthLog(log_path, {**options.settings(), **steps.settings()})
    try:
        rounds, start = [], 0
        if log is not None:
            log.check_settings()
            model, rounds = _resume(log, model, steps)
            if log.contents.stop_reason is not None:
                return GrowthResult(model, tuple(rounds), _stop_reason(log.contents.stop_reason),
                                    steps.depth(model), log.path)
            start = log.next_round
        stop = StopReason.MAX_ROUNDS
        for k in range(start, options.budget.max_rounds):
            model, entry = _round(model, k, decide, steps, options)
            if log is not None and entry.kept:
                steps.save(model, weights_path(log.path, k, steps.weights_suffix))
            if log is not None:
                log.append(entry)
            rounds.append(entry)
            if on_round is not None:
                on_round(entry)
            if entry.stop_reason is not None:
                stop = entry.stop_reason
                break
        return GrowthResult(model, tuple(rounds), stop, steps.depth(model), None if log is None else log.path)
    finally:
        if log is not None:
            log.close()


def round_summary(entry: GrowthRound) -> str:
    """One line per round for progress output: the depth the round started at and, where its block is kept, the
    depth it ends at (the run's ``GrowthResult.depth`` after its last round)."""
    text = f"round {entry.round}: depth {entry.depth}"
    if entry.inserted_at is not None:
        text += f"{'' if entry.rolled_back else f' -> {entry.depth + 1}'}, block at {entry.inserted_at}"
        if entry.train_loss_after is not None:
            text += f", training loss {entry.train_loss_before:.4g} -> {entry.train_loss_after:.4g}"
        if entry.heldout_change is not None:
            text += f", held-out change {entry.heldout_change:+.3g} (se {entry.heldout_change_se:.2g})"
        if entry.rolled_back:
            text += ", rolled back"
    if entry.stop_reason is not None:
        text += f"; stop: {entry.stop_reason}"
    seconds = entry.probe_seconds + (entry.train_seconds or 0.0)
    return text + f" ({seconds:.1f} s)"


__all__ = ["StopReason", "GrowthCriteria", "GrowthBudget", "HeldoutGuard", "GrowthOptions", "Decision", "RoundDecision",
           "FirstOrderDecide", "GrowthSteps", "GrowthResult", "GrowthRound", "GrowthLogContents", "candidate_rows",
           "first_order_choice", "paired_change", "read_growth_log", "round_summary", "run_growth", "weights_path"]
