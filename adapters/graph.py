"""The residual-``Add`` search shared by the Keras and ONNX adapters (pure Python, no framework).

A front-end describes its tensor graph by ``parents(key)``: the keys (any hashable: ONNX
tensor names, ids of Keras tensors) of the tensors a tensor is computed from, along the data
edges that count (ONNX leaves out ``Shape``/``Size``, so a mask built from a tensor's shape
does not make an ``Add`` residual).  An ``Add(a, b)`` is a residual block ``x + f(x)`` when one
input derives from the other; with a projection shortcut ``g(x) + f(x)`` the block input ``x``
is the latest tensor both derive from.

The search walks back from ``a`` and ``b`` together, deepest tensor first, and stops at the
first tensor both reach: a walk over the block's own tensors, so a network of ``n`` blocks is
searched in time and memory linear in its size.  Every walk of one graph draws on one step
budget (:class:`Ancestry`); a graph that would need more (a wide fan-in summed by a chain of
``Add`` nodes, each walk going back over all the earlier ones) is refused with
:class:`SearchLimitError` instead of running for minutes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable

from satcore import InputError


class SearchLimitError(InputError):
    """The residual search needed more steps than its budget (the front-end says which option to use)."""


class Ancestry:
    """Parents and depths of tensors in a DAG given by ``parents``, memoised (one instance per graph).

    ``depth(key)`` is the length of the longest path from a tensor without parents: a
    topological rank (a tensor is deeper than each of its parents).  ``max_steps`` bounds the
    tensors all walks over this graph may visit together.
    """

    def __init__(self, parents: Callable[[Hashable], Iterable[Hashable]], max_steps: int | None = None):
        self._parents = parents
        self._direct: dict = {}
        self._depth: dict = {}
        self.max_steps = max_steps
        self.steps = 0

    def parents(self, key) -> tuple:
        if key not in self._direct:
            self._direct[key] = tuple(self._parents(key))
        return self._direct[key]

    def step(self) -> None:
        self.steps += 1
        if self.max_steps is not None and self.steps > self.max_steps:
            raise SearchLimitError(f"the residual search stopped after {self.max_steps} steps")

    def depth(self, key) -> int:
        """Longest path to ``key`` from a source (iterative: deep networks would overflow recursion)."""
        known = self._depth.get(key)
        if known is not None:
            return known
        stack = [key]
        while stack:
            top = stack[-1]
            if top in self._depth:
                stack.pop()
                continue
            todo = [p for p in self.parents(top) if p not in self._depth]
            if todo:
                stack.extend(todo)
                continue
            self._depth[top] = 1 + max((self._depth[p] for p in self.parents(top)), default=-1)
            stack.pop()
        return self._depth[key]


def residual_block(ancestry: Ancestry, a, b, eligible: Callable[[Hashable], bool]):
    """``(block input, branch tensors)`` of ``Add(a, b)``, or None when the ``Add`` is not residual.

    The block input is ``a`` when ``b`` derives from it (``a + f(a)``), ``b`` when ``a``
    derives from ``b``; otherwise the deepest ``eligible`` tensor both derive from
    (projection shortcut ``g(x) + f(x)``), which no other eligible common ancestor derives
    from.  The branch is every tensor of the walk deeper than the block input (``a`` and
    ``b`` among them unless one is the block input): the block's own computation.

    Walks back from ``a`` and ``b`` deepest first, marking each tensor with the sides that
    reach it; the first tensor popped with both marks is the deepest common ancestor (a
    deeper one would have been popped before it).  It stops as soon as one side has no
    tensor left to visit: nothing common remains.
    """
    A, B, BOTH = 1, 2, 3
    marks = {a: A} if a != b else {a: BOTH}
    marks[b] = marks.get(b, 0) | B
    pending = {A: 0, B: 0}
    heap: list = []
    order = 0
    for key in dict.fromkeys((a, b)):
        heapq.heappush(heap, (-ancestry.depth(key), order, key))
        order += 1
        for side in (A, B):
            pending[side] += bool(marks[key] & side)
    branch: list = []
    while heap and pending[A] and pending[B]:
        ancestry.step()
        _, _, key = heapq.heappop(heap)
        mark = marks[key]
        for side in (A, B):
            pending[side] -= bool(mark & side)
        if mark == BOTH and (key in (a, b) or eligible(key)):
            return key, tuple(branch)
        branch.append(key)
        for p in ancestry.parents(key):
            old = marks.get(p, 0)
            new = old | mark
            if new == old:  # (a parent is shallower than key: never popped yet)
                continue
            marks[p] = new
            for side in (A, B):
                pending[side] += bool(new & side) and not (old & side)
            if not old:
                heapq.heappush(heap, (-ancestry.depth(p), order, p))
                order += 1
    return None


def residual_skip(ancestry: Ancestry, a, b, eligible: Callable[[Hashable], bool]):
    """The block input of ``Add(a, b)`` (:func:`residual_block`), or None when it is not residual.

    Examples
    --------
    >>> from satcore.adapters.graph import Ancestry, residual_skip
    >>> edges = {"x": [], "h": ["x"], "f": ["h"], "g": ["h"], "m": []}   # f(h), g(h) from h = stem(x)
    >>> ancestry = Ancestry(lambda key: edges[key])
    >>> residual_skip(ancestry, "h", "f", eligible=lambda key: True)     # h + f(h)
    'h'
    >>> residual_skip(ancestry, "g", "f", eligible=lambda key: True)     # g(h) + f(h): projection shortcut
    'h'
    >>> residual_skip(ancestry, "x", "m", eligible=lambda key: True) is None   # unrelated: no block
    True
    """
    found = residual_block(ancestry, a, b, eligible)
    return None if found is None else found[0]
