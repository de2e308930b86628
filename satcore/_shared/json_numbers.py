"""JSON has no NaN or Inf: the numbers satcore writes are made JSON-safe here."""

import math


def json_number(x):
    """JSON has no NaN/Inf: map them to null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def json_safe(x):
    """:func:`json_number` through nested dicts and lists."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return json_number(x)
