"""The bitset merge proposes the stock partitions (a real decoder's .pte: tests/llm)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
import torch.fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.passes.operator_support import OperatorSupportBase

from qnn_compile.partition_merge import merging_in_linear_checks


class _Supported(OperatorSupportBase):
    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module],
                          node: torch.fx.Node) -> bool:
        return node.name in self.names


@st.composite
def _graphs(draw: st.DrawFn) -> tuple[torch.fx.GraphModule, set[str], list[list[str]]]:
    """A random DAG of adds (1-2 earlier inputs each), a random supported subset and random
    disjoint groups of supported nodes (convex or not, as config matches can be)."""
    graph = torch.fx.Graph()
    nodes: list[torch.fx.Node] = [graph.placeholder("x"), graph.placeholder("y")]
    ops: list[torch.fx.Node] = []
    for _ in range(draw(st.integers(1, 40))):
        picks = draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, max_size=2))
        args = [nodes[i] for i in picks] + [nodes[picks[0]]] * (2 - len(picks))
        node = graph.call_function(torch.add, tuple(args))
        nodes.append(node)
        ops.append(node)
    sinks = [n for n in ops if not n.users]
    graph.output(tuple(sinks))
    supported = {n.name for n in ops if draw(st.booleans()) or draw(st.booleans())}
    candidates = [n.name for n in ops if n.name in supported]
    order = draw(st.permutations(candidates))
    groups: list[list[str]] = []
    at = 0
    while at < len(order) and draw(st.booleans()):
        size = draw(st.integers(1, 4))
        groups.append(list(order[at : at + size]))
        at += size
    return torch.fx.GraphModule(torch.nn.Module(), graph), supported, groups


def _propose(gm: torch.fx.GraphModule, supported: set[str],
             groups: list[list[str]]) -> list[tuple[int, list[str]]]:
    from executorch.exir.backend.canonical_partitioners.group_partitioner import (
        GroupBasedPartitioner,
    )

    by_name = {n.name: n for n in gm.graph.nodes}
    partitioner = GroupBasedPartitioner(
        gm, _Supported(supported), node_groups=[[by_name[n] for n in g] for g in groups],
        allows_single_node_partition=True,
    )
    return [(p.id, [n.name for n in p.nodes]) for p in partitioner.propose_partitions()]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_graphs())
def test_random_graphs_get_the_stock_partitions(
    case: tuple[torch.fx.GraphModule, set[str], list[list[str]]],
) -> None:
    gm, supported, groups = case
    stock = _propose(gm, supported, groups)
    with merging_in_linear_checks():
        assert _propose(gm, supported, groups) == stock


def test_the_patch_is_scoped_and_reference_counted() -> None:
    from executorch.exir.backend.canonical_partitioners import group_partitioner

    cls = group_partitioner.GroupBasedPartitioner
    stock_merge, stock_viewer = cls._merge_partitions, group_partitioner._DependencyViewer
    with merging_in_linear_checks():
        with merging_in_linear_checks():
            pass
        assert cls._merge_partitions is not stock_merge  # the outer one still holds it
    assert cls._merge_partitions is stock_merge
    with pytest.raises(RuntimeError), merging_in_linear_checks():
        raise RuntimeError("a lowering failed")
    assert cls._merge_partitions is stock_merge
    assert group_partitioner._DependencyViewer is stock_viewer
