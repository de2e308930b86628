"""What the training-loop callbacks (``HFCallback``, ``LightningCallback``) share: their settings read and checked
when they are built, their places found when training starts, and an evaluation's probe, report and decision
(the scalars they log of it are :func:`satcore.adapters.base.callback_scalars`, the Keras callback's too)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from satcore import DecisionPolicy, InputError
from satcore.adapters.base import ProgressCounter, require_reiterable
from satcore.adapters.callback_dumps import CallbackDumps

from .checkpoint import model_fingerprint
from .decide import decide_under, decision_probe_options
from .input_bounds import check_trial_steps
from .locate import locate_candidates
from .probe import ProbeConfig, probe, unwrap_data_parallel


@dataclass(frozen=True)
class CallbackDecision:
    """What a training-loop callback decides with at an evaluation: the policy (:class:`satcore.DecisionPolicy`),
    the training batches its trials draw from, and the probe settings the decision shares with the callback's
    probe where the policy sets none (its places, their family and features: :data:`CALLBACK_SHARED`), so that
    its decisions and its first-order keys are of the same places."""

    policy: DecisionPolicy
    train: object
    defaults: ProbeConfig


def callback_settings(by: str, probe_data, config: ProbeConfig | None, policy, train_data):
    """``(ProbeConfig, CallbackDecision or None)`` of a callback built as ``by(probe_data, ..., config=, policy=,
    train_data=)``: the probe data is the ``heldout`` split unless the config's ``split`` says otherwise; data it
    cannot read at every evaluation and a decision that cannot run are refused here, before
    training."""
    config = ProbeConfig() if config is None else config
    if not isinstance(config, ProbeConfig):
        raise InputError(f"{by}: config must be a satcore.adapters.torch.ProbeConfig, got {type(config).__name__}")
    if config.checkpoint is not None:  # it resumes one probe of fixed weights: the second evaluation's would differ
        raise InputError(f"{by}: config.checkpoint resumes one probe of one model's weights, and each evaluation "
                         f"probes new weights (the second would be refused as another model's); leave it out and "
                         f"give {by}(dump_dir=FOLDER) for a dump of each evaluation")
    if config.split is None:  # the probe data is held out from training (the tests assume it)
        config = dataclasses.replace(config, split="heldout")
    require_reiterable(probe_data, f"{by}'s probe_data")
    if policy is None:
        if train_data is not None:
            raise InputError(f"{by}: train_data= is what a decision's trials train on; give policy= with it")
        return config, None
    if not isinstance(policy, DecisionPolicy):
        raise InputError(f"{by}: policy must be a satcore.DecisionPolicy, got {type(policy).__name__}")
    if train_data is None:
        raise InputError(f"{by}: policy= needs train_data= (the training batches the trials draw from)")
    require_reiterable(train_data, f"{by}'s train_data")
    check_trial_steps(policy.recipe)
    return config, CallbackDecision(policy, train_data, ProbeConfig(**{k: getattr(config, k) for k in CALLBACK_SHARED}))


def callback_places(model, config: ProbeConfig, decision: CallbackDecision | None) -> tuple[list, list | None]:
    """``(probe's candidate names, the decisions' or None)`` in ``model``: found when training starts, so that a
    candidate the model does not have is refused before the first step rather than at an evaluation."""
    model = unwrap_data_parallel(model)
    names = [c.name for c in locate_candidates(model, config.candidates, head=config.head)]
    if decision is None:
        return names, None
    places = decision_probe_options(decision.policy, decision.defaults)  # as decide reads them
    return names, [c.name for c in locate_candidates(model, places["candidates"], head=places["head"])]


# the callback's probe settings its decisions share unless the policy sets them: the places, their family and features
CALLBACK_SHARED = ("candidates", "family", "head", "mask", "n_features", "position_subsample", "batch_dtype",
                   "init_std")


def callback_report(model, probe_data, loss_fn, config: ProbeConfig, report_options: dict,
                    decision: CallbackDecision | None, progress: bool = False, dump=None):
    """The report of a callback's evaluation: the probe of ``probe_data`` reported with ``report_options`` and,
    with a ``decision`` (:func:`callback_settings`), leading with the decision
    (:func:`satcore.adapters.torch.decide` on ``model`` with the callback's probe data as the held-out split,
    under a fork of the random number generators, so that the run it is called from draws the same numbers as
    without it: its dropout masks, its data order).  ``progress``: the probe shows its tqdm bar on stderr, and the
    decision ``decide``'s (the callbacks pass it where the training loop shows its own bars: the probe of an
    evaluation split can take several times the evaluation, and a decision minutes).  ``dump``: called with the
    probe's :class:`~.result.ProbeResult` before any decision (:func:`dump_writer`)."""
    result = probe(model, probe_data, loss_fn, config=config, progress=progress)
    if dump is not None:
        dump(result)
    report = result.report(**report_options)
    if decision is None:
        return report
    with ProgressCounter(progress) as counter:
        decided = decide_under(unwrap_data_parallel(model), decision.train, probe_data, loss_fn,
                               decision.policy, decision.defaults, progress=counter)
    return dataclasses.replace(report, decision=decided)


def dump_writer(dumps: CallbackDumps, model, config: ProbeConfig, **where):
    """``callback_report``'s ``dump`` for the callback's folder ``dumps`` (the callbacks pass one on the process
    that writes them): it writes the probe's result as the dump of the evaluation at ``where`` (``step=``,
    ``epoch=``: its name and ``meta.callback``), recording what reproduces it: the probe's config
    (:func:`~satcore.adapters.callback_dumps.config_record`) and the model's :func:`~.checkpoint.model_fingerprint`
    (the weights probed, as a probe checkpoint records them)."""

    def write(result):
        dumps.write(result, config, model_fingerprint(unwrap_data_parallel(model)), **where)

    return write
