"""The residual-``Add`` search shared by the Keras and ONNX adapters (pure Python, no framework).

A front-end describes its tensor graph by ``parents(key)``: the keys (any hashable: ONNX
tensor names, ids of Keras tensors) of the tensors a tensor is computed from, along the data
edges that count (ONNX leaves out ``Shape``/``Size``, so a mask built from a tensor's shape
does not make an ``Add`` residual).  An ``Add(a, b)`` is a residual block ``x + f(x)`` when one
input derives from the other; with a projection shortcut ``g(x) + f(x)`` the block input ``x``
is the latest tensor both derive from.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable


class Ancestry:
    """Ancestors of tensors in a DAG given by ``parents``, memoised (one instance per graph)."""

    def __init__(self, parents: Callable[[Hashable], Iterable[Hashable]]):
        self._parents = parents
        self._memo: dict = {}
        self._direct: dict = {}

    def parents(self, key) -> tuple:
        if key not in self._direct:
            self._direct[key] = tuple(self._parents(key))
        return self._direct[key]

    def of(self, key) -> frozenset:
        """Every tensor ``key`` is computed from (iterative: deep networks would overflow recursion)."""
        stack = [key]
        while stack:
            top = stack[-1]
            if top in self._memo:
                stack.pop()
                continue
            parents = self.parents(top)
            todo = [p for p in parents if p not in self._memo]
            if todo:
                stack.extend(todo)
                continue
            acc = set(parents)
            for p in parents:
                acc |= self._memo[p]
            self._memo[top] = frozenset(acc)
            stack.pop()
        return self._memo[key]

    def nearest_first(self, key) -> list:
        """The ancestors of ``key`` in breadth-first order (nearest first)."""
        out, seen, frontier = [], {key}, [key]
        while frontier:
            nxt = []
            for t in frontier:
                for p in self.parents(t):
                    if p not in seen:
                        seen.add(p)
                        out.append(p)
                        nxt.append(p)
            frontier = nxt
        return out


def residual_skip(ancestry: Ancestry, a, b, eligible: Callable[[Hashable], bool]):
    """The block input of ``Add(a, b)``, or None when the ``Add`` is not residual.

    ``a`` when ``b`` derives from it (``a + f(a)``), ``b`` when ``a`` derives from ``b``;
    otherwise the latest ``eligible`` tensor both derive from (projection shortcut
    ``g(x) + f(x)``): one no other eligible common ancestor derives from, the nearest to ``a``
    when there are several.

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
    if a in ancestry.of(b):
        return a
    if b in ancestry.of(a):
        return b
    shared = ancestry.of(a) & ancestry.of(b)
    common = [t for t in ancestry.nearest_first(a) if t in shared and eligible(t)]
    for c in common:
        if not any(c in ancestry.of(other) for other in common if other != c):
            return c
    return None
