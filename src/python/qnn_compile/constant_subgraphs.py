"""Values computed from constants alone, folded into constants before QNN partitions the program.

QNN builds each partition as a graph whose inputs are the values it receives at run time. A
partition computed from constants alone has none, and QNN refuses to build it ("No graph inputs
present for graph [0]"), failing the whole compile: the causal mask that attention's
decomposition builds from `arange` and a comparison, the positions of a write into a slice of a
buffer, the quantization of a literal. Evaluated once here, such a subgraph becomes one constant
tensor that the partition using it holds as a static tensor, like a weight.

A node folds when all its inputs fold: it is computed from literals alone, never from a
placeholder or a constant attribute (a user input, a weight, a buffer: buffers may be written at
run time, and folding a weight's own ops would only duplicate it). Random, side-effecting and
quantize / dequantize ops never fold. The pass runs last among the edge transforms, so the
quantization annotations QNN's passes put on a folded value's node (its `meta`) carry over to the
constant; ExecuTorch then lifts the new constants into the program's signature
(`lift_constant_tensor_pass`).

A connected constant subgraph that holds a 16-bit quantized value is left as it is: as a static
tensor, a causal mask at 16a8w read 20 dB against the fake-quant model on the emulator, where
fp16 and 8a8w match (docs/known-limits.md). Such a subgraph still fails to build; an honest error
is better than a program that passes the gates less accurate than it should be.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.passes.infra.pass_base import PassResult

QUANT_ATTRS = "quant_attrs"  # executorch.backends.qualcomm.utils.constants.QCOM_QUANT_ATTRS
# A quantize / dequantize stays QNN's to read: folded, an 8-bit weight would become a float one.
_QUANTIZATION_NAMESPACES = frozenset({"quantized_decomposed", "torchao"})


def _sixteen_bit(node: torch.fx.Node) -> bool:
    attrs = node.meta.get(QUANT_ATTRS)
    return isinstance(attrs, dict) and int(attrs.get("quant_max", 0)) > 255


def _foldable(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.is_impure():
        return False
    op = node.target
    if not isinstance(op, torch._ops.OpOverload):
        op = getattr(op, "_op", op)  # an edge op wraps its ATen overload
    schema = getattr(op, "_schema", None)
    if schema is not None and schema.name.split("::")[0] in _QUANTIZATION_NAMESPACES:
        return False
    return torch.Tag.nondeterministic_seeded not in getattr(op, "tags", ())


def constant_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes computed from constants alone, in graph order, but for connected subgraphs
    that hold a 16-bit quantized value (those stay computed at run time)."""
    constant: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if _foldable(node) and all(i in constant for i in node.all_input_nodes):
            constant.add(node)
    # Connected subgraphs of constant nodes (edges between two constant nodes, either way).
    root = {n: n for n in constant}

    def find(node: torch.fx.Node) -> torch.fx.Node:
        while root[node] is not node:
            root[node] = root[root[node]]
            node = root[node]
        return node

    for node in constant:
        for source in node.all_input_nodes:
            root[find(source)] = find(node)
    sixteen_bit = {find(n) for n in constant if _sixteen_bit(n)}
    return [n for n in gm.graph.nodes if n in constant and find(n) not in sixteen_bit]


def _evaluate(nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, Any]:
    values: dict[torch.fx.Node, Any] = {}
    for node in nodes:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
        target = node.target
        assert callable(target), node  # a call_function node's target (`_foldable`)
        values[node] = target(*args, **kwargs)
    return values


def fold_constant_subgraphs(gm: torch.fx.GraphModule) -> PassResult:
    """Replace each value computed from constants alone that a run-time op reads by a constant."""
    nodes = constant_nodes(gm)
    folded = set(nodes)
    frontier = [n for n in nodes if any(u not in folded for u in n.users)]
    # Only tensors become constants: a folded scalar or list stays in the graph.
    frontier = [n for n in frontier if isinstance(n.meta.get("val"), torch.Tensor)]
    if not frontier:
        return PassResult(gm, False)
    # Every input of a constant node is constant: the nodes in graph order evaluate in one pass.
    values = _evaluate(nodes)
    for index, node in enumerate(frontier):
        name = f"_folded_constant_{index}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, values[node].detach().clone().contiguous())
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
    for node in reversed(nodes):
        if not node.users:
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return PassResult(gm, True)
