"""Grow until saturated: probe, decide, insert the model's own block, train, repeat, stop on evidence.

Each round

1. probes the model on ``probe_data`` (a split it does not train on) with the
   ``native`` family at the round's seed, so every candidate's growth value is
   that of the very block :func:`~.native.insert_block` would insert there;
2. reads the report at the user's level ``alpha``, tolerance (loss units) and
   relative block size ``rho`` (:mod:`satcore.verdicts`): a candidate qualifies
   when its fold test calls it *improvable* and its predicted first-order gain
   ``rho ||z||_S V`` is above the tolerance; the best one (largest predicted
   gain) gets the block;
3. inserts a zero-output block there (the grown model computes what the old
   one did, so the loss right after insertion equals the loss before) and calls
   the user's ``train(model, round)``, which trains it and returns it;
4. logs the round (JSON lines: depth, candidates with their tests, where the
   block went, losses before and after, seconds) and checkpoints the weights.

Enlarging the probe.  With ``first_look_batches=b``, a round probes the first
``b`` batches of ``probe_data`` and, while it is inconclusive, goes on over the
next ones (the incremental :class:`~.probe.Probe`: nothing is probed twice),
to twice as many batches each time, up to all of them (sizes fixed in
advance, so that the level holds).  The level is split over the
looks that schedule can take before the first one (:func:`satcore.verdicts.look_schedule`:
half of ``alpha`` at the look that holds every batch, the other half shared by
the looks before it), so the round's chance of a false verdict stays at most
``alpha`` although it looks more than once; ``look_alpha`` in the log is the
level of the round's last look.  Rounds with
a strong signal then stop at ``b`` batches, and weak ones are decided on more.

It stops with a stated reason: ``saturated`` (every candidate certified below
the tolerance), ``inconclusive`` (no candidate qualifies but some are not
certified either: the log gives the probe size estimated to decide them),
``no gain above tolerance`` (improvable candidates whose predicted gain is
below the tolerance), ``max_depth`` or ``max_rounds``.

Resuming.  With ``log_path``, a run that stopped (or was killed) after round
``k`` resumes from its log: the logged insertions are replayed on ``model``
(``insert_block`` is deterministic in its seed), the weights written by the
last round that inserted a block are loaded (``torch.load(weights_only=True)``:
no pickled code) and the loop goes on with round ``k + 1``; a log whose run
had stopped returns that trained model as it was.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from satcore.verdicts import look_schedule

from .locate import find_blocks
from .native import insert_block
from .probe import Probe, call_model, probe

SATURATED, INCONCLUSIVE, NO_GAIN, MAX_DEPTH, MAX_ROUNDS = (
    "saturated", "inconclusive", "no gain above tolerance", "max_depth", "max_rounds")


@dataclass(frozen=True)
class GrowthRound:
    """One round of :func:`grow_until_saturated` (one JSON line of its log)."""

    round: int
    depth: int
    seed: int
    verdict: str
    candidates: list
    inserted_at: str | None
    train_loss_before: float
    heldout_loss_before: float | None
    loss_after_insert: float | None
    train_loss_after: float | None
    heldout_loss_after: float | None
    probe_seconds: float
    train_seconds: float | None
    stop_reason: str | None = None
    probe_samples: int | None = None
    probe_looks: int = 1
    look_alpha: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GrowthResult:
    """The grown model, every round, and why the loop stopped."""

    model: nn.Module
    rounds: tuple[GrowthRound, ...]
    stop_reason: str
    log_path: str | None = field(default=None)

    @property
    def depth(self) -> int:
        return len(find_blocks(self.model))


def mean_loss(model: nn.Module, data, loss_fn) -> float:
    """Mean per-sample loss of ``model`` over ``(inputs, targets)`` batches, in eval mode, no gradients."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, targets in data:
            losses = loss_fn(call_model(model, inputs), targets)
            total += float(losses.double().sum())
            count += int(losses.numel())
    model.train(was_training)
    return total / count


def _candidate_rows(report) -> list:
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


def _choose(report, tolerance: float):
    """``(candidate or None, stop reason or None)`` from a report (module docstring, step 2)."""
    if report.verdict.verdict == SATURATED:
        return None, SATURATED
    improvable = [t for t in report.tests if t.verdict == "improvable"]
    qualified = [t for t in improvable if t.predicted_gain is not None and t.predicted_gain.value > tolerance]
    if qualified:
        return max(qualified, key=lambda t: t.predicted_gain.value).name, None
    return None, NO_GAIN if improvable else INCONCLUSIVE


def _probe_round(model, probe_data, loss_fn, *, seed, alpha, tolerance, rho, first_look_batches, options):
    """``(report, samples probed, looks taken, level of the last look)`` of one round (module docstring)."""
    config = dict(family="native", seed=seed, split="probe", **options)
    if first_look_batches is None:
        report = probe(model, probe_data, loss_fn, **config).report(alpha=alpha, tolerance=tolerance, rho=rho)
        return report, _samples(report), 1, alpha
    try:
        total = len(probe_data)
    except TypeError:
        raise TypeError("first_look_batches needs probe_data with a len() (a list, a DataLoader): the looks are "
                        "planned from the number of batches") from None
    schedule = look_schedule(first_look_batches, total, alpha)
    bar = None
    if config.pop("progress", False):
        from tqdm.auto import tqdm

        bar = tqdm(unit="sample", desc="probe")
    state, stream = Probe(model, loss_fn, **config), iter(probe_data)  # streamed: one pass, as probe() does

    def report_at(n_batches, level):
        for batch in itertools.islice(stream, n_batches - state.batches_done):
            samples = state.update(batch)
            if bar is not None:
                bar.update(samples)
        return state.result().report(alpha=level, tolerance=tolerance, rho=rho)

    try:
        report, used, looks = schedule.enlarge(report_at)
    finally:
        if bar is not None:
            bar.close()
    return report, _samples(report), looks, schedule.alpha_at(used)


def _samples(report) -> int:
    return max(c.n_samples for c in report.candidates)


def _read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _weights_path(log_path: Path, round_index: int) -> Path:
    return log_path.with_name(f"{log_path.name}.round{round_index}.pt")


def grow_until_saturated(
    model: nn.Module,
    train,
    probe_data,
    loss_fn,
    *,
    heldout_data=None,
    train_data=None,
    tolerance: float,
    rho: float = 0.01,
    alpha: float = 0.05,
    max_depth: int | None = None,
    max_rounds: int = 10,
    seed: int = 0,
    zero: str = "terminal",
    first_look_batches: int | None = None,
    log_path=None,
    **probe_options,
) -> GrowthResult:
    """Rounds of probe -> decide -> insert -> train until the evidence says stop (module docstring).

    Parameters
    ----------
    model : nn.Module
        The trained model; not modified (each insertion makes a new model).
    train : callable
        ``train(model, round) -> model``: trains the grown model for the round's budget.
    probe_data : iterable of (inputs, targets)
        The probe split (independent of training: the tests assume it).
    loss_fn : callable
        Per-sample loss ``loss_fn(outputs, targets) -> (B,)`` (as for :func:`~.probe.probe`).
    heldout_data, train_data : iterables of (inputs, targets), optional
        Where the realized held-out and training losses are measured each round
        (without ``train_data`` the "training" loss logged is the probe split's).
    tolerance : float
        Loss units: a gain of at most this, by a block of relative size ``rho``,
        does not matter (:func:`satcore.verdicts.decide`).
    rho, alpha : float
        Relative block size ``||h||_S / ||z||_S`` and the tests' level.
    max_depth, max_rounds : int
        Budgets: blocks in the model, rounds run.
    seed : int
        Round ``k`` probes and inserts with seed ``seed * 1000 + k``.
    zero : str
        Passed to :func:`~.native.insert_block`.
    first_look_batches : int, optional
        Start each round's probe with this many batches of ``probe_data`` and
        enlarge it while inconclusive (module docstring, Enlarging the probe);
        ``None``: every batch, one look at ``alpha``.  ``probe_data`` then needs
        a ``len()``; it is streamed, not held in memory.  Give at least one batch
        per fold (16) for the first look to have full resolution.
    log_path : path, optional
        JSON-lines log; the weights of each round go beside it; an existing log is resumed.
    **probe_options
        Passed to :func:`~.probe.probe` (``candidates``, ``mask``, ``batch_dtype``, ...).
    """
    measure_train = train_data if train_data is not None else probe_data
    rounds: list[GrowthRound] = []
    log = Path(log_path) if log_path is not None else None
    start_round = 0
    if log is not None:
        for entry in _read_log(log):
            if entry["inserted_at"] is not None:
                model = insert_block(model, entry["inserted_at"], seed=entry["seed"], zero=zero)
            rounds.append(GrowthRound(**entry))
        if rounds:
            last = rounds[-1].round
            trained = [r.round for r in rounds if r.inserted_at is not None]
            if trained:  # the last round that inserted and trained wrote the weights (a stop round writes none)
                weights = _weights_path(log, trained[-1])
                if not weights.exists():
                    raise FileNotFoundError(f"{weights}: the weights of logged round {trained[-1]} are missing; "
                                            f"cannot resume {log}")
                model.load_state_dict(torch.load(weights, weights_only=True))
            if rounds[-1].stop_reason is not None:  # the logged run had stopped: nothing left to do
                return GrowthResult(model, tuple(rounds), rounds[-1].stop_reason, str(log))
            start_round = last + 1
    stop = MAX_ROUNDS
    for k in range(start_round, max_rounds):
        depth = len(find_blocks(model))
        round_seed = seed * 1000 + k
        began = time.perf_counter()
        report, samples, looks, look_alpha = _probe_round(
            model, probe_data, loss_fn, seed=round_seed, alpha=alpha, tolerance=tolerance, rho=rho,
            first_look_batches=first_look_batches, options=probe_options)
        probe_seconds = time.perf_counter() - began
        at, reason = _choose(report, tolerance)
        if at is not None and max_depth is not None and depth >= max_depth:
            at, reason = None, MAX_DEPTH
        before = mean_loss(model, measure_train, loss_fn)
        held_before = None if heldout_data is None else mean_loss(model, heldout_data, loss_fn)
        entry = dict(round=k, depth=depth, seed=round_seed, verdict=report.verdict.verdict,
                     candidates=_candidate_rows(report), inserted_at=at, train_loss_before=before,
                     heldout_loss_before=held_before, loss_after_insert=None, train_loss_after=None,
                     heldout_loss_after=None, probe_seconds=probe_seconds, train_seconds=None,
                     probe_samples=samples, probe_looks=looks, look_alpha=look_alpha)
        if at is None:
            entry["stop_reason"] = reason
            rounds.append(GrowthRound(**entry))
            _append(log, rounds[-1])
            stop = reason
            break
        model = insert_block(model, at, seed=round_seed, zero=zero)
        entry["loss_after_insert"] = mean_loss(model, measure_train, loss_fn)
        began = time.perf_counter()
        model = train(model, k)
        entry["train_seconds"] = time.perf_counter() - began
        entry["train_loss_after"] = mean_loss(model, measure_train, loss_fn)
        entry["heldout_loss_after"] = None if heldout_data is None else mean_loss(model, heldout_data, loss_fn)
        rounds.append(GrowthRound(**entry))
        if log is not None:
            _save_weights(model, _weights_path(log, k))
        _append(log, rounds[-1])
    return GrowthResult(model, tuple(rounds), stop, None if log is None else str(log))


def _append(log: Path | None, entry: GrowthRound) -> None:
    if log is None:
        return
    with open(log, "a") as f:
        f.write(json.dumps(entry.to_dict()) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _save_weights(model: nn.Module, path: Path) -> None:
    partial = path.with_name(path.name + ".part")
    torch.save(model.state_dict(), partial)
    os.replace(partial, path)
