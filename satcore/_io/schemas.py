"""The JSON schemas of satcore's outputs, shipped in ``satcore/schemas``."""

from __future__ import annotations

from .._shared.errors import InputError


SCHEMA_FILES = {"report": "report.schema.json", "sweep": "sweep.schema.json", "dump-meta": "dump-meta.schema.json"}


def json_schema(name: str) -> dict:
    """The JSON Schema (draft 2020-12) shipped with satcore for ``"report"`` (``satcore-report/1``),
    ``"sweep"`` (``satcore-sweep/2``) or ``"dump-meta"`` (a dump's ``meta`` member)."""
    import json
    from importlib.resources import files

    if name not in SCHEMA_FILES:
        raise InputError(f"no schema {name!r}; schemas are {sorted(SCHEMA_FILES)}")
    return json.loads(files("satcore").joinpath("schemas", SCHEMA_FILES[name]).read_text())
