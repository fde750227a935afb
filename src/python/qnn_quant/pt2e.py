"""Post-training quantization of an ExportedProgram with torchao's PT2E flow.

export -> prepare_pt2e(backend quantizer) -> calibrate -> convert_pt2e -> export again. The result
is an ordinary ExportedProgram holding quantize/dequantize ops around float compute ("fake
quant"): it runs eagerly in PyTorch, saves with torch.export.save, and lowers with
to_edge_transform_and_lower (XnnpackPartitioner, or the QNN partitioner) into integer kernels.

The quantizer comes from the target's backend (`qnn_quant.quantizers`: xnnpack, also for
portable, and qnn); each module says what it annotates and why.

Which layers stay in float and which quantize their activations at run time (dynamic) is
`qnn_quant.layers`' business; its docstring has the measurements behind the defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from qnn_common.cli.noise import printed_noise_filtered
from qnn_common.config import DEFAULT_LPBQ_BLOCK
from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import (
    Backend,
    Recipe,
    WeightGroups,
    check_recipe,
)
from qnn_common.target import Target
from qnn_common.weight_groups import (
    GroupMapping,
    default_group_mapping,
)
from qnn_quant.graph_rewrites import constant_matmuls_as_linear, constant_weight_views_folded
from qnn_quant.layers import LayerPlan, int8_linears, plan_layers
from qnn_quant.quantized_ops import NothingQuantizedError, is_observer, quantized_op_count
from qnn_quant.quantizers import decomposed_before_annotation, quantizer_for
from qnn_quant.quantizers.spec import QuantizerSpec
from qnn_quant.released_memory import (
    drop_unused_tensors,
    forget_prepared_modules,
    weight_bytes,
)

log = logging.getLogger(__name__)

def weight_bits(recipe: Recipe) -> int:
    """The weight bit width of a quantized recipe."""
    bits = recipe.weight_bits
    assert bits is not None, recipe  # a quantized recipe
    return bits


def float_graph(ep: ExportedProgram, backend: Backend | None = None) -> torch.fx.GraphModule:
    """`ep` as the float graph module the quantizer annotates (constant matmuls as linears;
    with `backend`, the ops its quantizer needs decomposed first)."""
    if writes_into_a_view(ep):
        # `cache[2:4] = rows`: PT2E quantizes a later reader's input where the buffer is
        # defined, before the write, and the program silently reads the old values. Made
        # functional (the write a slice_scatter, the buffer's update an output), every read
        # names the value it reads.
        ep = ep.run_decompositions({})
    ops = decomposed_before_annotation(backend) if backend is not None else ()
    # Only when one is there: a decomposition traces the whole program again.
    if any(n.target in ops for n in ep.graph.nodes):
        from torch._decomp import get_decompositions

        ep = ep.run_decompositions(get_decompositions(list(ops)))
    graph_module = ep.module()
    rewritten = constant_matmuls_as_linear(graph_module)
    if rewritten:
        log.info("%d constant-weight addmm / mm / matmul rewritten as linear", rewritten)
    folded = constant_weight_views_folded(graph_module)
    if folded:
        log.info("%d layer weights that were views of a constant folded into constants", folded)
    return graph_module


def writes_into_a_view(ep: ExportedProgram) -> bool:
    """Whether an op of `ep` writes in place into a view of one of its buffers (a slice of a
    cache) rather than into the buffer itself."""
    buffers = set(ep.graph_signature.inputs_to_buffers)
    for node in ep.graph.nodes:
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        arguments = op._schema.arguments
        if not arguments or arguments[0].alias_info is None or not arguments[0].alias_info.is_write:
            continue
        dest = node.args[0] if node.args else None
        if not isinstance(dest, torch.fx.Node) or not _is_view(dest):
            continue
        while _is_view(dest) and isinstance(dest.args[0], torch.fx.Node):
            dest = dest.args[0]
        if dest.op == "placeholder" and dest.name in buffers:
            return True
    return False


def _is_view(node: torch.fx.Node) -> bool:
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
        return False
    returns = op._schema.returns
    alias = returns[0].alias_info if returns else None
    return alias is not None and not alias.is_write


def prepare_program(
    ep: ExportedProgram,
    *,
    target: Target,
    recipe: Recipe,
    per_channel: bool = True,
    block_size: int = DEFAULT_LPBQ_BLOCK,
    group_mapping: GroupMapping | None = None,
    keep_float: Sequence[str] | None = None,
    dynamic_layers: Sequence[str] | None = None,
    graph_module: torch.fx.GraphModule | None = None,
    plan: LayerPlan | None = None,
    int8_weights: Sequence[str] | None = None,
    layer_recipes: Sequence[LayerRecipe] = (),
) -> torch.fx.GraphModule:
    """`ep` with the target's observers inserted (torchao `prepare_pt2e`), ready to calibrate.

    The recipe is checked against the target first; see `quantize_program` for the arguments
    (`int8_weights`: 16a4w_block's linears with 8-bit weights, `layers.int8_linears`).
    `graph_module`: `float_graph(ep)` when the caller already has it (e.g. GPTQ-rounded);
    `plan`: its `qnn_quant.layers.plan_layers`, which then replaces keep_float / dynamic_layers
    / layer_recipes.
    """
    _check_quantizable(target, recipe)

    # Imported here: torchao and executorch take seconds to import and are only needed now.
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    if graph_module is None:
        graph_module = float_graph(ep, target.backend)
    if plan is None:
        plan = plan_layers(graph_module, target, recipe, keep_float, dynamic_layers,
                           layer_recipes)
    spec = QuantizerSpec(
        target, recipe, per_channel, block_size, plan.float_nodes, plan.dynamic_nodes,
        group_mapping or default_group_mapping(_grouped_recipe(recipe, plan.layer_recipes)),
        int8_linears(graph_module, int8_weights) - plan.tabled_nodes
        if recipe.traits.weight_groups is WeightGroups.LPBQ else frozenset(),
        plan.layer_recipes,
    )
    quantizer = quantizer_for(spec, graph_module)
    # The QNN quantizer print()s a line per node of an op it has no config for (dropout...).
    with printed_noise_filtered():
        prepared: torch.fx.GraphModule = prepare_pt2e(graph_module, quantizer)
    if not any(is_observer(n) for n in prepared.graph.nodes):
        raise NothingQuantizedError(target, recipe, graph_module, len(plan.float_nodes))
    return prepared


def _grouped_recipe(recipe: Recipe, table: Sequence[LayerRecipe]) -> Recipe:
    """The recipe whose 4-bit groups (or LPBQ blocks) a program holds: its own, else the first
    grouped one its per-layer table gives (a 16a8w program with some layers in LPBQ blocks)."""
    if recipe.has_weight_groups:
        return recipe
    return next((e.recipe for e in table if e.recipe.has_weight_groups), recipe)


def convert_program(
    ep: ExportedProgram,
    prepared: torch.fx.GraphModule,
    *,
    target: Target,
    recipe: Recipe,
    samples: Sequence[tuple[torch.Tensor, ...]] = (),
) -> ExportedProgram:
    """Convert a calibrated `prepared` module (of `ep`) to q/dq ops and export it again.

    `prepared` is consumed: once exported, it lets go of its tensors (the program holds those it
    reads), so that the caller's quantized program is the one copy of its weights.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    freed = weight_bytes([ep])  # the float weights the prepared module was built over
    converted = convert_pt2e(prepared)
    if quantized_op_count(converted) == 0:
        forget_prepared_modules(freed)
        raise NothingQuantizedError(target, recipe, converted, 0)
    dropped = drop_unused_tensors(converted)
    if dropped:
        log.debug("%d float tensors the quantized graph no longer reads dropped", dropped)
    example_args, example_kwargs = _example_inputs(ep, samples)
    program = torch.export.export(converted, example_args, example_kwargs, strict=False)
    # The converted module is a reference cycle (its graph, and PT2E's train / eval guards bound
    # to it), which lives until a full collection runs: emptied, it holds nothing big meanwhile.
    for module in converted.modules():
        module._parameters.clear()
        module._buffers.clear()
    forget_prepared_modules(freed)
    return program


def _check_quantizable(target: Target, recipe: Recipe) -> None:
    if not recipe.is_quantized:
        raise ConfigValidationError(
            "quantize.recipe",
            recipe.value,
            "a float recipe needs no quantization; skip the quantize stage and compile the "
            "exported program directly",
            allowed=tuple(r.value for r in Recipe if r.is_quantized),
        )
    check_recipe(target.backend, recipe, target.soc, field="quantize.recipe")


def _example_inputs(
    ep: ExportedProgram, samples: Sequence[tuple[torch.Tensor, ...]]
) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
    if ep.example_inputs is not None:
        args, kwargs = ep.example_inputs
        return tuple(args), dict(kwargs) if kwargs else None
    return tuple(samples[0]), None
