"""What the training-loop callbacks (``HFCallback``, ``LightningCallback``) share: their settings read and checked
when they are built, their places found when training starts, and an evaluation's probe, report and decision."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator, Mapping

from satcore.adapters.base import resolve_options
from satcore import InputError
from satcore.adapter_api import family_spec
from satcore import Recipe

from .decide import PROBE_OPTION_NAMES, check_decide_arguments, decide
from .locate import decision_places, locate_candidates
from .probe import ProbeConfig, probe, unwrap_data_parallel


def callback_settings(by: str, probe_data, decide_options, config: ProbeConfig | None, options: dict):
    """``(ProbeConfig, decide options or None)`` of a callback built as ``by(probe_data, ..., decide=, config=,
    **options)``: the probe data is the ``heldout`` split unless ``split=`` says otherwise; data it cannot read at
    every evaluation, a misspelt family and a ``decide=`` that cannot run are refused here, before training."""
    config = resolve_options(ProbeConfig, config, **options)
    if config.split is None:  # the probe data is held out from training (the tests assume it)
        config = dataclasses.replace(config, split="heldout")
    require_reiterable(probe_data, f"{by}'s probe_data")
    check_family_name(config.family, by)
    return config, callback_decide_options(decide_options, by, config)


def callback_places(model, config: ProbeConfig, decide_options) -> tuple[list, list | None]:
    """``(probe's candidate names, the decisions' or None)`` in ``model``: found when training starts, so that a
    candidate the model does not have is refused before the first step rather than at an evaluation."""
    model = unwrap_data_parallel(model)
    names = [c.name for c in locate_candidates(model, config.candidates, head=config.head)]
    if decide_options is None:
        return names, None
    places = decision_places(decide_options["candidates"], decide_options["head"])  # as decide reads them
    return names, [c.name for c in locate_candidates(model, places["candidates"], head=places["head"])]


# decide's arguments a callback supplies itself: the model it is handed, its probe data as the held-out split, its loss
CALLBACK_SUPPLIED = ("model", "heldout", "loss_fn")
# the callback's probe settings its decisions share unless decide= sets them: the places, their family and features
CALLBACK_SHARED = ("candidates", "family", "head", "mask", "n_features", "position_subsample", "batch_dtype",
                   "init_std")


def require_reiterable(data, what: str) -> None:
    """Refuse ``data`` that a callback cannot read at every evaluation: a one-shot iterator (a generator), which
    the first evaluation would exhaust, or an empty sequence."""
    if isinstance(data, Iterator):  # not iter(data): that would start a DataLoader's worker processes
        raise InputError(f"{what} is a one-shot iterator (a generator?): it is read at every evaluation, so pass a "
                         f"re-iterable such as a list of batches or a DataLoader")
    try:
        empty = len(data) == 0
    except TypeError:  # no length (a DataLoader over an IterableDataset): found empty when read, if it is
        empty = False
    if empty:
        raise InputError(f"{what} holds no batches")


def check_family_name(family, what: str) -> None:
    """Refuse a misspelt family name before any training (a dict, a feature map or a known name passes)."""
    if isinstance(family, str) and family not in ("auto", "native"):
        try:
            family_spec(family)
        except InputError as exc:
            raise InputError(f"{what}: {exc}") from None


def callback_decide_options(options, by: str, config: ProbeConfig) -> dict | None:
    """A training-loop callback's ``decide=`` (``None``: no decision) as :func:`callback_decision` passes it on: a
    mapping of :func:`decide`'s keyword arguments holding at least ``train`` (the training batches the trials draw
    from, re-iterable) and ``recipe``; the model, the held-out split (the callback's probe data) and ``loss_fn`` are
    the callback's, and the callback's probe settings :data:`CALLBACK_SHARED` (``config``: its candidates, family,
    ...) hold unless ``decide=`` sets them, so its decisions and its first-order keys are of the same places.
    Refused here, when the callback is built, rather than at the first evaluation."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise TypeError(f"{by}(decide=...) takes a dict of decide's keyword arguments, got {type(options).__name__}")
    options = dict(options)
    if taken := sorted(set(options) & set(CALLBACK_SUPPLIED)):
        raise TypeError(f"{by}(decide=...): {', '.join(map(repr, taken))} {'is' if len(taken) == 1 else 'are'} the "
                        f"callback's own (the model it is handed, its probe data as the held-out split, its "
                        f"loss_fn); leave {'it' if len(taken) == 1 else 'them'} out")
    needs = {"train": "'train' (the training batches the trials draw from)",
             "recipe": "'recipe' (the satcore.Recipe the trials train with)"}
    if missing := [needs[k] for k in needs if k not in options]:
        raise TypeError(f"{by}(decide=...) needs {' and '.join(missing)}")
    if not isinstance(options["recipe"], Recipe):
        raise TypeError(f"{by}(decide=...): 'recipe' must be a satcore.Recipe, got {type(options['recipe']).__name__}")
    known = set(inspect.signature(decide).parameters) - set(CALLBACK_SUPPLIED) - {"probe_options"}
    if unknown := sorted(set(options) - known - PROBE_OPTION_NAMES):
        raise TypeError(f"{by}(decide=...) got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; it "
                        f"takes decide's: {', '.join(sorted(known | PROBE_OPTION_NAMES))}")
    require_reiterable(options["train"], f"{by}(decide=...)'s 'train'")
    checked = ("recipe", "schedule", "max_trials", "seed", "max_statistics_bytes")
    try:
        check_decide_arguments(**{k: options[k] for k in checked if k in options})
    except InputError as exc:
        raise InputError(f"{by}(decide=...): {str(exc).removeprefix('decide: ')}") from None
    if "family" in options:  # the callback's own family was checked with its settings
        check_family_name(options["family"], f"{by}(decide=...)")
    return {k: getattr(config, k) for k in CALLBACK_SHARED} | options


def callback_report(model, probe_data, loss_fn, config: ProbeConfig, report_options: dict, decide_options,
                    prefix: str):
    """``(report, scalars)`` of a callback's evaluation: the probe of ``probe_data`` reported with
    ``report_options`` and, with ``decide_options`` (:func:`callback_decide_options`), the decision it leads with
    (:func:`callback_decision`); its scalars (``prefix``) those of the two."""
    report = probe(model, probe_data, loss_fn, config=config).report(**report_options)
    scalars = report.scalars(prefix)
    if decide_options is not None:
        decision = callback_decision(unwrap_data_parallel(model), probe_data, loss_fn, decide_options)
        report = dataclasses.replace(report, decision=decision)
        scalars |= decision.scalars(prefix)
    return report, scalars


def callback_decision(model, heldout, loss_fn, options: dict):
    """:func:`decide` as a callback runs it at an evaluation: on ``model`` with the callback's probe data as the
    held-out split, under a fork of the random number generators, so that the run it is called from draws the same
    numbers as without it (its dropout masks, its data order)."""
    options = dict(options)
    train = options.pop("train")
    return decide(model, train, heldout, loss_fn, **options)  # decide forks the generators itself
