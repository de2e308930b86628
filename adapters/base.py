"""What every adapter is, framework-free: the probe contract, its shared options, split check and meta.

An adapter turns a model of its framework into the core's statistics
(docs/adapters.md).  Whatever the framework, it offers

* a ``Probe(model, ...)`` implementing :class:`Probe` (the core's contract,
  :class:`satcore.adapter_api.Probe`, whose docstring is the spec): ``update(batch)``
  adds one batch's sums and returns its samples, ``batches_done`` counts the batches,
  ``result()`` returns a :class:`satcore.ProbeResult` at any point, and the probe goes on
  after it; a batch it cannot use raises a :class:`satcore.ModelOnDataError`
  (:func:`refusing_bad_batch`), never the framework's own exception;
* ``probe(model, data, ...)``: a ``Probe`` fed every batch of ``data``, then its result;
* its options as a frozen dataclass derived from :class:`ProbeOptions`, the options
  every adapter takes and resolves alike (:mod:`.options`), built from keywords or
  given whole as ``config=`` (:func:`resolve_options`);
* :func:`warn_if_training_split` when the probe data is named a training split, and
  :func:`probe_meta` for the provenance its result records.

Per batch the adapter computes, on its device, per candidate: the per-sample gradients
``q_i = d loss_i / d z_i`` (of a per-sample loss; a batch mean is multiplied back),
the features ``psi(z_i)`` of the registered family (:func:`satcore.adapter_api.family_builder`),
and hands the batch's sums as a :class:`satcore.BatchMoments` (``batch_moments``' fields and the
stream sums ``sum_z_sq``, ``n_stream_vectors``, in the framework's own arrays until
converted) to :meth:`satcore.CandidateStatistics.add_moments` of statistics made with
``stream=True``.  ``tests/test_conformance.py`` drives every installed adapter through the
same cases of the contract and holds its statistics to one independent reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from satcore import DecisionPolicy, InputError, ModelOnDataError, ProbeError, SatcoreError
from satcore.adapter_api import (DEFAULT_ALPHA, MAX_SEED, TRAINING_SPLIT_WARNING, Probe, fewest_batches_to_reject,
                                 is_training_split, positive_count, no_batches, read_batches,
                                 whole_number)

from .options import check_family

__all__ = ["SPLIT_DATA", "PolicyDecision", "Probe", "ProbeOptions", "ProgressCounter", "callback_log_candidates",
           "callback_scalars", "callback_schedule", "growth_decision",
           "check_step_range", "loss_name", "probe_meta", "read_split", "refuse_named_twice", "refusing_bad_batch", "require_reiterable", "resolve_options",
           "warn_if_heldout_is_probe", "warn_if_training_split", "weights_fingerprint"]


class ProgressCounter:
    """A long run's progress in one unit (``decide``: batches of work), as a ``progress`` keyword asks for it:
    ``False`` or ``None`` silent, ``True`` a tqdm bar on stderr (tqdm imported here, only then), a callable
    called with each increment instead; anything else one :class:`~satcore.InputError` naming ``what``'s
    ``progress``.  :meth:`close` ends the bar; as a context manager (``with ProgressCounter(progress) as
    counter:``, how each adapter's ``decide`` counts its decision) the bar ends with the block, however it ends."""

    def __init__(self, progress=False, what: str = "decide"):
        if progress is not None and not isinstance(progress, bool) and not callable(progress):
            raise InputError(f"{what}: progress must be True, False or a callable taking each increment, got "
                             f"{progress!r}")
        self.bar = None
        self.advance = None if progress is None or isinstance(progress, bool) else progress
        if progress is True:
            from tqdm.auto import tqdm

            self.bar = tqdm(unit="batch", desc=what)
            self.advance = self.bar.update

    def add(self, count: int = 1) -> None:
        if self.advance is not None:
            self.advance(count)

    def per_batch(self):
        """The callable a probe or an evaluation takes as its ``progress`` (called with each batch's sample count):
        one increment a batch; ``None`` where silent."""
        return None if self.advance is None else (lambda _samples: self.advance(1))

    def phase(self, name: str, remaining: int | None = None) -> None:
        """Name the phase now running on the bar (``"model"``, ``"probe"``, ``"trials"``) and make the bar's total
        what has been counted plus the phase's ``remaining`` increments; ``None`` where the phase cannot know them
        (its data has no length): a count without a total then, not an earlier phase's total."""
        if self.bar is not None:
            self.bar.total = None if remaining is None else self.bar.n + remaining
            # set_description adds ": ", and tqdm adds its own before a count without a total ("model: : 19batch")
            self.bar.set_description_str(name)

    def plan(self, remaining: int) -> None:
        """The bar's total, once ``remaining`` increments are all that is left to come."""
        if self.bar is not None:
            self.bar.total = self.bar.n + remaining
            self.bar.refresh()

    def trials_planned(self, batches_a_reading: int):
        """The callable the core's trial loop announces its plan with (``planned(steps, readings)``,
        :func:`satcore.adapter_api.trial_decision`): the bar's phase becomes ``"trials"`` and its total what is left,
        one increment a step and ``batches_a_reading`` a reading (the batches of every split it reads)."""

        def planned(steps: int, readings: int) -> None:
            self.phase("trials", steps + readings * batches_a_reading)

        return planned

    def extend(self, count: int) -> None:
        """``count`` more increments than the total planned (work the plan could not foresee)."""
        if self.bar is not None and self.bar.total is not None:
            self.bar.total += count
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> ProgressCounter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


@contextlib.contextmanager
def refusing_bad_batch(index: int, framework_errors: tuple, *, passing: tuple = (), where: str = ""):
    """Run the model and the loss on batch ``index`` inside this block: a framework error raised
    there is the batch's (inputs or targets of a shape or dtype they cannot take) and becomes a
    :class:`~satcore.ModelOnDataError` naming the batch and the error's first line, chained to it.

    ``framework_errors``: what the framework raises for such inputs (torch ``RuntimeError``,
    Keras ``ValueError``, ...); ``passing``: subclasses of those that are no fault of the batch
    and propagate unchanged (an accelerator out of memory); ``where``: what the message leads with, naming the
    data the batch is from (``"decide: the held-out data: "``).  A :class:`~satcore.SatcoreError`
    raised inside (a refusal of satcore's own) propagates unchanged.
    """
    try:
        yield
    except SatcoreError:
        raise
    except framework_errors as exc:
        if isinstance(exc, passing):
            raise
        lines = str(exc).strip().splitlines()
        said = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        raise ModelOnDataError(f"{where}batch {index}: the model or loss_fn cannot take it ({said})") from exc


# the largest multiple of the lr an optimizer step applies: Adam's first step, lr / (1 - beta1) with beta1 = 0.9
FIRST_STEP_SCALE = 10.0


def refuse_named_twice(names: list, error: type[ProbeError] = ProbeError) -> None:
    """Raise ``error`` (the adapter's :class:`~satcore.ProbeError`) naming the first candidate that ``names`` gives
    twice, in the same words for every adapter (the names as the user gave them, so the repeat is found in them)."""
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise error(f"candidate {twice!r} is named twice in {names}; name each place once")


def check_step_range(recipe, dtype_name: str, dtype_max: float) -> None:
    """Refuse a ``recipe`` (:class:`satcore.Recipe`) whose optimizer steps do not fit the trained parameters' dtype.

    A step applies ``FIRST_STEP_SCALE * lr`` (Adam's first), ``lr * weight_decay`` and ``weight_decay`` as
    scalars of the parameters' dtype (``dtype_name``, largest finite value ``dtype_max``); one past that range
    stops torch's first step with its overflow error and makes NumPy's (the Keras trials') step infinite, so it is
    refused before the first step, naming the lr (a smaller lr that diverges is the trials' to report).
    """
    step = max(FIRST_STEP_SCALE * recipe.lr, recipe.lr * recipe.weight_decay, recipe.weight_decay)
    if step > dtype_max:
        raise InputError(f"recipe: lr {recipe.lr:g} (weight_decay {recipe.weight_decay:g}) makes optimizer steps of "
                         f"up to {step:g}, past the {dtype_name} parameters' range {dtype_max:g}; lower the lr (--lr)")


# what decide's messages call its two splits (``evaluate``'s keys)
SPLIT_DATA = {"heldout": "decide: the held-out data: ", "train": "decide: the training data: "}


@dataclass(frozen=True)
class ProbeOptions:
    """The options every adapter's probe takes, with the same meaning everywhere.

    Attributes
    ----------
    candidates : ``None`` (the residual blocks the adapter locates) or names of candidate
        locations (module names, layer names or tensor names, as the framework names them).
    family : ``"auto"`` (``conv`` for a 4-d image stream, else ``mlp``), a registered kind
        (:func:`satcore._formulas.families.registered_families`), a :class:`satcore.Family`, a
        framework feature map, or a mapping candidate -> one of those (a candidate it leaves
        out gets ``"auto"``).
    seed : seed of the drawn families' weights (``make_family(kind, width, seed=seed)``).
    init_std : weight scale of the kinds that take one (``mlp``); ``None``: the default.
    variance : also keep ``sum_i X_i^T X_i`` (the debiased growth value).
    split : name of the probe data; a training split warns (:func:`warn_if_training_split`).
    n_features : the drawn families' ``r``: an int, or a mapping candidate -> int.
    """

    candidates: tuple[str, ...] | None = None
    family: object = "auto"
    seed: int = 0
    init_std: float | None = None
    variance: bool = False
    split: str | None = None
    n_features: int | dict | None = None

    def __post_init__(self):
        if self.candidates is not None and not isinstance(self.candidates, tuple):
            object.__setattr__(self, "candidates", tuple(self.candidates))
        check_family(self.family, "probe: family")
        # a decision policy's range: NumPy's generator refused -1 and 1.5 only at the first batch, in its own words
        object.__setattr__(self, "seed", whole_number(self.seed, "probe: seed", 0, MAX_SEED))


def callback_schedule(by: str, what: str, every, report) -> tuple[int, dict]:
    """``(every, report options)`` of the callback ``by`` built with ``<what>=every`` (how often it probes) and
    ``report=`` (keywords of ``report()``): a whole number of at least 1, and ``None`` or a mapping; each refused
    naming the callback and the argument, when the callback is built (a float or True used to pass, a string
    report to fail in ``dict()``'s words)."""
    every = positive_count(every, f"{by}: {what}")
    if report is not None and not isinstance(report, Mapping):
        raise InputError(f"{by}: report must be a mapping of report() keywords, e.g. {{'criteria': "
                         f"satcore.Criteria(alpha=0.01)}}, got {type(report).__name__}")
    return every, dict(report or {})


def is_one_batch(data) -> bool:
    """Whether ``data``, given where an iterable of batches belongs, is one batch instead: a mapping of model inputs
    or a pair ``(inputs, targets)`` of arrays (Keras' ``validation_data=(x, y)`` form), which iterating would read
    as batches of its parts."""
    return isinstance(data, Mapping) or (isinstance(data, tuple) and len(data) == 2 and hasattr(data[0], "shape"))


def read_split(data, what: str) -> list:
    """The batches of one split a decision reads (``what``: its name in a refusal, e.g. ``"decide: the training
    data"``) as a list, read once: one batch in its place (:func:`is_one_batch`), an endless iterator
    (:func:`satcore.adapter_api.read_batches`' bound) and no batches are refused, in every framework's words alike."""
    if is_one_batch(data):
        raise InputError(f"{what} is one batch; pass an iterable of batches, e.g. [batch]")
    batches = read_batches(data, what)
    if not batches:
        raise InputError(no_batches(data, what))
    return batches


def require_reiterable(data, what: str) -> None:
    """Refuse ``data`` that a callback cannot read at every evaluation: one batch (:func:`is_one_batch`, found
    otherwise at the first evaluation, after training), a one-shot iterator (a generator), which the first
    evaluation would exhaust, an empty sequence, or what is no iterable (``None``)."""
    if not isinstance(data, Iterable):
        raise InputError(f"{what}: not an iterable of batches, got {type(data).__name__}")
    if is_one_batch(data):
        raise InputError(f"{what} is one batch (a pair (inputs, targets) or a mapping); pass an iterable of batches, "
                         f"e.g. [batch] or a tf.data.Dataset / DataLoader of them")
    if isinstance(data, Iterator):  # not iter(data): that would start a DataLoader's worker processes
        raise InputError(f"{what} is a one-shot iterator (a generator?): it is read at every evaluation, so pass a "
                         f"re-iterable such as a list of batches, a DataLoader or a tf.data.Dataset")
    if known_length(data) == 0:  # no length (a DataLoader over an IterableDataset): found empty when read, if it is
        raise InputError(f"{what} holds no batches")


def warn_if_too_few_batches(by: str, probe_data, n_candidates: int, report_options: dict) -> None:
    """Warn, when training starts, where ``probe_data`` holds too few batches for the fold test to call any of
    ``n_candidates`` improvable at the ``alpha`` of ``report_options`` (the callback's ``report=``): its
    ``satcore/improvable`` would stay 0 however large the batches."""
    batches = known_length(probe_data)
    alpha = report_options.get("alpha", getattr(report_options.get("criteria"), "alpha", DEFAULT_ALPHA))
    needed = fewest_batches_to_reject(n_candidates, alpha)
    if batches is not None and batches < needed:
        warnings.warn(f"{by}: probe_data holds {batches} batch(es); the fold test over {n_candidates} candidates needs "
                      f"at least {needed} (its folds are made of batches, not samples) to call any candidate "
                      f"improvable, so satcore/improvable stays 0: split it into {needed} or more batches",
                      UserWarning, stacklevel=3)


def warn_if_heldout_is_probe(policy, probe_data, heldout_data) -> None:
    """Warn (``UserWarning``, once per growth run, pointing at the caller of the adapter's
    ``grow_until_saturated``) where ``heldout_data`` is ``probe_data``, the split each round's decision chooses
    on (the first-order probe's, or a ``DecisionPolicy``'s trials' held-out split): the same object, or lists or
    tuples of the same batch objects in any order.  The guard would then read the data the place was chosen on,
    so its held-out change favours the chosen block.  Batches are compared by identity only: comparing tensors'
    values would read both splits whole.  A callable ``policy`` does not read ``probe_data``: no warning."""
    if heldout_data is None or not (policy is None or isinstance(policy, DecisionPolicy)):
        return
    same = probe_data is heldout_data or (
        isinstance(probe_data, (list, tuple)) and isinstance(heldout_data, (list, tuple))
        and len(probe_data) == len(heldout_data) > 0
        and sorted(map(id, probe_data)) == sorted(map(id, heldout_data)))
    if same:
        warnings.warn("grow_until_saturated: heldout_data holds the same batches as probe_data, where each round "
                      "decides its place; the held-out guard then reads the data the place was chosen on and "
                      "favours the chosen block. Pass a held-out split the decision does not read "
                      "(docs/growth.md)", UserWarning, stacklevel=4)


def require_round_data(probe_data, heldout_data=None, train_data=None) -> None:
    """Refuse, before round 1, a split ``grow_until_saturated`` reads every round that it cannot read so
    (:func:`require_reiterable`; ``probe_data`` always, the others where given): a generator would be empty from
    the second round on, ``None`` fail at the first."""
    for name, split in (("probe_data", probe_data), ("heldout_data", heldout_data), ("train_data", train_data)):
        if split is not None or name == "probe_data":
            require_reiterable(split, f"grow_until_saturated's {name}")


def known_length(data) -> int | None:
    """How many batches ``data`` holds where it says (a list, a ``DataLoader``, a ``tf.data.Dataset`` of known
    cardinality); ``None`` where it cannot (a loader over an iterable dataset, whose ``len`` raises)."""
    try:
        return len(data)
    except TypeError:
        return None


def callback_log_candidates(by: str, log_candidates) -> bool:
    """``log_candidates`` of the callback ``by`` (whether it logs the per-candidate keys as well as the depth-wide
    ones, :func:`callback_scalars`): ``True`` or ``False``, refused naming the callback when it is built."""
    if not isinstance(log_candidates, bool):
        raise InputError(f"{by}: log_candidates must be True or False, got {log_candidates!r}")
    return log_candidates


def callback_scalars(report, prefix: str, per_candidate: bool = True) -> dict[str, float]:
    """What a training-loop callback logs of ``report`` (a :class:`satcore.DepthReport`, with its
    :class:`satcore.InsertionDecision` where the callback decides): its :meth:`~satcore.DepthReport.scalars` and
    its decision's (:meth:`~satcore.InsertionDecision.scalars`), keys starting ``prefix``; without
    ``per_candidate`` the depth-wide ones only.  The decision's ``choice_index`` counts the report's candidates,
    the list ``argmax_index`` and ``best_candidate_index`` count, so that every index a callback logs is into one
    list.  One function for every framework's callbacks, so that one decision logs one key set in each."""
    scalars = report.scalars(prefix, per_candidate)
    if report.decision is not None:
        scalars |= report.decision.scalars(prefix, per_candidate, places=[c.name for c in report.candidates])
    return scalars


class PolicyDecision:
    """A growth round's decision under a :class:`satcore.DecisionPolicy`: the adapter's ``decide`` at the round's
    seed, its trials training on ``splits[0]`` and read on ``splits[1]`` (the run's training and probe splits),
    ``progress`` passed on to it (``False``, or a callable of each increment of its batches of work).
    The policy's places, where it names none, are those of the run's ``probe`` (its ``candidates``; torch trials
    the head only where it is named), and its probe options, where it gives none, the run's (the family the
    inserted block is built from)."""

    def __init__(self, decide, policy, splits: tuple, loss_fn, probe: ProbeOptions, progress=False):
        candidates = policy.candidates if policy.candidates is not None else probe.candidates
        own = policy.probe
        if own is None:  # the run's probe without its places (the policy's), as DecisionPolicy takes a probe
            own = replace(probe, candidates=None, **({"head": True} if hasattr(probe, "head") else {}))
        self.decide, self.policy = decide, replace(policy, candidates=candidates, probe=own)
        self.splits, self.loss_fn, self.progress = splits, loss_fn, progress

    def __call__(self, model, seed: int):
        train, heldout = self.splits
        return self.decide(model, train, heldout, self.loss_fn, policy=self.policy.with_seed(seed),
                           progress=self.progress)


def growth_decision(policy, decide, splits: tuple, loss_fn, probe: ProbeOptions, progress=False):
    """How a growth run's rounds decide under its ``policy=``: ``None`` for the first-order probe (the adapter's
    own), a :class:`PolicyDecision` for a :class:`satcore.DecisionPolicy` (``decide``: the adapter's; ``splits``:
    its training and probe splits, the training one needed; ``progress``: its decide's), or the callable
    ``decide(model, seed)`` given."""
    if policy is None:
        return None
    if isinstance(policy, DecisionPolicy):
        if splits[0] is None:
            raise InputError("policy= decides each round with the adapter's decide: it needs train_data (the trials "
                             "train on it)")
        return PolicyDecision(decide, policy, splits, loss_fn, probe, progress)
    if not callable(policy):
        raise InputError(f"policy must be a satcore.DecisionPolicy or a callable decide(model, seed), got "
                         f"{type(policy).__name__}")
    return policy


def resolve_options(cls, config=None, **options):
    """``cls(**options)``, or ``config`` (an instance of ``cls``) with ``options`` replacing its fields:
    how every adapter's ``Probe(model, ..., config=None, **options)`` reads its options."""
    return cls(**options) if config is None else replace(config, **options)


def warn_if_training_split(split: str | None) -> None:
    """Warn (``UserWarning``) when ``split`` names a training split: the finite-sample tests assume a
    probe independent of training.  The warning points at the caller of the adapter's ``Probe`` (stack level 3)."""
    if is_training_split(split):
        warnings.warn(TRAINING_SPLIT_WARNING, UserWarning, stacklevel=3)


def loss_name(loss) -> str:
    """What a result records of the loss: a string as given, ``"model_loss"`` for ``None`` (the model's
    own loss), else the object's ``name`` (Keras), ``__name__`` (a function) or type name."""
    if loss is None:
        return "model_loss"
    if isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def probe_meta(framework: str, model: str, loss, options: ProbeOptions, **extra) -> dict:
    """The provenance every adapter's result records in ``meta`` (the dump's ``meta`` member,
    ``satcore/schemas/dump-meta.schema.json``): ``framework``, ``model`` (a name), ``loss``
    (:func:`loss_name`), the probe data's ``split`` and the families' ``seed``, plus the
    adapter's own fields ``extra``.  ``candidates``, ``family`` and the stream ``diagnostics`` are
    added when the result is written (:meth:`satcore._io.probe_result.ProbeResult.dump_meta`)."""
    return {"framework": framework, "model": model, "loss": loss_name(loss), "split": options.split,
            "seed": options.seed, **extra}


def weights_fingerprint(tensors) -> str:
    """A hash of a model's architecture and weights, cheap to compute: 32 hex digits of the SHA-256 of, for each
    ``(name, shape, dtype, ends)`` of ``tensors`` in order (its parameters and buffers), ``name``, ``shape`` and
    ``dtype`` as text and ``ends``, its first and last four values (all of them where it has at most 8), as float64
    (``None``: a tensor whose values this process cannot read, hashed by name, shape and dtype only).  The other
    values are not read (that would cost a pass over the weights), so two models equal in every name, shape, dtype
    and sampled value are not told apart.  The torch probe's checkpoints and the callbacks' dumps record it."""
    import numpy as np

    digest = hashlib.sha256()
    for name, shape, dtype, ends in tensors:
        digest.update(f"{name}\0{tuple(shape)}\0{dtype}\0".encode())
        if ends is not None:
            digest.update(np.asarray(ends, dtype=np.float64).tobytes())
    return digest.hexdigest()[:32]
