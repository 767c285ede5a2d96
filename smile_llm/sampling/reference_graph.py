"""The depth of a graph of references (a schema's ``$ref``s, a grammar's rules): how deep a walk
that visits each vertex once, as the grammar engine's compiler does, can nest. Both limits modules
bound it (``schema_limits.MAX_REF_CHAIN``, ``grammar_limits.MAX_RULE_DEPTH``)."""

from __future__ import annotations

from typing import Any


def longest_chain(edges: dict[Any, list[Any]], start: Any = None) -> int:
    """Vertices on the longest path of the graph ``edges`` (vertex -> successors, every successor
    a vertex) from ``start`` (from any vertex when None; 0 for no vertices), each strongly
    connected component counted with all its vertices: an upper bound of how deep a walk that
    visits each vertex once can nest."""
    if not edges:
        return 0
    component = strong_components(edges)
    size: dict[int, int] = {}
    for c in component.values():
        size[c] = size.get(c, 0) + 1
    out: dict[int, set[int]] = {}
    for v, nexts in edges.items():
        for w in nexts:
            if component[w] != component[v]:
                out.setdefault(component[v], set()).add(component[w])
    best: dict[int, int] = {}
    for c in sorted(size):  # successors first
        best[c] = size[c] + max((best[d] for d in out.get(c, ())), default=0)
    return best[component[start]] if start is not None else max(best.values())


def strong_components(edges: dict[Any, list[Any]]) -> dict[Any, int]:
    """Tarjan's strongly connected components, iteratively: vertex -> component number, numbered
    so that every edge between components goes to a lower number."""
    index: dict[Any, int] = {}
    low: dict[Any, int] = {}
    on_stack: set[Any] = set()
    stack: list[Any] = []
    component: dict[Any, int] = {}
    counter = components = 0
    for start in edges:
        if start in index:
            continue
        work: list[tuple[Any, int]] = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            recurse = False
            nexts = edges[v]
            while i < len(nexts):
                w = nexts[i]
                i += 1
                if w not in index:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component[w] = components
                    if w == v:
                        break
                components += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return component
