"""Directed-graph helpers every layer shares: one topological order, cycles, ancestors.

Nodes are any hashable values (task ids, node indices, network names); edges
are (before, after) pairs. Orders are stable: among the nodes that may come
next, the one listed first in `nodes` goes first, so an already sorted input
comes back unchanged (stage files keep the model's node order, job graphs the
user's network order).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)


def topological_order(nodes: Sequence[Node], edges: Iterable[tuple[Node, Node]]
                      ) -> list[Node] | None:
    """The nodes with every edge pointing forward, or None when the edges form a cycle.

    Edges naming unknown nodes are a caller bug (KeyError). Kahn's algorithm
    with a heap of input positions: O((n + e) log n).
    """
    position = {node: index for index, node in enumerate(nodes)}
    successors: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for before, after in edges:
        successors[position[before]].append(position[after])
        waiting[position[after]] += 1
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(nodes[index])
        for successor in successors[index]:
            waiting[successor] -= 1
            if waiting[successor] == 0:
                heapq.heappush(ready, successor)
    return order if len(order) == len(nodes) else None


def find_cycle(nodes: Sequence[Node], edges: Iterable[tuple[Node, Node]]) -> list[Node]:
    """A cycle as a closed path [a, b, ..., a], or [] if there is none (iterative DFS)."""
    successors: dict[Node, list[Node]] = {node: [] for node in nodes}
    for before, after in edges:
        successors[before].append(after)
    colour = dict.fromkeys(nodes, 0)  # 0 new, 1 on the DFS path, 2 done
    for root in nodes:
        if colour[root]:
            continue
        stack = [(root, iter(successors[root]))]
        path = [root]
        colour[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[child] == 1:
                return path[path.index(child):] + [child]
            elif colour[child] == 0:
                colour[child] = 1
                stack.append((child, iter(successors[child])))
                path.append(child)
    return []


def ancestors(nodes: Sequence[Node], edges: Iterable[tuple[Node, Node]]
              ) -> dict[Node, set[Node]]:
    """For each node, every node with a path to it. The edges must be acyclic."""
    edge_list = list(edges)
    order = topological_order(nodes, edge_list)
    if order is None:
        raise ValueError("ancestors() needs acyclic edges")
    predecessors: dict[Node, list[Node]] = {node: [] for node in nodes}
    for before, after in edge_list:
        predecessors[after].append(before)
    found: dict[Node, set[Node]] = {}
    for node in order:
        above: set[Node] = set()
        for parent in predecessors[node]:
            above.add(parent)
            above |= found[parent]
        found[node] = above
    return found
