"""The Examples sections of the NumPy core's docstrings run as tests (docs/api.md, Doctests).

``doctest.testmod`` over the core modules, not ``pytest --doctest-modules``: collecting
``satcore/`` would walk into the ``satcore/adapters`` symlink and import the frameworks. The
files the statistics/report code lives in carry their own examples once written; add a module
here when its docstrings gain an Examples section.
"""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

MODULES = [
    "satcore._formulas.quantities",
    "satcore._formulas.psd",
    "satcore._formulas.alignment",
    "satcore._formulas.insertion",
    "satcore._formulas.optim",
    "satcore._formulas.families",
    "satcore._shared.arrays",
    "satcore._shared.option_names",
    "satcore._shared.splits",
    "satcore._decisions.sweep",
    "satcore._decisions.verdicts",
    "satcore._decisions.recipe",
    "satcore._decisions.policy",
    "satcore._decisions.predictors",
    "satcore._growth.loop",
    "satcore._decisions.trials",
    "satcore._decisions.resolution",
    "satcore._decisions.frontier",
    "satcore.adapters.batches",  # pure Python, like the core: no framework is imported
    "satcore.adapters.graph",
    "satcore.adapters.options",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    with np.printoptions(legacy=False):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, report=True)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (printed above)"
