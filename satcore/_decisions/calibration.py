"""The shipped calibrations of decide's trials, read from ``calibrations.json`` beside this module.

The file is data, written by ``python -m studies.decision_validity --fit``; its ``provenance`` says what the
constants were fitted on and where their evidence is (docs/predictive-validity.md).  One calibration per
trial schedule of ``decide``: ``DEFAULT_CALIBRATION`` (the even plan), ``HALVING_CALIBRATION``
(successive halving).
"""

from __future__ import annotations

import json
from importlib.resources import files

from .._shared.errors import InputError
from .trials import Calibration

CALIBRATION_FORMAT = "satcore-calibration/1"
CALIBRATION_FILE = "calibrations.json"


def read_calibrations(text: str) -> dict[str, Calibration]:
    """The calibrations of a ``satcore-calibration/1`` document, by schedule name."""
    data = json.loads(text)
    if data.get("format") != CALIBRATION_FORMAT:
        raise InputError(f"{CALIBRATION_FILE}: format must be {CALIBRATION_FORMAT!r}")
    return {name: Calibration.from_dict(fields) for name, fields in data["calibrations"].items()}


SHIPPED_CALIBRATIONS = read_calibrations(files(__package__).joinpath(CALIBRATION_FILE).read_text())
DEFAULT_CALIBRATION = SHIPPED_CALIBRATIONS["default"]
HALVING_CALIBRATION = SHIPPED_CALIBRATIONS["halving"]
