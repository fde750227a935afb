"""How a quantized program holds each layer's weights, read from its graph."""

from __future__ import annotations

import torch

from qnn_quant.layers import module_path

_WEIGHT_OPS = (torch.ops.aten.linear.default, torch.ops.aten.conv2d.default)


def weight_grids(program: torch.export.ExportedProgram) -> dict[str, tuple[str, int | None]]:
    """Module path -> (how its weight is dequantized, the weight grid's largest level) for every
    linear or convolution of `program` (a plain float weight: ("float", None); a layer in LPBQ
    blocks: ("blocks", None), whatever its asymmetric blocks' offset linears hold)."""
    out: dict[str, tuple[str, int | None]] = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in _WEIGHT_OPS:
            continue
        path = module_path(node)
        assert path is not None
        if out.get(path, ("",))[0] == "blocks":
            continue
        weight = node.args[1]
        assert isinstance(weight, torch.fx.Node)
        if weight.target == torch.ops.quantized_decomposed.dequantize_per_channel.default:
            quant_max = weight.args[5]
            assert isinstance(quant_max, int)
            out[path] = ("per channel", quant_max)
        elif str(weight.target) == "torchao.dequantize_affine.default":
            out[path] = ("blocks", None)
        else:
            out[path] = ("float", None)
    return out
