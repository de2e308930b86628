"""The module paths of releases before the layer folders, kept importable for one release.

``import satcore.results`` (or ``from satcore.decision import TrialCurve``) returns the module that
now lives in a layer folder, the same object, so monkeypatching and ``isinstance`` keep working; a
``DeprecationWarning`` names the new place.  The package namespace (``satcore.score``,
``satcore.Recipe``, ...) is the contract; these paths are not.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED_MODULES = {
    "errors": "_shared.errors", "_arrays": "_shared.arrays", "_display": "_shared.display",
    "_optional": "_shared.optional",
    "_psd": "_formulas.psd", "quantities": "_formulas.quantities", "folds": "_formulas.folds",
    "certification": "_formulas.certification", "insertion": "_formulas.insertion", "optim": "_formulas.optim",
    "alignment": "_formulas.alignment", "families": "_formulas.families",
    "moments": "_statistics.moments", "statistics": "_statistics.candidate", "depth": "_statistics.depth",
    "results": "_scores.scores",
    "criteria": "_decisions.criteria", "verdicts": "_decisions.verdicts", "predictors": "_decisions.predictors",
    "recipe": "_decisions.recipe", "reporting": "_decisions.reporting", "decision": "_decisions.trials",
    "decision_calibration": "_decisions.calibration", "sweep": "_decisions.sweep",
    "growth": "_growth.loop", "growth_log": "_growth.log",
    "dump": "_io.dump", "_zipnpy": "_io.zipnpy", "_atomic": "_io.atomic", "probe_result": "_io.probe_result",
    "report_text": "_rendering.table",
}


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system the module already loaded at its new path instead of a second copy."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._target_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self._target)
        self._target_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # the import system stamped the alias's spec on the module in between: give it back its own
        module.__spec__ = self._target_spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package != "satcore" or name not in MOVED_MODULES:
            return None
        new = f"satcore.{MOVED_MODULES[name]}"
        warnings.warn(f"{fullname} moved to {new}; import names from satcore itself", DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (satcore's ``__init__`` calls it)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
