"""Options every adapter resolves the same way (pure Python: no framework is imported).

* :func:`per_candidate`: an option given once for every candidate or as a mapping
  candidate -> value (``family``, ``n_features``);
* :func:`builtin_kind`: which registered family (:func:`satcore._formulas.families.registered_families`)
  a family option names (``"auto"``: ``conv`` for a 4-d image stream, ``mlp`` for vectors and
  tokens);
* :func:`family_record`: what a result records of a drawn family, enough to rebuild it
  with ``make_family`` in any framework (:func:`satcore._formulas.families.rebuild_family`);
* :func:`family_option_label`: the ``family`` option in words, as a decision records the family its
  trials were asked to train.

Each adapter then builds the family's feature map for its tensors with the builder it
registered for the kind (:func:`satcore._formulas.families.family_builder`; ``features.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from satcore import InputError
from satcore.adapter_api import family_spec, option_given, registered_families


def per_candidate(value, names, option: str, default=None) -> dict:
    """``{candidate: value}`` for the candidates ``names``.

    A mapping gives each candidate its own value (one it leaves out gets ``default``);
    any other value is every candidate's.  A mapping key that is no candidate is refused
    (ValueError naming it and ``option``): a misspelt name would silently fall back.

    Examples
    --------
    >>> from satcore.adapters.options import per_candidate
    >>> per_candidate("mlp", ["a", "b"], "family")
    {'a': 'mlp', 'b': 'mlp'}
    >>> per_candidate({"b": "linear"}, ["a", "b"], "family", default="auto")
    {'a': 'auto', 'b': 'linear'}
    """
    names = list(names)
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(names), key=str)
        if unknown:
            raise InputError(f"{option} given for unknown candidate(s) {unknown}; candidates are {names}")
        return {name: value.get(name, default) for name in names}
    return {name: value for name in names}


def known_family(kind: str, others: str = "pass a feature map"):
    """The registered :class:`~satcore._formulas.families.FamilySpec` of ``kind``, or the ``InputError`` naming
    what the probe takes (``others``: what else the adapter takes)."""
    try:
        return family_spec(kind)
    except ValueError:
        raise InputError(f"unknown family {kind!r}; choose 'auto', one of {registered_families()}, "
                         f"or {others}") from None


def check_family(family, what: str) -> None:
    """Refuse, naming ``what``, a family the probe would refuse when it resolves it: a name that is neither
    ``"auto"`` nor registered (:func:`known_family`, as :func:`builtin_kind` reads it), also as a mapping's
    value; feature maps and :class:`satcore.Family` objects pass (their framework checks them)."""
    for value in family.values() if isinstance(family, Mapping) else (family,):
        if isinstance(value, str) and value != "auto":
            try:
                known_family(value)
            except InputError as exc:
                raise InputError(f"{what}: {exc}") from None


def builtin_kind(spec, shape, *, image_layout: str = "(M, C, H, W)", others: str = "pass a feature map") -> str:
    """The built-in family ``spec`` names for a stream of ``shape``.

    ``"auto"`` is ``conv`` for a 4-d stream (an image, laid out ``image_layout`` by the
    framework) and ``mlp`` otherwise; a kind must be registered, and one for images only
    (``conv``) needs a 4-d stream.  ``others`` says in the error what else the adapter takes.

    Examples
    --------
    >>> from satcore.adapters.options import builtin_kind
    >>> builtin_kind("auto", (8, 3, 5, 5)), builtin_kind("auto", (8, 16, 32)), builtin_kind("linear", (8, 4))
    ('conv', 'mlp', 'linear')
    """
    rank = len(shape)
    kind = ("conv" if rank == 4 else "mlp") if spec == "auto" else spec
    definition = known_family(kind, others)
    if definition.images_only and rank != 4:  # named as given: --family on the command line, family= in Python
        raise InputError(f"{option_given('family', kind)} needs a {image_layout} stream, got shape {tuple(shape)}")
    return kind


def family_record(family) -> dict:
    """``{kind, width, n_features, seed}`` of a :class:`satcore.Family`: ``make_family(kind, width,
    seed=seed)`` rebuilds it (``n_features=`` for ``mlp`` and ``conv``; ``init_std=`` as the
    adapter records it)."""
    return {"kind": family.kind, "width": family.width, "n_features": family.n_features, "seed": family.seed}


def family_option_label(family) -> str:
    """The probe's ``family`` option in words: a name as given (``"auto"``, ``"native"``, a kind), ``"per
    candidate"`` for a mapping candidate -> family, else the class name of the feature map (or
    :class:`satcore.Family`) given.

    Examples
    --------
    >>> from satcore.adapters.options import family_option_label
    >>> family_option_label("auto"), family_option_label({"fc": "linear"}), family_option_label(object())
    ('auto', 'per candidate', 'object')
    """
    if isinstance(family, str):
        return family
    return "per candidate" if isinstance(family, Mapping) else type(family).__name__
