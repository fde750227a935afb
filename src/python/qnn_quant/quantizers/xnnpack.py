"""XNNPACK's PT2E quantizer (also the one for portable, whose quantized_decomposed kernels compute
exactly what its fake quant computes).

Symmetric per-channel int8 weights, int8 per-tensor activations (HistogramObserver), annotating
linear, conv (with fused relu / batch norm) and adaptive average pooling only. Its global config
would also quantize every add and mul; in transformers those are residual adds whose outputs carry
a few outlier channels (|x| ~ 200 in all-MiniLM-L6-v2, against a typical 1), and one int8 scale
over them erases every other channel. Float adds still lower to XNNPACK's fp32 kernels.

Known upstream bug worked around: XNNPACKQuantizer.transform_for_annotation turns every scalar
argument of aten.add/mul into a float tensor, integer ones too. transformers builds causal masks
with integer arange arithmetic, so calibration then fails with "IndexError: tensors used as
indices must be long, int, byte or bool tensors". `_float_scalars_to_attrs` converts scalars
only on ops that produce floating-point tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from qnn_quant.quantizers import QuantizerSpec


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


def quantizer(spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any:
    """XNNPACKQuantizer: symmetric int8 (8a8w), per-channel weights unless told otherwise."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=spec.per_channel)
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
    if spec.float_nodes:
        quantizer.set_filter_function(lambda node: node.name not in spec.float_nodes)
    # An instance attribute shadows the buggy method; prepare_pt2e looks it up on the instance.
    quantizer.transform_for_annotation = _float_scalars_to_attrs
    return quantizer
