"""The keywords the options objects replaced: a call that still passes one is told where it went.

The options travel as one frozen object (``DecisionPolicy``, ``GrowthOptions``, ``ExpansionOptions``, an
adapter's ``ProbeConfig``); docs/api.md's "Options" table maps each earlier keyword to its place.
:data:`MOVED_KEYWORDS` is that table as data, one entry per function (the same for every framework's function
of that name); :func:`moved_keywords` applies an entry to a function.  It only translates the error: a moved
keyword is never accepted (none of them is a parameter of the function it decorates, checked when decorated),
and any other unknown keyword keeps Python's own message.  A keyword a callback holds as a class attribute (its
``prefix``, HFCallback's ``eval_prefix``: keywords once; ``LightningCallback``'s ``log_candidates``, HFCallback's
keyword) is answered by one line, named at the class's own decorator: set it on a subclass or the instance.

Examples
--------
>>> @moved_keywords("decide")
... def decide(model, train, heldout, loss_fn=None, *, recipe=None, policy=None):
...     return policy
>>> decide(None, [], [], recipe=None, max_trials=2)
Traceback (most recent call last):
...
TypeError: decide() no longer takes max_trials=: pass policy=DecisionPolicy(recipe, trials=TrialSettings(max_trials=2)); see docs/api.md#options
"""

from __future__ import annotations

import functools
import inspect

from .numbers import shown_value

OPTIONS_DOC = "docs/api.md#options"
_PROBE_FIELDS = ("family", "n_features", "init_std", "variance", "position_subsample", "mask", "batch_dtype",
                 "split", "curvature")

_DECIDE_PROBE = {k: "pass policy=DecisionPolicy(recipe, probe=ProbeConfig({k}={v}))" for k in _PROBE_FIELDS}
_CALLBACK_PROBE = {k: "pass config=ProbeConfig({k}={v})" for k in (*_PROBE_FIELDS, "candidates", "head")}

#: function name -> {earlier keyword -> what to do instead}; ``{k}`` is the keyword, ``{v}`` the value given
#: (a number, a short string or ``None``; ``...`` for anything else)
MOVED_KEYWORDS: dict[str, dict[str, str]] = {
    "decide": {
        **{k: "pass policy=DecisionPolicy(recipe, trials=TrialSettings({k}={v}))"
           for k in ("max_trials", "schedule", "calibration", "groups")},
        **{k: "pass policy=DecisionPolicy(recipe, {k}={v})"
           for k in ("candidates", "seed", "max_statistics_bytes", "trials")},
        "head": "name it among the places: policy=DecisionPolicy(recipe, candidates=[..., 'head'])",
        **_DECIDE_PROBE,
    },
    "grow_until_saturated": {
        "tolerance": "pass options=GrowthOptions(GrowthCriteria(tolerance={v}))",
        **{k: "pass options=GrowthOptions(GrowthCriteria(tolerance=..., {k}={v}))" for k in ("rho", "alpha")},
        **{k: "pass options=GrowthOptions(budget=GrowthBudget({k}={v}))" for k in ("max_depth", "max_rounds")},
        **{k: "pass options=GrowthOptions({k}={v})"
           for k in ("guard", "seed", "first_look_batches", "zero", "log_path", "progress")},
        **{k: "pass options=GrowthOptions(probe=ProbeConfig({k}={v}))" for k in (*_PROBE_FIELDS, "candidates")},
        "recipe": "pass policy=DecisionPolicy(recipe) (each round decided by decide under it)",
        "decide_options": "pass policy=DecisionPolicy(recipe, trials=TrialSettings(...))",
        "decide": "pass policy= (a DecisionPolicy, or your callable decide(model, seed) itself)",
    },
    "callback": {"decide": "pass policy=DecisionPolicy(recipe), train_data=train", **_CALLBACK_PROBE},
    "expand": {
        **{k: "pass policy=DecisionPolicy(recipe, {k}={v})" for k in ("seed", "max_statistics_bytes")},
        **_DECIDE_PROBE,
        **{k: "pass options=ExpansionOptions({k}={v})"
           for k in ("at", "init", "train_new_only", "max_blocks", "decision", "layout", "budget")},
    },
}


def _shown(value) -> str:
    if value is None or isinstance(value, (bool, int, float, str)):
        text = shown_value(value) if not isinstance(value, str) else repr(value)
        return text if len(text) <= 40 else "..."
    return "..."


def moved_keywords(table: str, class_attributes: tuple[str, ...] = ()):
    """Decorator: a call of the function with a keyword of ``MOVED_KEYWORDS[table]`` raises one ``TypeError``
    naming the keyword and its replacement (module docstring); the function's signature and docstring are kept
    (:func:`functools.wraps`).  Refused when decorating: a moved keyword the function still takes, or a
    ``**kwargs`` (which would accept one).

    Parameters
    ----------
    table : str
        The entry of :data:`MOVED_KEYWORDS`.
    class_attributes : tuple of str
        The class attributes of the decorated ``__init__``'s class that a call might pass as keywords (once
        keywords, or its siblings' keywords): a call passing one is told "takes ... as a class attribute".
    """
    moved = MOVED_KEYWORDS[table]

    def decorate(function):
        parameters = inspect.signature(function).parameters
        taken = sorted((set(moved) | set(class_attributes)) & set(parameters))
        if taken or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            raise AssertionError(f"{function.__qualname__}: takes moved keyword(s) {taken} or **kwargs")
        name = function.__qualname__.removesuffix(".__init__")

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            for keyword in kwargs:
                if keyword in class_attributes:
                    raise TypeError(f"{name}() takes {keyword} as a class attribute, not a keyword: set "
                                    f"{keyword} = {_shown(kwargs[keyword])} on a subclass or the instance; "
                                    f"see help({name})")
                if keyword in moved:
                    instead = moved[keyword].format(k=keyword, v=_shown(kwargs[keyword]))
                    raise TypeError(f"{name}() no longer takes {keyword}=: {instead}; see {OPTIONS_DOC}")
            return function(*args, **kwargs)

        return wrapper

    return decorate
