"""Integer options of the command line, bounded: a value past its range is one line of usage error.

click's ``IntRange`` without a maximum takes any integer Python can parse, and a 400-digit
``--steps`` then fails deep in the arithmetic (``OverflowError: int too large to convert to
float``) with a traceback; its ``int()`` also takes other scripts' digits (``'٣'``).  Every integer
option of ``satcore`` is a :class:`Count` instead, read by satcore's one reader of whole numbers
(ASCII digits, length checked before conversion, range).  (Float options are
:class:`satcore.cli.common.FiniteFloatRange`: a value past float64's range parses to infinity,
which it refuses.)
"""

from __future__ import annotations

import click

from satcore import InputError
from satcore.adapter_api import MAX_COUNT, MAX_SEED, parse_whole_number

__all__ = ["Count", "MAX_COUNT", "MAX_SEED"]


class Count(click.IntRange):
    """An integer in ``[min, max]`` (default ``1 .. 2^53``); the refusal shows a long value by its length.
    ``shown``: the range as ``--help`` states it, where the true bound is the input's (a model's layers), not
    ``max``."""

    def __init__(self, min: int = 1, max: int = MAX_COUNT, shown: str | None = None):
        super().__init__(min=min, max=max)
        self.shown = shown

    def _describe_range(self) -> str:
        return super()._describe_range() if self.shown is None else self.shown

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return super().convert(value, param, ctx)
        try:
            return parse_whole_number(value, "value", self.min, self.max)
        except InputError as exc:
            self.fail(str(exc).removeprefix("value: "), param, ctx)
