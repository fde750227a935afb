"""XNNPACK's PT2E quantizer (also the one for portable, whose quantized_decomposed kernels compute
exactly what its fake quant computes).

Symmetric per-channel int8 weights, int8 per-tensor activations (HistogramObserver), annotating
everything the stock quantizer's global config annotates: linear, conv and transposed conv (with
fused relu / batch norm), add and mul (with fused relu), cat, adaptive average pooling, and the
ops that share their input's scale (max pooling, mean, relu / hardtanh, views, permutes,
slices). matmul / bmm and sub stay float, as in the stock quantizer (XNNPACK 1.5.1 runs bmm in
fp32 only). Which layers stay float and which linears quantize dynamically (the stock dynamic
config: activation scale chosen per call) is decided by `qnn_quant.layers`, not here.

Known upstream bug worked around: XNNPACKQuantizer.transform_for_annotation turns every scalar
argument of aten.add/mul into a float tensor, integer ones too. transformers builds causal masks
with integer arange arithmetic, so calibration then fails with "IndexError: tensors used as
indices must be long, int, byte or bool tensors". `_float_scalars_to_attrs` converts scalars
only on ops that produce floating-point tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from qnn_quant.quantizers.backend import QuantBackend
from qnn_quant.quantizers.spec import QuantizerSpec


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


def family_ops(present: set[Any]) -> list[Any]:
    """One op per stock XNNPACK pattern family with an op in `present`, in pattern order."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    chosen: list[Any] = []
    for pattern in XNNPACKQuantizer.SUPPORTED_PATTERNS:
        targets = set(pattern.op_overloads)
        hit = sorted(targets & present, key=str)
        if hit and not targets.intersection(chosen):
            chosen.append(hit[0])
    return chosen


def quantizer(spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any:
    """XNNPACKQuantizer: symmetric int8 (8a8w), per-channel weights unless told otherwise."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=spec.per_channel)
    quantizer = XNNPACKQuantizer()
    # What set_global(config) annotates, registered per op family present in the graph:
    # set_operator_type(op) runs every stock pattern whose targets hold op (linear -> linear,
    # linear_relu; conv2d -> conv, conv_relu, conv_bn, conv_bn_relu; add -> add, add_relu ...),
    # in the stock order, and skips families the model lacks: conv patterns are traced with
    # torch.export while annotating, seconds each.
    present = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    for op in family_ops(present):
        quantizer.set_operator_type(op, config)
    if spec.float_nodes:
        quantizer.set_filter_function(lambda node: node.name not in spec.float_nodes)
    # An instance attribute shadows the buggy method; prepare_pt2e looks it up on the instance.
    quantizer.transform_for_annotation = _float_scalars_to_attrs
    if not spec.dynamic_nodes:
        return quantizer
    return _with_dynamic_linears(quantizer, spec)


def _with_dynamic_linears(static: Any, spec: QuantizerSpec) -> Any:
    """`static`, after a quantizer that annotates `spec.dynamic_nodes` as dynamically quantized
    linears; the static one then skips the nodes already annotated."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantizer import ComposableQuantizer

    dynamic = XNNPACKQuantizer()
    dynamic.set_operator_type(
        torch.ops.aten.linear.default,
        get_symmetric_quantization_config(is_per_channel=spec.per_channel, is_dynamic=True),
    )
    dynamic.set_filter_function(lambda node: node.name in spec.dynamic_nodes)
    composed = ComposableQuantizer([dynamic, static])
    # ComposableQuantizer runs every member's transform; the stock one has the scalar bug.
    composed.transform_for_annotation = _float_scalars_to_attrs
    return composed


# XNNPACK's qd8 GEMMs choose a dynamically quantized activation's scale per row (per token).
BACKEND = QuantBackend(quantizer=quantizer, dynamic_scale_per_row=True)
