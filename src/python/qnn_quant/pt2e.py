"""Post-training quantization of an ExportedProgram with torchao's PT2E flow.

export -> prepare_pt2e(backend quantizer) -> calibrate -> convert_pt2e -> export again. The result
is an ordinary ExportedProgram holding quantize/dequantize ops around float compute ("fake
quant"): it runs eagerly in PyTorch, saves with torch.export.save, and lowers with
to_edge_transform_and_lower (XnnpackPartitioner, or the QNN partitioner) into integer kernels.

The quantizer comes from the target's backend (`qnn_quant.quantizers`: xnnpack, also for
portable, and qnn); each module says what it annotates and why.

One choice holds for every backend: under 8-bit activations `OUTLIER_LAYERS` stay in float unless
the caller says otherwise. BERT-family FFN down projections (BertOutput.dense) are where a few
outlier channels are written (|x| ~ 200 in all-MiniLM-L6-v2, against a typical 1; Bondarenko et
al. 2021, "Understanding and Overcoming the Challenges of Efficient Transformer Quantization"); an
int8 scale for their output is ~200x too coarse for the rest, and the residual stream carries
those channels through every residual add (BertOutput, BertSelfOutput), the embeddings' sum and
the attention scores' scale and mask adds. Measured on all-MiniLM-L6-v2, XNNPACK 8a8w, 8 built-in
calibration sentences, 8 held-out ones, seq 32, embedding cosine vs fp32 (mean, worst): upstream's
global config 0.841, 0.706; its linear / conv only 0.936, 0.851; the global config (what XNNPACK's
quantizer here annotates, 2026-11-30) with the six FFN down projections in float 0.830, also
their residual adds 0.984, 0.963, also the attention residual adds 0.986, 0.968, also the
embeddings 0.987, 0.964, also the attention scores (the XNNPACK / portable default) 0.993, 0.977;
the linear-only quantizer with the six projections in float measured 0.993, 0.978: no
regression. On QNN the default stays the six projections (`OUTLIER_LAYERS`): a float layer runs
outside the HTP (a partition break), and QNN's quantizer always annotated the adds; pass
``keep_float=()`` there to trade that accuracy for one partition. 16-bit activations have the
range to spare, so those recipes quantize everything.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from tqdm import tqdm

from qnn_common.config import DEFAULT_LPBQ_BLOCK
from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import (
    Backend,
    Recipe,
    WeightRounding,
    check_recipe,
    check_weight_rounding,
    default_weight_rounding,
)
from qnn_common.target import Target
from qnn_common.tensorio import ModelInputs, as_model_inputs
from qnn_quant.gptq import GptqResult, pin_weight_scales, round_weights
from qnn_quant.graph_rewrites import constant_matmuls_as_linear
from qnn_quant.quantized_ops import NothingQuantizedError, is_observer, quantized_op_count
from qnn_quant.quantizers import QuantizerSpec, quantizer_for

log = logging.getLogger(__name__)

# Layers left in float under 8-bit activations by default (regular expressions searched in the
# nn.Module path). See the module docstring for why and for the measurements.
OUTLIER_LAYERS: tuple[str, ...] = (
    r"encoder\.layer\.\d+\.output\.dense$",  # the FFN down projections that write the outliers
)
# Also left in float on XNNPACK / portable, whose quantizer annotates adds and muls: the ops the
# outlier channels flow through (see the module docstring).
RESIDUAL_STREAM: tuple[str, ...] = (
    r"encoder\.layer\.\d+\.output$",  # the FFN residual add (BertOutput)
    r"encoder\.layer\.\d+\.attention\.output$",  # the attention residual add (BertSelfOutput)
    r"attention\.self$",  # attention scores: scale and additive mask
    r"(^|\.)embeddings$",  # word + position + token type sum (BertEmbeddings)
)

def default_keep_float(target: Target, recipe: Recipe) -> tuple[str, ...]:
    """The layers left in float when the caller names none (the module docstring says why)."""
    if recipe.activation_bits != 8:
        return ()
    if target.backend is Backend.QNN:
        return OUTLIER_LAYERS
    return OUTLIER_LAYERS + RESIDUAL_STREAM


def quantize_program(
    ep: ExportedProgram,
    *,
    target: Target,
    recipe: Recipe,
    calibration: Sequence[tuple[torch.Tensor, ...] | ModelInputs],
    per_channel: bool = True,
    block_size: int = DEFAULT_LPBQ_BLOCK,
    progress: bool = True,
    keep_float: Sequence[str] | None = None,
    weight_rounding: WeightRounding | None = None,
) -> ExportedProgram:
    """Quantize `ep` for `target` at `recipe`, calibrating on `calibration`; return a new program.

    The target's SoC (QNN) decides which recipes are legal; the rules are checked before any work.
    `keep_float` holds regular expressions searched in each node's nn.Module path (e.g.
    ``^head$``); matching layers stay in float. None means `default_keep_float` (BERT-family
    outlier layers at 8-bit activations, nothing otherwise); pass ``()`` to quantize every layer
    the quantizer supports. `weight_rounding` None means the recipe's default (GPTQ for 4-bit
    per-channel weights, `qnn_common.recipes.default_weight_rounding`).
    Raises ConfigValidationError for float recipes, recipes the backend cannot run, bad patterns
    and calibration samples that do not fit the program. A sample is a tuple of positional
    arguments, or `ModelInputs` for a program that takes keyword arguments.
    """
    program, _ = quantize_program_with_gptq(
        ep, target=target, recipe=recipe, calibration=calibration, per_channel=per_channel,
        block_size=block_size, progress=progress, keep_float=keep_float,
        weight_rounding=weight_rounding,
    )
    return program


def quantize_program_with_gptq(
    ep: ExportedProgram,
    *,
    target: Target,
    recipe: Recipe,
    calibration: Sequence[tuple[torch.Tensor, ...] | ModelInputs],
    per_channel: bool = True,
    block_size: int = DEFAULT_LPBQ_BLOCK,
    progress: bool = True,
    keep_float: Sequence[str] | None = None,
    weight_rounding: WeightRounding | None = None,
) -> tuple[ExportedProgram, GptqResult | None]:
    """`quantize_program`, also returning what GPTQ did (None when weights rounded to nearest)."""
    _check_quantizable(target, recipe)
    rounding = weight_rounding or default_weight_rounding(recipe, per_channel)
    check_weight_rounding(recipe, rounding, per_channel, "quantize.weight_rounding")
    samples = _check_calibration(ep, calibration)

    def run(module: torch.nn.Module, desc: str) -> None:
        with torch.no_grad():
            for sample in tqdm(samples, desc=desc, unit="sample", disable=not progress):
                # A copy: a model that updates an input in place must not change our samples.
                inputs = sample.clone()
                module(*inputs.args, **inputs.kwargs)

    graph_module = float_graph(ep)
    floats = float_layer_nodes(graph_module, target, recipe, keep_float)
    result = None
    if rounding is WeightRounding.GPTQ:
        result = round_weights(
            {"forward": graph_module}, lambda: run(graph_module, "gptq"),
            bits=weight_bits(recipe), skip=lambda node: node.name in floats,
        )
    prepared = prepare_program(
        ep, target=target, recipe=recipe, per_channel=per_channel, block_size=block_size,
        keep_float=keep_float, graph_module=graph_module,
    )
    run(prepared, "calibrate")
    if result is not None:
        pin_weight_scales(prepared, result, weight_bits(recipe))
    first = tuple(samples[0].args)
    return convert_program(ep, prepared, target=target, recipe=recipe, samples=[first]), result


def weight_bits(recipe: Recipe) -> int:
    """The weight bit width of a quantized recipe."""
    bits = recipe.weight_bits
    assert bits is not None, recipe  # a quantized recipe
    return bits


def float_graph(ep: ExportedProgram) -> torch.fx.GraphModule:
    """`ep` as the float graph module the quantizer annotates (constant matmuls as linears)."""
    graph_module = ep.module()
    rewritten = constant_matmuls_as_linear(graph_module)
    if rewritten:
        log.info("%d constant-weight addmm / mm / matmul rewritten as linear", rewritten)
    return graph_module


def float_layer_nodes(
    graph_module: torch.fx.GraphModule, target: Target, recipe: Recipe,
    keep_float: Sequence[str] | None,
) -> frozenset[str]:
    """Names of the nodes `keep_float` (None: `default_keep_float`) leaves in float."""
    if keep_float is None:
        keep_float = default_keep_float(target, recipe)
    return _nodes_under(graph_module, _compile_patterns(keep_float))


def prepare_program(
    ep: ExportedProgram,
    *,
    target: Target,
    recipe: Recipe,
    per_channel: bool = True,
    block_size: int = DEFAULT_LPBQ_BLOCK,
    keep_float: Sequence[str] | None = None,
    graph_module: torch.fx.GraphModule | None = None,
) -> torch.fx.GraphModule:
    """`ep` with the target's observers inserted (torchao `prepare_pt2e`), ready to calibrate.

    The recipe is checked against the target first; see `quantize_program` for the arguments.
    `graph_module`: `float_graph(ep)` when the caller already has it (e.g. GPTQ-rounded).
    """
    _check_quantizable(target, recipe)

    # Imported here: torchao and executorch take seconds to import and are only needed now.
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    if graph_module is None:
        graph_module = float_graph(ep)
    float_nodes = float_layer_nodes(graph_module, target, recipe, keep_float)
    spec = QuantizerSpec(target, recipe, per_channel, block_size, float_nodes)
    quantizer = quantizer_for(spec, graph_module)
    prepared: torch.fx.GraphModule = prepare_pt2e(graph_module, quantizer)
    if not any(is_observer(n) for n in prepared.graph.nodes):
        raise NothingQuantizedError(target, recipe, graph_module, len(float_nodes))
    return prepared


def convert_program(
    ep: ExportedProgram,
    prepared: torch.fx.GraphModule,
    *,
    target: Target,
    recipe: Recipe,
    samples: Sequence[tuple[torch.Tensor, ...]] = (),
) -> ExportedProgram:
    """Convert a calibrated `prepared` module (of `ep`) to q/dq ops and export it again."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    converted = convert_pt2e(prepared)
    if quantized_op_count(converted) == 0:
        raise NothingQuantizedError(target, recipe, converted, 0)
    dropped = drop_unused_tensors(converted)
    if dropped:
        log.debug("%d float tensors the quantized graph no longer reads dropped", dropped)
    example_args, example_kwargs = _example_inputs(ep, samples)
    return torch.export.export(converted, example_args, example_kwargs, strict=False)


def drop_unused_tensors(gm: torch.fx.GraphModule) -> int:
    """Delete the parameters and buffers no node of `gm` reads; returns how many.

    convert_pt2e folds each quantized weight into a new int8 constant but leaves the float
    original on the module, and export lifts every parameter, read or not: MiniLM 8a8w's
    program carried 28 MB of float weights nothing used (99 MB on disk), saved, loaded and
    hashed by every later stage.
    """
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    names = [name for name, _ in gm.named_parameters(remove_duplicate=False)]
    names += [name for name, _ in gm.named_buffers(remove_duplicate=False)]
    dropped = 0
    for name in names:
        if name in used:
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        if hasattr(owner, attr):
            delattr(owner, attr)
            dropped += 1
    return dropped


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


def _input_values(ep: ExportedProgram) -> list[Any] | None:
    """The program's user inputs in order: fake tensors, and constants (int, None, ...) for
    the non-tensor inputs torch.export specialized; None if they cannot be read."""
    from torch.export.graph_signature import ConstantArgument, InputKind

    user_inputs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    values: list[Any] = []
    for spec in user_inputs:
        if isinstance(spec.arg, ConstantArgument):
            values.append(spec.arg.value)
            continue
        node = placeholders.get(getattr(spec.arg, "name", ""))
        val = node.meta.get("val") if node is not None else None
        if not isinstance(val, torch.Tensor):
            return None
        values.append(val)
    return values


def _check_calibration(
    ep: ExportedProgram, calibration: Sequence[tuple[torch.Tensor, ...] | ModelInputs]
) -> list[ModelInputs]:
    """The samples as ModelInputs, each checked against the program's flat user inputs (the
    pytree leaves of its args and kwargs; constants are checked by the program's own guards)."""
    field = "calibration"
    samples = [as_model_inputs(s) for s in calibration]
    if not samples:
        raise ConfigValidationError(field, 0, "need at least one calibration sample")
    specs = _input_values(ep)
    if specs is None:
        return samples
    for i, sample in enumerate(samples):
        leaves = sample.leaves()
        if len(leaves) != len(specs):
            raise ConfigValidationError(
                field, f"sample {i}",
                f"has {len(leaves)} inputs (pytree leaves of its args and kwargs), the program "
                f"takes {len(specs)}",
            )
        for j, (got, want) in enumerate(zip(leaves, specs, strict=True)):
            if not isinstance(want, torch.Tensor):
                continue
            if not isinstance(got, torch.Tensor):
                raise ConfigValidationError(
                    field, f"sample {i} input {j}", f"expected a tensor, got {got!r}"
                )
            if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
                raise ConfigValidationError(
                    field,
                    f"sample {i} input {j}",
                    f"expected {want.dtype} {list(want.shape)}, "
                    f"got {got.dtype} {list(got.shape)}",
                )
    return samples


def _compile_patterns(keep_float: Sequence[str]) -> list[re.Pattern[str]]:
    if isinstance(keep_float, str):
        keep_float = (keep_float,)
    out = []
    for p in keep_float:
        try:
            out.append(re.compile(p))
        except re.error as err:
            raise ConfigValidationError(
                "quantize.keep_float", p, f"not a regular expression: {err}"
            ) from err
    return out


def module_path(node: torch.fx.Node) -> str | None:
    """The innermost nn.Module path (e.g. ``hf.encoder.layer.0.output.dense``) of a node."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, _ = list(stack.values())[-1]
    return str(path)


def _nodes_under(gm: torch.fx.GraphModule, patterns: list[re.Pattern[str]]) -> frozenset[str]:
    """Names of call_function nodes whose module path matches any pattern."""
    if not patterns:
        return frozenset()
    names = set()
    for node in gm.graph.nodes:
        path = module_path(node) if node.op == "call_function" else None
        if path is not None and any(p.search(path) for p in patterns):
            names.add(node.name)
    return frozenset(names)


