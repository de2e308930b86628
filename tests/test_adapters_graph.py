"""The residual-Add search shared by the Keras and ONNX front-ends, on hand-written DAGs.

Each case is a graph ``{tensor: parents}`` and an ``Add(a, b)`` with the block input it must
name (or None): identity skip either way round, a projection shortcut (the latest common
ancestor, not an earlier one), two inputs with no common eligible ancestor, and a chain deep
enough to overflow a recursive walk.
"""

from __future__ import annotations

import pytest

from satcore.adapters.graph import Ancestry, residual_skip

# x -> h -> f1 -> f2 ; g = proj(h) ; y = relu(x) ; m = mask (no parents)
GRAPH = {"x": [], "h": ["x"], "f1": ["h"], "f2": ["f1", "w"], "w": [], "g": ["h", "w"], "y": ["x"], "m": [],
         "u": ["m"]}


@pytest.mark.parametrize("a,b,skip", [
    ("h", "f2", "h"),  # h + f(h)
    ("f2", "h", "h"),  # the same Add written the other way round
    ("g", "f2", "h"),  # projection shortcut: h, not its ancestor x
    ("f2", "u", None),  # the mask path shares nothing with f2
])
def test_block_input_of_an_add(a, b, skip):
    assert residual_skip(Ancestry(lambda k: GRAPH[k]), a, b, eligible=lambda k: k != "w") == skip


def test_ineligible_common_ancestors_are_skipped():
    """With ``h`` ineligible (an integer tensor, say) the projection's block input is ``x``."""
    assert residual_skip(Ancestry(lambda k: GRAPH[k]), "g", "f2", eligible=lambda k: k not in ("w", "h")) == "x"


def test_deep_chain_without_recursion():
    depth = 3000  # past the recursion limit (1000)
    parents = {k: ([k - 1] if k else []) for k in range(depth)}
    ancestry = Ancestry(lambda k: parents[k])
    assert len(ancestry.of(depth - 1)) == depth - 1
    assert residual_skip(ancestry, 5, depth - 1, eligible=lambda k: True) == 5
