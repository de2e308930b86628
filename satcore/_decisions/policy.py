"""How a trial decision is made: one frozen object that every entry point of the decision takes.

``decide`` (torch and Keras), both ``grow_until_saturated`` (``policy=``: each round decided by
``decide``), the training-loop callbacks (``HFCallback``, ``LightningCallback``) and torch
``expand`` read the decision's options from a :class:`DecisionPolicy`, never from loose
keywords: the recipe the block will be trained with, how the trials are planned
(:class:`~satcore._decisions.trial_loop.TrialSettings`), the places, the seed, the probe's
statistics budget and the probe's own options.  Each constraint is declared once, here (or in
the object a field holds), and checked when the policy is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .._shared.errors import InputError
from .._shared.numbers import MAX_COUNT, MAX_SEED, whole_number
from .recipe import Recipe
from .trial_loop import TrialSettings

def check_probe_options(value, what: str) -> None:
    """Refuse ``value`` unless it is an adapter's frozen probe options (an instance of a frozen dataclass, such as
    ``satcore.adapters.torch.ProbeConfig``): a dict of options is not one."""
    if not (dataclasses.is_dataclass(value) and not isinstance(value, type)
            and type(value).__dataclass_params__.frozen):
        raise InputError(f"{what} must be an adapter's frozen probe options (e.g. "
                         f"satcore.adapters.torch.ProbeConfig), got {type(value).__name__}")


@dataclass(frozen=True)
class DecisionPolicy:
    """The options of a trial decision (:func:`satcore.adapters.torch.decide` and the functions that run it).

    Parameters
    ----------
    recipe : Recipe
        How the user will train the inserted block; the trials together take at most its steps.
    trials : TrialSettings
        How many candidates are verified by a trial, by which schedule (``"even"`` or ``"halving"``),
        under which calibration, spread over which groups; default ``TrialSettings()`` (4 trials, the
        even plan, the shipped calibration).
    candidates : ``None`` or names of places
        The places the decision probes and trials.  ``None``: every block the adapter finds and the
        head.  Names: exactly those (module or layer names); ``"head"`` among them adds the head (the
        output of the last named module), which is otherwise left out.
    seed : int
        Seeds the probe's feature maps and the trials' minibatch order, ``0 .. 2**63 - 1``.
    max_statistics_bytes : int, optional
        The most probe statistics (both splits' sums) held at once: the candidates are then probed in
        consecutive groups that fit (torch); at least 1.
    probe : frozen probe options, optional
        The probe's own options as the adapter's frozen object (``satcore.adapters.torch.ProbeConfig``,
        ``satcore.adapters.tensorflow.ProbeConfig``: ``family``, ``n_features``, ``mask``,
        ``position_subsample``, ``batch_dtype``, ...); ``None``: the adapter's defaults.  Its places and
        seed are the policy's: a probe that names ``candidates`` or sets ``head=False`` is refused.

    Examples
    --------
    >>> from satcore import DecisionPolicy, Recipe, TrialSettings
    >>> policy = DecisionPolicy(Recipe("adam", lr=1e-3, steps=300, batch_size=128),
    ...                         trials=TrialSettings(max_trials=2, schedule="halving"), candidates=["layer1", "head"])
    >>> policy.candidates, policy.trials.max_trials, policy.seed
    (('layer1', 'head'), 2, 0)
    >>> policy.with_seed(7).seed
    7
    >>> DecisionPolicy(policy.recipe, seed=-1)
    Traceback (most recent call last):
    ...
    satcore._shared.errors.InputError: policy: seed: -1 is not in the range 0..9223372036854775807
    """

    recipe: Recipe
    trials: TrialSettings = field(default_factory=TrialSettings)
    candidates: tuple[str, ...] | None = None
    seed: int = 0
    max_statistics_bytes: int | None = None
    probe: object = None

    def __post_init__(self):
        if not isinstance(self.recipe, Recipe):
            raise InputError(f"policy: recipe must be a satcore.Recipe, got {type(self.recipe).__name__}")
        if not isinstance(self.trials, TrialSettings):
            raise InputError(f"policy: trials must be a satcore.TrialSettings, got {type(self.trials).__name__}")
        if self.candidates is not None:
            if isinstance(self.candidates, (str, bytes)) or not all(isinstance(c, str) for c in self.candidates):
                raise InputError(f"policy: candidates must be None or a list of place names, got "
                                 f"{self.candidates!r:.80}")
            object.__setattr__(self, "candidates", tuple(self.candidates))
        object.__setattr__(self, "seed", whole_number(self.seed, "policy: seed", 0, MAX_SEED))
        if self.max_statistics_bytes is not None:
            object.__setattr__(self, "max_statistics_bytes",
                               whole_number(self.max_statistics_bytes, "policy: max_statistics_bytes", 1, MAX_COUNT))
        if self.probe is not None:
            check_probe_options(self.probe, "policy: probe")
            if getattr(self.probe, "candidates", None) is not None or getattr(self.probe, "head", True) is False:
                raise InputError("policy: probe: the places are the policy's; give them as "
                                 "DecisionPolicy(candidates=[...]) (\"head\" among them for the head), not in the "
                                 "probe's candidates or head")

    @classmethod
    def of(cls, recipe: Recipe | None = None, policy: "DecisionPolicy | None" = None, *,
           by: str = "decide") -> "DecisionPolicy":
        """The policy a call gives: ``policy``, or ``DecisionPolicy(recipe)`` for the shorthand ``recipe=``; both or
        neither is refused (``by`` names the call)."""
        if policy is not None and recipe is not None:
            raise InputError(f"{by}: give recipe= (the shorthand of DecisionPolicy(recipe=...)) or policy=, not both")
        if policy is None:
            if recipe is None:
                raise InputError(f"{by}: give recipe=satcore.Recipe(...) or policy=satcore.DecisionPolicy(...)")
            return cls(recipe)
        if not isinstance(policy, cls):
            raise InputError(f"{by}: policy must be a satcore.DecisionPolicy, got {type(policy).__name__}")
        return policy

    def with_seed(self, seed: int) -> "DecisionPolicy":
        """The same policy under another seed (a growth round's)."""
        return dataclasses.replace(self, seed=seed)


__all__ = ["DecisionPolicy", "check_probe_options"]
