"""`legalize_in_place` against torch's own `legalize_graph` on the same graphs: the same node
order, names and users order, hence the same next sort (the whole lowering's bytes:
tests/llm/fast_partitioning_test.py)."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.fx
from torch.fx.passes.tools_common import legalize_graph

from qnn_compile.partition_legalize import legalize_in_place, legalizing_in_place


class _Branches(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x) + y
        b = torch.sigmoid(y) * x
        c = torch.cat([a, b, a * b], dim=-1)
        return torch.tanh(c).sum(-1, keepdim=True) + a.mean(-1, keepdim=True)


def _shuffled(seed: int) -> torch.fx.GraphModule:
    """A traced graph whose nodes are then put in a random legal order (a random ready node at
    each step), as partition cuts leave a program: valid, but not torch's order."""
    gm = torch.fx.symbolic_trace(_Branches())
    gen = torch.Generator().manual_seed(seed)
    # The placeholders stay first, in order: they are the forward's signature.
    placed = {n for n in gm.graph.nodes if n.op == "placeholder"}
    nodes = [n for n in gm.graph.nodes if n not in placed]
    previous = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    while any(n not in placed for n in nodes):
        ready = [n for n in nodes if n not in placed and set(n.all_input_nodes) <= placed]
        node = ready[int(torch.randint(len(ready), (1,), generator=gen))]
        if previous.next is not node:
            previous.append(node)
        placed.add(node)
        previous = node
    gm.graph.lint()
    gm.recompile()
    return gm


def _shape(gm: torch.fx.GraphModule) -> list[tuple[str, list[str]]]:
    return [(n.name, [u.name for u in n.users]) for n in gm.graph.nodes]


@pytest.mark.parametrize("seed", range(5))
def test_same_order_names_and_users_as_torchs_legalize(seed: int) -> None:
    stock, ours = _shuffled(seed), _shuffled(seed)
    legalize_graph(stock)
    legalize_in_place(ours)
    assert _shape(ours) == _shape(stock)
    # And again: the users order the first sort left decides the second.
    legalize_graph(stock)
    legalize_in_place(ours)
    assert _shape(ours) == _shape(stock)
    ours.graph.lint()
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    assert torch.equal(ours(x, y), _Branches()(x, y))


def test_prioritized_operators_go_first_as_in_torch() -> None:
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    size = graph.call_function(operator.getitem, (a, 0))
    late = graph.call_function(torch.relu, (a,))
    first = graph.call_function(operator.add, (size, 1))
    graph.output((late, first))
    stock = torch.fx.GraphModule(torch.nn.Module(), graph)
    ours = torch.fx.GraphModule(torch.nn.Module(), copy.deepcopy(graph))
    legalize_graph(stock)
    legalize_in_place(ours)
    assert _shape(ours) == _shape(stock)


def test_a_cycle_is_refused_as_torch_refuses_it() -> None:
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    b = graph.call_function(torch.relu, (a,))
    c = graph.call_function(torch.neg, (b,))
    b.args = (c,)
    graph.output(c)
    with pytest.raises(RuntimeError, match="cycles"):
        legalize_in_place(torch.fx.GraphModule(torch.nn.Module(), graph))


def test_installed_only_while_lowering() -> None:
    from executorch.exir import lowered_backend_module

    assert lowered_backend_module.legalize_graph is legalize_graph
    with legalizing_in_place():
        assert lowered_backend_module.legalize_graph is legalize_in_place
    assert lowered_backend_module.legalize_graph is legalize_graph
