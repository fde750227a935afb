"""Values computed from constants alone, folded into constants before QNN partitions the program.

QNN builds each partition as a graph whose inputs are the values it receives at run time. A
partition computed from constants alone has none, and QNN refuses to build it ("No graph inputs
present for graph [0]"), failing the whole compile: the causal mask that attention's
decomposition builds from `arange` and a comparison, the positions of a write into a slice of a
buffer, the quantization of a literal. Evaluated once here, such a subgraph becomes one constant
tensor that the partition using it holds as a static tensor, like a weight.

A node folds when all its inputs fold: it is computed from literals alone, never from a user
input, a weight or a buffer (buffers may be written at run time, and folding a weight's own ops
would only duplicate it). Literals include the tensors export lifted out of the code (a
`torch.tensor([...])` in `forward`, the steps of a decomposed `linspace` in `affine_grid`): read
from the program's lifted constants, so the pass runs on the program (`folding_pass`). Random,
side-effecting and quantize / dequantize ops never fold. The pass runs last among the edge
transforms, so the quantization annotations QNN's passes put on a folded value's node (its
`meta`) carry over to the constant; ExecuTorch then lifts the new constants into the
program's signature (`lift_constant_tensor_pass`).

At every recipe, 16-bit ones included: a folded causal mask once read far from the fake-quant
model at 16 bits, but the cause was the mask's -inf taking the scores' quantization range, which
the quantizer now clamps (`qnn_quant.quantizers.qnn`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.fx.passes.infra.pass_base import PassResult

QUANT_ATTRS = "quant_attrs"  # executorch.backends.qualcomm.utils.constants.QCOM_QUANT_ATTRS
# A quantize / dequantize stays QNN's to read: folded, an 8-bit weight would become a float one.
_QUANTIZATION_NAMESPACES = frozenset({"quantized_decomposed", "torchao"})


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


def constant_nodes(
    gm: torch.fx.GraphModule, literals: Mapping[str, torch.Tensor] | None = None
) -> list[torch.fx.Node]:
    """The nodes computed from constants alone, in graph order. `literals`: the values of the
    placeholders that are lifted literals, by placeholder name (they count as constants)."""
    literals = literals or {}
    constant: set[torch.fx.Node] = {
        n for n in gm.graph.nodes if n.op == "placeholder" and n.name in literals
    }
    for node in gm.graph.nodes:
        if _foldable(node) and all(i in constant for i in node.all_input_nodes):
            constant.add(node)
    return [n for n in gm.graph.nodes if n in constant and n.op == "call_function"]


def _evaluate(
    nodes: list[torch.fx.Node], literals: Mapping[str, torch.Tensor]
) -> dict[torch.fx.Node, Any]:
    values: dict[torch.fx.Node, Any] = {}

    def value(node: torch.fx.Node) -> Any:
        return literals[node.name] if node.op == "placeholder" else values[node]

    for node in nodes:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), value)
        target = node.target
        assert callable(target), node  # a call_function node's target (`_foldable`)
        values[node] = target(*args, **kwargs)
    return values


def fold_constant_subgraphs(
    gm: torch.fx.GraphModule, literals: Mapping[str, torch.Tensor] | None = None
) -> PassResult:
    """Replace each value computed from constants alone that a run-time op reads by a constant.
    The placeholders of `literals` stay (the program's signature lists them)."""
    literals = literals or {}
    nodes = constant_nodes(gm, literals)
    folded = set(nodes)
    frontier = [n for n in nodes if any(u not in folded for u in n.users)]
    # Only tensors become constants: a folded scalar or list stays in the graph.
    frontier = [n for n in frontier if isinstance(n.meta.get("val"), torch.Tensor)]
    if not frontier:
        return PassResult(gm, False)
    # Every input of a constant node is constant: the nodes in graph order evaluate in one pass.
    values = _evaluate(nodes, literals)
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


# torch's prefix for the tensors export lifts out of the code (`lift_constants_pass`).
_LIFTED = "_lifted_tensor_constant"


def lifted_literals(program: Any) -> dict[str, torch.Tensor]:
    """An ExportedProgram's lifted literals, by placeholder name: its constant tensors, and the
    buffers no method writes that export lifted from literals (QNN's export passes register
    those as buffers, keeping their names). Weights and every other buffer stay out: folding a
    weight's ops would duplicate it, and a written buffer is no constant."""
    signature = program.graph_signature
    written = set(signature.buffers_to_mutate.values())
    literals = {
        name: program.constants[target]
        for name, target in signature.inputs_to_lifted_tensor_constants.items()
    }
    for name, target in signature.inputs_to_buffers.items():
        if target.startswith(_LIFTED) and target not in written:
            state = program.state_dict if target in program.state_dict else program.constants
            literals[name] = state[target]
    return literals


def folding_pass() -> Any:
    """`fold_constant_subgraphs` as an ExecuTorch program pass: a graph-module pass cannot read
    the program's lifted literals. Imported here: ExecuTorch is this backend's, not the module's."""
    from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

    # ExecuTorch's pass base is untyped; its pass manager calls `call` with the whole program.
    class FoldConstantSubgraphs(ExportedProgramPassBase):  # type: ignore[misc]
        def call(self, program: Any) -> Any:
            result = fold_constant_subgraphs(program.graph_module, lifted_literals(program))
            return ExportedProgramPassResult(program, result.modified)

    return FoldConstantSubgraphs()
