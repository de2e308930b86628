"""The residual-Add search shared by the Keras and ONNX front-ends, on hand-written DAGs.

Each case is a graph ``{tensor: parents}`` and an ``Add(a, b)`` with the block input it must
name (or None): identity skip either way round, a projection shortcut (the latest common
ancestor, not an earlier one), two inputs with no common eligible ancestor, and a chain deep
enough to overflow a recursive walk.
"""

from __future__ import annotations

import pytest

from satcore.adapters.graph import Ancestry, SearchLimitError, residual_block, residual_skip

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
    assert ancestry.depth(depth - 1) == depth - 1
    assert residual_skip(ancestry, 5, depth - 1, eligible=lambda k: True) == 5


def stacked_blocks(n):
    """``n`` blocks ``h_k = h_{k-1} + W_k relu(V_k h_{k-1})``: tensors ``h``, ``u``, ``v``, ``f`` per block."""
    parents = {("h", 0): []}
    for k in range(1, n + 1):
        h = ("h", k - 1)
        parents.update({("u", k): [h, ("V", k)], ("v", k): [("u", k)], ("f", k): [("v", k), ("W", k)],
                        ("h", k): [h, ("f", k)], ("V", k): [], ("W", k): []})
    return parents


def test_search_of_many_blocks_is_linear():
    """Each Add's walk visits its own block only: 3000 blocks take at most a few steps per block."""
    n = 3000
    parents = stacked_blocks(n)
    ancestry = Ancestry(lambda key: parents[key])
    skips = [residual_block(ancestry, ("h", k - 1), ("f", k), eligible=lambda key: True) for k in range(1, n + 1)]
    assert [s for s, _ in skips] == [("h", k) for k in range(n)]
    assert set(skips[7][1]) == {("f", 8), ("v", 8), ("u", 8)}  # the branch of block 8: deeper than its input
    assert ancestry.steps <= 4 * n  # branch and skip: 4 tensors per block: a quadratic walk would need ~n^2 / 2


def test_wide_fan_in_summed_by_a_chain_is_refused_within_the_budget():
    """``s_k = s_{k-1} + relu_k(x)``: each walk goes back over all earlier sums; the budget stops it."""
    n = 5000
    parents = {"x": [], "s0": ["x"]}
    for k in range(1, n):
        parents[f"r{k}"] = ["x"]
        parents[f"s{k}"] = [f"s{k - 1}", f"r{k}"]
    budget = 10 * len(parents)
    ancestry = Ancestry(lambda key: parents[key], max_steps=budget)
    with pytest.raises(SearchLimitError, match=f"stopped after {budget} steps"):
        for k in range(1, n):
            residual_skip(ancestry, f"s{k - 1}", f"r{k}", eligible=lambda key: True)
    assert ancestry.steps == budget + 1
