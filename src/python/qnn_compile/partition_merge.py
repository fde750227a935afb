"""ExecuTorch's group partitioner with a merge whose cost grows with the graph, not its cube.

XNNPACK's partitioner (ExecuTorch 1.5.1 `ConfigerationBasedPartitioner`) proposes its
partitions with `GroupBasedPartitioner`: one partition per matched op group or supported node,
then `_merge_partitions` tries every pair (p1, p2) in creation order and merges p2 into p1 when
the union forms no cycle. Each try asks `_can_merge_partitions`, which walks every external
user of the union and its whole downstream set, then runs `validate_partition`, a BFS over the
rest of the graph. With P partitions and N nodes that is up to P^2 tries of O(N) each, and p1
grows towards the whole graph: cubic in the number of decoder layers. Its constructor also
builds `_DependencyViewer`, every node's downstream and upstream closure as Python sets
(O(N^2) entries: most of the compile stage's memory on a 30-layer decoder).

Both checks decide one thing: whether p1 | p2 is convex, i.e. no node outside it is reached from
it and reaches it. Here each node's strict descendants and ancestors are bitsets (Python ints,
N bits each, built once in one pass per direction), each partition carries the unions of its
nodes' bitsets, and a try is a handful of big-int ORs and ANDs: nodes outside the union that are
both below and above it = down & up & ~members. The loop, its order and the bookkeeping of a
merge (`_perform_partition_merge`) are the stock ones, so every try answers as the stock one
does and the partitions, hence the .pte bytes, are the same (`partition_merge_test`,
`tests/llm/fast_partitioning_test.py`).

`merging_in_linear_checks()` installs this on the class, reference-counted, while any lowering
runs; `_DependencyViewer` is replaced by one that computes its sets only if something asks (the
stock `_can_merge_partitions` is then the only reader, and nothing here calls it). Graphs whose
node order is not topological, which the bitsets' one-pass build needs, take the stock merge.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch.fx

from qnn_compile.scoped_patch import Replacement, ScopedPatch

log = logging.getLogger(__name__)


class _Reachability:
    """Each node's strict descendants and ancestors in one graph, as bitsets over node order."""

    def __init__(self, nodes: list[torch.fx.Node], index: dict[torch.fx.Node, int]) -> None:
        self.index = index
        count = len(nodes)
        self.down = [0] * count
        self.up = [0] * count
        for i in range(count - 1, -1, -1):
            bits = 0
            for user in nodes[i].users:
                j = index[user]
                bits |= self.down[j] | (1 << j)
            self.down[i] = bits
        for i, node in enumerate(nodes):
            bits = 0
            for source in node.all_input_nodes:
                j = index[source]
                bits |= self.up[j] | (1 << j)
            self.up[i] = bits

    @classmethod
    def of(cls, graph: torch.fx.Graph) -> _Reachability | None:
        """The bitsets of `graph`, or None if its node order is not topological."""
        nodes = list(graph.nodes)
        index = {node: i for i, node in enumerate(nodes)}
        for i, node in enumerate(nodes):
            if any(index.get(source, i) >= i for source in node.all_input_nodes):
                return None
        return cls(nodes, index)

    def summary(self, nodes: Iterable[torch.fx.Node]) -> tuple[int, int, int]:
        """(members, strict descendants, strict ancestors) of a set of nodes, as bitsets."""
        members = down = up = 0
        for node in nodes:
            i = self.index[node]
            members |= 1 << i
            down |= self.down[i]
            up |= self.up[i]
        return members, down, up


def _merge_partitions(
    self: Any,
    partitions_by_id: dict[int, Any],
    assignment: dict[torch.fx.Node, int],
    partition_users: dict[int, set[torch.fx.Node]],
    partition_map: dict[int, set[int]],
    partitions_order: dict[int, int],
) -> None:
    """`GroupBasedPartitioner._merge_partitions` with each try answered from bitsets."""
    reach = _Reachability.of(self.graph_module.graph)
    if reach is None:
        _PATCH.original("_merge_partitions")(
            self, partitions_by_id, assignment, partition_users, partition_map,
            partitions_order,
        )
        return
    summaries = {pid: reach.summary(p.nodes) for pid, p in partitions_by_id.items()}
    partition_ids = list(partitions_by_id)
    already_merged: set[int] = set()
    tries = 0
    for i, p1 in enumerate(partition_ids):
        if p1 in already_merged:
            continue
        members, down, up = summaries[p1]
        for p2 in partition_ids[i + 1:]:
            if p2 in already_merged:
                continue
            tries += 1
            m2, d2, u2 = summaries[p2]
            merged_members, merged_down, merged_up = members | m2, down | d2, up | u2
            if merged_down & merged_up & ~merged_members:
                continue  # a node outside the union lies between two of its nodes: a cycle
            self._perform_partition_merge(
                p1, p2, partitions_by_id, assignment, partition_users, partition_map,
                partitions_order,
            )
            members, down, up = merged_members, merged_down, merged_up
            already_merged.add(p2)
    log.debug(
        "merged %d partition(s) into %d over %d node(s) in %d tries",
        len(partition_ids), len(partitions_by_id), len(reach.index), tries,
    )


class _LazyDependencyViewer:
    """The stock `_DependencyViewer`, built on first use (only the stock merge's tries use it)."""

    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        self._graph_module = graph_module
        self._built: Any = None

    def _viewer(self) -> Any:
        if self._built is None:
            self._built = _PATCH.original("_DependencyViewer")(self._graph_module)
        return self._built

    def downstreams_of(self, node: torch.fx.Node) -> set[torch.fx.Node]:
        result: set[torch.fx.Node] = self._viewer().downstreams_of(node)
        return result

    def upstreams_of(self, node: torch.fx.Node) -> set[torch.fx.Node]:
        result: set[torch.fx.Node] = self._viewer().upstreams_of(node)
        return result


def _replacements() -> list[Replacement]:
    from executorch.exir.backend.canonical_partitioners import group_partitioner

    return [
        (group_partitioner.GroupBasedPartitioner, "_merge_partitions", _merge_partitions),
        (group_partitioner, "_DependencyViewer", _LazyDependencyViewer),
    ]


_PATCH = ScopedPatch(_replacements)


def merging_in_linear_checks() -> AbstractContextManager[None]:
    """While inside, ExecuTorch's `GroupBasedPartitioner` merges with bitset checks."""
    return _PATCH.active()
