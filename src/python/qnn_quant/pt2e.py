"""Post-training quantization of an ExportedProgram with torchao's PT2E flow.

export -> prepare_pt2e(backend quantizer) -> calibrate -> convert_pt2e -> export again. The result
is an ordinary ExportedProgram holding quantize/dequantize ops around float compute ("fake
quant"): it runs eagerly in PyTorch, saves with torch.export.save, and lowers with
to_edge_transform_and_lower (XnnpackPartitioner, or the QNN partitioner) into integer kernels.

Backend choices, and why:

* XNNPACK (recipe 8a8w): XNNPACKQuantizer, symmetric per-channel int8 weights, int8 per-tensor
  activations (HistogramObserver), annotating linear, conv (with fused relu / batch norm) and
  adaptive average pooling only. Its global config would also quantize every add and mul; in
  transformers those are residual adds whose outputs carry a few outlier channels (|x| ~ 200 in
  all-MiniLM-L6-v2, against a typical 1), and one int8 scale over them erases every other
  channel. Float adds still lower to XNNPACK's fp32 kernels.
* 8-bit activations, any backend: `OUTLIER_LAYERS` stay in float unless the caller says
  otherwise. BERT-family FFN down projections (BertOutput.dense) are where those outlier channels
  are written (Bondarenko et al. 2021, "Understanding and Overcoming the Challenges of Efficient
  Transformer Quantization"); an int8 scale for their output is ~200x too coarse for the rest.
  Measured on all-MiniLM-L6-v2, XNNPACK 8a8w, 8 built-in calibration sentences, 8 held-out ones,
  seq 32, embedding cosine vs fp32 (mean, worst): upstream's global config 0.841, 0.706; linear
  and conv only 0.936, 0.851; also these six linears in float (the default) 0.993, 0.978
  (seq 128: 0.989, 0.963). 16-bit activations have the range to spare, so those recipes
  quantize them. On QNN a float layer runs outside the HTP (a partition break): pass
  ``keep_float=()`` to trade that accuracy for one partition.
* QNN (any quantized recipe the SoC supports): ExecuTorch's QnnQuantizer with
  set_default_quant_config(QuantDtype, per-channel conv and linear, MinMaxObserver activations;
  see `_qnn_quantizer` for why not its default observer). 16a4w_block additionally sets
  per-block (LPBQ) weights on every linear whose input size divides into blocks of 16.

Known upstream bug worked around: XNNPACKQuantizer.transform_for_annotation turns every scalar
argument of aten.add/mul into a float tensor, integer ones too. transformers builds causal masks
with integer arange arithmetic, so calibration then fails with "IndexError: tensors used as
indices must be long, int, byte or bool tensors". `_float_scalars_to_attrs` converts scalars
only on ops that produce floating-point tensors.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from tqdm import tqdm

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Backend, Recipe, check_recipe
from qnn_common.soc import Soc, lookup_soc

# The SoC assumed for QNN when the caller names none: the one the QNN path was verified on.
DEFAULT_QNN_SOC = "SM8650"

# Recipe -> QuantDtype member name. Looked up by name and tested with `is None`: QuantDtype is an
# IntEnum whose use_16a16w is 0, so `if dtype:` would silently drop 16a16w.
_QNN_DTYPES: dict[Recipe, str] = {
    Recipe.A8W8: "use_8a8w",
    Recipe.A8W4: "use_8a4w",
    Recipe.A16W8: "use_16a8w",
    Recipe.A16W16: "use_16a16w",
    Recipe.A16W4: "use_16a4w",
    Recipe.A16W4_BLOCK: "use_16a4w_block",
    Recipe.A16W2: "use_16a2w",
}

# Layers left in float under 8-bit activations by default (regular expressions searched in the
# nn.Module path). See the module docstring for why and for the measurements.
OUTLIER_LAYERS: tuple[str, ...] = (r"encoder\.layer\.\d+\.output\.dense$",)

# LPBQ block along a linear weight's input dimension (upstream's Llama export uses the same).
_LPBQ_BLOCK = 16


def quantize_program(
    ep: ExportedProgram,
    *,
    backend: Backend,
    recipe: Recipe,
    calibration: Sequence[tuple[torch.Tensor, ...]],
    per_channel: bool = True,
    progress: bool = True,
    soc: Soc | None = None,
    keep_float: Sequence[str] | None = None,
) -> ExportedProgram:
    """Quantize `ep` for `backend` at `recipe`, calibrating on `calibration`; return a new program.

    `soc` only matters for QNN (default `DEFAULT_QNN_SOC`): it decides which recipes are legal.
    `keep_float` holds regular expressions searched in each node's nn.Module path (e.g.
    ``^head$``); matching layers stay in float. None means `OUTLIER_LAYERS` for 8-bit activation
    recipes and nothing otherwise; pass ``()`` to quantize every layer the quantizer supports.
    Raises ConfigValidationError for float recipes, recipes the backend cannot run, bad patterns
    and calibration samples that do not fit the program.
    """
    if not recipe.is_quantized:
        raise ConfigValidationError(
            "quantize.recipe",
            recipe.value,
            "a float recipe needs no quantization; skip the quantize stage and compile the "
            "exported program directly",
            allowed=tuple(r.value for r in Recipe if r.is_quantized),
        )
    if backend is Backend.QNN and soc is None:
        soc = lookup_soc(DEFAULT_QNN_SOC)
    check_recipe(backend, recipe, soc, field="quantize.recipe")
    samples = _check_calibration(ep, calibration)
    if keep_float is None:
        keep_float = OUTLIER_LAYERS if recipe.activation_bits == 8 else ()
    patterns = _compile_patterns(keep_float)

    # Imported here: torchao and executorch take seconds to import and are only needed now.
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    graph_module = ep.module()
    float_nodes = _nodes_under(graph_module, patterns)
    if backend in (Backend.XNNPACK, Backend.PORTABLE):
        # Portable runs the standard quantized_decomposed q/dq representation XNNPACK's
        # quantizer produces; its kernels then compute exactly what fake quant computes.
        quantizer = _xnnpack_quantizer(per_channel, graph_module, float_nodes)
    else:
        assert soc is not None
        quantizer = _qnn_quantizer(recipe, per_channel, soc, graph_module, float_nodes)

    prepared = prepare_pt2e(graph_module, quantizer)
    with torch.no_grad():
        for sample in tqdm(samples, desc="calibrate", unit="sample", disable=not progress):
            prepared(*sample)
    converted = convert_pt2e(prepared)
    example_args, example_kwargs = _example_inputs(ep, samples)
    return torch.export.export(converted, example_args, example_kwargs, strict=False)


# --------------------------------------------------------------------------------------------
# Validation.


def _example_inputs(
    ep: ExportedProgram, samples: Sequence[tuple[torch.Tensor, ...]]
) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
    if ep.example_inputs is not None:
        args, kwargs = ep.example_inputs
        return tuple(args), dict(kwargs) if kwargs else None
    return tuple(samples[0]), None


def _input_specs(ep: ExportedProgram) -> list[torch.Tensor] | None:
    """Fake tensors of the program's user inputs, or None if they cannot be read."""
    user_inputs = set(ep.graph_signature.user_inputs)
    vals = [
        n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder" and n.name in user_inputs
    ]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    return [v for v in vals if isinstance(v, torch.Tensor)]


def _check_calibration(
    ep: ExportedProgram, calibration: Sequence[tuple[torch.Tensor, ...]]
) -> list[tuple[torch.Tensor, ...]]:
    field = "calibration"
    samples = [tuple(s) for s in calibration]
    if not samples:
        raise ConfigValidationError(field, 0, "need at least one calibration sample")
    specs = _input_specs(ep)
    if specs is None:
        return samples
    for i, sample in enumerate(samples):
        if len(sample) != len(specs):
            raise ConfigValidationError(
                field, f"sample {i}", f"has {len(sample)} tensors, the program takes {len(specs)}"
            )
        for j, (got, want) in enumerate(zip(sample, specs, strict=True)):
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


# --------------------------------------------------------------------------------------------
# XNNPACK.


def _float_scalars_to_attrs(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """XNNPACKQuantizer.transform_for_annotation, minus its integer-scalar bug.

    Scalars of aten.add/mul become 0-d tensor attributes so the add/mul annotators see two
    tensor inputs, but only where the op's result is floating point: integer results are index
    arithmetic, and a float operand would turn them into float tensors used as indices.
    """
    from torchao.quantization.pt2e.utils import get_new_attr_name_with_prefix

    targets = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
    for node in list(model.graph.nodes):
        if node.op != "call_function" or node.target not in targets:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
            continue
        new_args: list[Any] = []
        for arg in node.args:
            if not isinstance(arg, int | float) or isinstance(arg, bool):
                new_args.append(arg)
                continue
            name = get_new_attr_name_with_prefix("_tensor_constant_")(model)
            value = torch.tensor(float(arg))
            model.register_buffer(name, value)
            with model.graph.inserting_before(node):
                attr = model.graph.get_attr(name)
            fake_mode = getattr(val, "fake_mode", None)
            if fake_mode is not None:
                attr.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
            new_args.append(attr)
        node.args = tuple(new_args)
    model.recompile()
    return model


def _xnnpack_quantizer(
    per_channel: bool, gm: torch.fx.GraphModule, float_nodes: frozenset[str]
) -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=per_channel)
    quantizer = XNNPACKQuantizer()
    aten = torch.ops.aten
    # op families: (ops that trigger it, op handed to set_operator_type). set_operator_type(op)
    # runs every XNNPACK pattern containing op (linear -> linear, linear_relu; conv2d -> conv,
    # conv_relu, conv_bn, conv_bn_relu). Only families present in the graph are registered:
    # each pattern is traced with torch.export when annotating, seconds per conv family.
    families = (
        ((aten.linear.default,), aten.linear.default),
        ((aten.conv1d.default, aten.conv2d.default, aten.convolution.default), aten.conv2d.default),
        ((aten.conv_transpose1d.default, aten.conv_transpose2d.input), aten.conv_transpose2d.input),
        ((aten.adaptive_avg_pool2d.default,), aten.adaptive_avg_pool2d.default),
    )
    present = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    for triggers, op in families:
        if present.intersection(triggers):
            quantizer.set_operator_type(op, config)
    if float_nodes:
        quantizer.set_filter_function(lambda node: node.name not in float_nodes)
    # An instance attribute shadows the buggy method; prepare_pt2e looks it up on the instance.
    quantizer.transform_for_annotation = _float_scalars_to_attrs
    return quantizer


# --------------------------------------------------------------------------------------------
# QNN.


@contextlib.contextmanager
def _no_qnn_sdk_download() -> Iterator[None]:
    """Stop QnnQuantizer's constructor from trying to download the Qualcomm SDK.

    Building the quantizer probes the SDK for op constraints and, with QNN_SDK_ROOT unset,
    downloads the SDK from the internet first. Quantization does not need it (the probe falls
    back to no constraint checks), and these machines have no internet. An empty QNN_SDK_ROOT
    means "the caller manages the SDK"; it is set only for the constructor, and the setup module's
    "done" flag it leaves behind is reset so a later compile still sets the SDK up normally.
    """
    if "QNN_SDK_ROOT" in os.environ:
        yield
        return
    from executorch.backends.qualcomm.utils import qnn_sdk_setup

    was_ready = qnn_sdk_setup._sdk_ready
    os.environ["QNN_SDK_ROOT"] = ""
    try:
        yield
    finally:
        os.environ.pop("QNN_SDK_ROOT", None)
        qnn_sdk_setup._sdk_ready = was_ready


def _lpbq_block_sizes(gm: torch.fx.GraphModule) -> dict[str, tuple[int, ...]]:
    """Block sizes for every linear (and its weight) whose input size divides into blocks."""
    sizes: dict[str, tuple[int, ...]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target != torch.ops.aten.linear.default:
            continue
        weight = node.args[1]
        val = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.shape[-1] % _LPBQ_BLOCK == 0:
            sizes[node.name] = (1, _LPBQ_BLOCK)
            assert isinstance(weight, torch.fx.Node)
            sizes[weight.name] = (1, _LPBQ_BLOCK)
    return sizes


def _qnn_quantizer(
    recipe: Recipe,
    per_channel: bool,
    soc: Soc,
    gm: torch.fx.GraphModule,
    float_nodes: frozenset[str],
) -> Any:
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from torchao.quantization.pt2e import MinMaxObserver

    dtype_name = _QNN_DTYPES.get(recipe)
    if dtype_name is None:
        raise ConfigValidationError(
            "quantize.recipe",
            recipe.value,
            "no QNN quantization dtype for it",
            allowed=tuple(r.value for r in _QNN_DTYPES),
        )
    quant_dtype = getattr(QuantDtype, dtype_name)
    try:
        chipset = QcomChipset(soc.chipset_id)
    except ValueError as err:
        raise ConfigValidationError(
            "soc", soc.name, "this ExecuTorch build does not know that SoC"
        ) from err
    with _no_qnn_sdk_download():
        quantizer = QnnQuantizer(soc_model=chipset)
    # MinMaxObserver, not QnnQuantizer's default MovingAverageMinMaxObserver: that one (made for
    # QAT) moves 1 % per batch towards new extremes, so after a short calibration it holds
    # roughly the first sample's range and clips the rest. Measured on tiny-cnn, 8 calibration
    # images, scored on those same images: 16a16w 19.9 dB with it, i.e. no better than 8a8w.
    # Upstream's QNN LLM export passes MinMaxObserver too.
    quantizer.set_default_quant_config(
        quant_dtype,
        is_conv_per_channel=per_channel,
        is_linear_per_channel=per_channel,
        act_observer=MinMaxObserver,
    )
    if recipe is Recipe.A16W4_BLOCK:
        quantizer.set_block_size_map(_lpbq_block_sizes(gm))
    if float_nodes:
        quantizer.add_discard_nodes(sorted(float_nodes))
    return quantizer
