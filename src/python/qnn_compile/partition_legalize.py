"""The topological re-sort after each partition cut, done by moving nodes instead of copying them.

ExecuTorch 1.5.1's `create_submodule_from_nodes` (`exir/lowered_backend_module.py`) ends each
partition's cut with torch's `legalize_graph(gm)`: a topological sort (Kahn's, with a few
operators moved to the front) that builds a new graph by copying every node of the program,
names and all. With P partitions of a program of N nodes that is P x N node copies, both growing
with a decoder's depth: after `qnn_compile.partition_recompile` removed the code generation per
cut, these copies were the largest part of cutting a deep decoder.

`legalize_in_place` computes the same order with the same algorithm over the same nodes, then
moves the nodes into it inside the existing graph and reorders each node's users as the copies
would have recorded them (a copy registers itself with its inputs in creation order, and the
next sort walks users in that order). Same order, same names, same users order: the next cut
sees what it would have seen, and the program serializes to the same bytes
(`tests/llm/fast_partitioning_test.py`, `partition_legalize_test.py`). Installed only while a
lowering runs, like the other partitioning speed-ups.
"""

from __future__ import annotations

import collections
from contextlib import AbstractContextManager

import torch.fx

from qnn_compile.scoped_patch import Replacement, ScopedPatch


def _prioritized() -> frozenset[object]:
    """The operators torch's `legalize_graph` moves to the front of its queue."""
    import operator

    import torch

    return frozenset({
        operator.add, operator.mul, operator.sub, operator.floordiv, operator.truediv,
        operator.mod, operator.le, operator.lt, operator.ge, operator.gt, operator.eq,
        operator.ne, torch.ops.aten.sym_constrain_range.default,
        torch.ops.aten.sym_constrain_range_for_size.default, torch.ops.aten._assert_async.msg,
        torch.ops.aten.scalar_tensor.default, torch.ops.aten._assert_scalar.default,
    })


def topological_order(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """`legalize_graph`'s order of `graph`'s nodes. Raises RuntimeError on a cycle, as it does."""
    prioritized = _prioritized()
    nodes = list(graph.nodes)
    indeg = dict.fromkeys(nodes, 0)
    for node in nodes:
        for user in node.users:
            indeg[user] += 1
    queue = collections.deque(n for n in nodes if indeg[n] == 0)
    order: list[torch.fx.Node] = []
    while queue:
        current = queue.popleft()
        order.append(current)
        for user in current.users:
            indeg[user] -= 1
            if indeg[user] == 0:
                if user.op == "call_function" and user.target in prioritized:
                    queue.appendleft(user)
                else:
                    queue.append(user)
    if len(order) < len(nodes):
        raise RuntimeError(
            f"Input graph has cycles, unable to add {[n for n in indeg if indeg[n] != 0]}"
        )
    return order


def legalize_in_place(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with its nodes in `legalize_graph`'s order, moved rather than copied."""
    order = topological_order(gm.graph)
    # The graph's sentinel: appending each node after the previous one rebuilds the list.
    previous: torch.fx.Node = gm.graph._root
    for node in order:
        if previous.next is not node:
            previous.append(node)
        previous = node
    for node in order:
        for source in node._input_nodes:
            del source.users[node]
            source.users[node] = None
    gm.recompile()  # what assigning the copied graph does (a no-op while partition_recompile is on)
    return gm


def _replacements() -> list[Replacement]:
    from executorch.exir import lowered_backend_module

    return [(lowered_backend_module, "legalize_graph", legalize_in_place)]


_PATCH = ScopedPatch(_replacements)


def legalizing_in_place() -> AbstractContextManager[None]:
    """While inside, each partition cut re-sorts the program by moving its nodes."""
    return _PATCH.active()
