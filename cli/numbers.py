"""Integer options of the command line, bounded: a value past its range is one line of usage error.

click's ``IntRange`` without a maximum takes any integer Python can parse, and a 400-digit
``--steps`` then fails deep in the arithmetic (``OverflowError: int too large to convert to
float``) with a traceback.  Every integer option of ``satcore`` is a :class:`Count` instead.
(Float options are :class:`satcore.cli.common.FiniteFloatRange`: a value past float64's range
parses to infinity, which it refuses.)
"""

from __future__ import annotations

import click

# Counts (steps, samples, features, batch sizes) meet float64 arithmetic: up to 2^53 they stay exact in it.
MAX_COUNT = 2**53
MAX_SEED = 2**63 - 1  # what every random generator satcore seeds (NumPy's, torch's) accepts
_MAX_DIGITS = len(str(MAX_SEED)) + 1  # longer text cannot be in range: refused before it is parsed or echoed


class Count(click.IntRange):
    """An integer in ``[min, max]`` (default ``1 .. 2^53``); the refusal shows a long value by its length."""

    def __init__(self, min: int = 1, max: int = MAX_COUNT):
        super().__init__(min=min, max=max)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and len(value.strip().lstrip("+-").lstrip("0")) > _MAX_DIGITS:
            self.fail(f"a {len(value.strip())}-character number is not in the range {self.min}..{self.max}", param, ctx)
        return super().convert(value, param, ctx)
