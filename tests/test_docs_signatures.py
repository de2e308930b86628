"""Calls shown in the README and docs/ match the signatures they show: an argument written positionally is a
positional parameter, and every keyword exists (a keyword-only argument shown positionally is a TypeError for
whoever copies it).  Inline code spans ``name(...)`` and the calls inside ```python blocks are checked wherever
``name`` is a public name of satcore or of its PyTorch / ONNX adapters (TensorFlow's only where a doc spells out
``satcore.adapters.tensorflow.<name>``: importing it takes longer than the rest of the check)."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
pytest.importorskip("torch")


def namespaces() -> dict:
    import satcore
    import satcore.adapters.onnx as sat_onnx
    import satcore.adapters.torch as sat_torch

    names = {n: getattr(sat_torch, n) for n in sat_torch.__all__}
    names.update({n: getattr(satcore, n) for n in satcore.__all__})  # the core's batch_moments over the adapter's
    names.update({"satcore": satcore, "sat_onnx": sat_onnx, "sat_torch": sat_torch})
    return names


def resolve(func: ast.expr, names: dict):
    """The object a call's function expression names (``f``, ``mod.f``, ``satcore.adapters.torch.f``), or None."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(func.id)
    parts.reverse()
    if parts[0] not in names:
        return None
    obj = names[parts[0]]
    for i, part in enumerate(parts[1:], 1):
        if inspect.ismodule(obj) and not hasattr(obj, part):
            try:
                obj = importlib.import_module(".".join([obj.__name__, *parts[i:i + 1]]))
                continue
            except ImportError:
                return None
        obj = getattr(obj, part, None)
        if obj is None or not (inspect.ismodule(obj) or callable(obj)):
            return None
    return None if inspect.ismodule(obj) else obj


def calls(text: str):
    """``(source, ast.Call)`` of inline code spans and ```python blocks."""
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield ast.get_source_segment(block, node), node
    for span in re.findall(r"`([^`]+\))`", re.sub(r"```.*?```", "", text, flags=re.S)):
        source = re.sub(r"=\s*(?=[,)])", "=None", span)  # `f(x, rtol=)` -> rtol=None
        # a signature written out (`f(a, *, k=1)`) and a trailing `...` after keywords (`f(a, k=, ...)`) are not
        # calls Python parses; without them they are, and they were skipped unchecked
        source = re.sub(r",\s*\.\.\.\s*\)$", ")", re.sub(r"\(\s*\*\s*,\s*|,\s*\*\s*(?=,)", lambda m: "(" if m.group(0).startswith("(") else "", source))
        try:
            node = ast.parse(source, mode="eval").body
        except SyntaxError:
            continue
        if isinstance(node, ast.Call):
            yield span, node


def test_documented_calls_bind_to_the_signatures():
    names = namespaces()
    checked, wrong = 0, []
    for doc in DOCS:
        for source, node in calls(doc.read_text()):
            target = resolve(node.func, names)
            if target is None or any(isinstance(a, ast.Starred) for a in node.args):
                continue
            # `f(model, data, ...)`: the `...` elides the remaining arguments; it is not one more positional
            args = [a for a in node.args if not (isinstance(a, ast.Constant) and a.value is Ellipsis)]
            try:
                signature = inspect.signature(target)
            except (TypeError, ValueError):
                continue
            keywords = {k.arg: None for k in node.keywords if k.arg is not None}
            try:
                signature.bind_partial(*[None] * len(args), **keywords)
            except TypeError as exc:
                wrong.append(f"{doc.relative_to(ROOT)}: `{source}`: {exc}")
            checked += 1
    assert checked > 40  # the docs show many calls: a parser that finds none checks nothing
    assert not wrong, "\n".join(wrong)


def table_row_signatures(text: str):
    """``(source, ast.Call)`` of the calls a table row's first cell writes out with their keywords (``| `f(a, k=1)` |``):
    the reference for its name, as docs/api.md's rows are.  A call ending in ``...`` elides the rest on purpose."""
    for row in re.findall(r"^\|([^|\n]*)\|", text, re.M):
        for source, node in calls(row):
            if node.keywords and "..." not in source:
                yield source, node


def test_a_signature_a_table_row_writes_out_names_every_parameter():
    """A row's signature with its keywords, ``CandidateStatistics(N, r, n_positions=1, ...)`` in docs/api.md, is read
    as the whole signature: a keyword it leaves out is one users do not learn exists (that row lacked ``stream`` and
    ``block_update``).  Every parameter but ``*args``/``**kwargs`` is named or given positionally."""
    names = namespaces()
    checked, wrong = 0, []
    for doc in DOCS:
        for source, node in table_row_signatures(doc.read_text()):
            target = resolve(node.func, names)
            if target is None:
                continue
            parameters = [p for p in inspect.signature(target).parameters.values()
                          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            shown = {k.arg for k in node.keywords}
            missing = [p.name for i, p in enumerate(parameters) if i >= len(node.args) and p.name not in shown]
            if missing:
                wrong.append(f"{doc.relative_to(ROOT)}: `{source}` leaves out {', '.join(missing)}")
            checked += 1
    assert checked > 20  # docs/api.md writes out some forty: a parser finding none checks nothing
    assert not wrong, "\n".join(wrong)
