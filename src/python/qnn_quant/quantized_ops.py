"""Which ops of a converted program run quantized, and the error for a program where none do."""

from __future__ import annotations

import torch

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Recipe
from qnn_common.target import Target

_QDQ_NAMESPACES = ("quantized_decomposed", "torchao")


def _is_qdq(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and str(node.target).split(".")[0] in _QDQ_NAMESPACES


def is_observer(node: torch.fx.Node) -> bool:
    # prepare_pt2e names every observer (or fake-quant) module it inserts so.
    return node.op == "call_module" and str(node.target).startswith("activation_post_process")


def _output_quantized(node: torch.fx.Node, hops: int = 3) -> bool:
    """Whether `node`'s output is quantized, directly or after a fused chain of single-user ops
    (conv -> batch norm -> relu -> quantize: the pattern is one quantized op)."""
    for _ in range(hops):
        if any(_is_qdq(u) and "dequantize" not in str(u.target) for u in node.users):
            return True
        if len(node.users) != 1:
            return False
        (node,) = node.users
        if node.op != "call_function" or _is_qdq(node):
            return False
    return False


def _dynamically_quantized(node: torch.fx.Node) -> bool:
    """Whether `node` reads an activation quantized at run time: dequantize(quantize(x, scale))
    with a scale a `choose_qparams` computed from x (a dynamic linear; its output is float)."""
    for dq in node.all_input_nodes:
        if not (_is_qdq(dq) and "dequantize" in str(dq.target) and dq.args):
            continue
        q = dq.args[0]
        # quantized_decomposed.quantize_per_tensor(x, scale, ...); torchao's
        # quantize_affine(x, block_size, scale, ...) (8da4w: qnn_quant.intx).
        at = 2 if isinstance(q, torch.fx.Node) and str(q.target).startswith("torchao.") else 1
        scale = q.args[at] if isinstance(q, torch.fx.Node) and len(q.args) > at else None
        if isinstance(scale, torch.fx.Node) and scale.args and isinstance(
            scale.args[0], torch.fx.Node
        ) and "choose_qparams" in str(scale.args[0].target):
            return True
    return False


def _quantized_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Ops between q/dq pairs (they read a dequantized tensor and their output is quantized),
    and ops reading a dynamically quantized activation."""
    return [
        n for n in gm.graph.nodes
        if n.op == "call_function" and not _is_qdq(n)
        and any(_is_qdq(a) and "dequantize" in str(a.target) for a in n.all_input_nodes)
        and (_output_quantized(n) or _dynamically_quantized(n))
    ]


def dynamic_op_count(gm: torch.fx.GraphModule) -> int:
    """Ops whose activation input is quantized at run time (`qnn_quant.layers`)."""
    return sum(1 for n in _quantized_nodes(gm) if _dynamically_quantized(n))


def quantized_op_count(gm: torch.fx.GraphModule) -> int:
    """Ops that read a dequantized tensor and whose output is quantized (a fused relu / batch
    norm in between allowed), and dynamically quantized ops: the ops a backend runs quantized.
    Float ops that merely consume a quantized layer's output are not counted."""
    return len(_quantized_nodes(gm))


def quantized_op_kinds(gm: torch.fx.GraphModule) -> dict[str, int]:
    """`quantized_op_count` by ATen op name (``linear``, ``add``, ``cat`` ...), sorted by name."""
    counts: dict[str, int] = {}
    for node in _quantized_nodes(gm):
        name = getattr(node.target, "_opname", None) or str(node.target)
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


class NothingQuantizedError(ConfigValidationError):
    """A quantized recipe that quantized no op: the program would stay float under its label.

    Raised before calibration when the quantizer annotated nothing (and after conversion if no op
    reads a dequantized tensor). The message names the recipe, the target, the model's op kinds
    and what to do.
    """

    def __init__(
        self, target: Target, recipe: Recipe, gm: torch.fx.GraphModule, kept_float: int
    ) -> None:
        ops = sorted({
            str(getattr(n.target, "_opname", n.target)) for n in gm.graph.nodes
            if n.op == "call_function" and not _is_qdq(n)
        })
        shown = ", ".join(ops[:12]) + (" ..." if len(ops) > 12 else "")
        kept = (
            f"; quantize.keep_float left {kept_float} node(s) in float: loosen it"
            if kept_float else ""
        )
        super().__init__(
            "quantize.recipe",
            recipe.value,
            f"the {target} quantizer found no op to quantize in this model (its ops: {shown}), "
            f"so the program would stay float while labelled {recipe.value}{kept}; compile it "
            "at fp32 instead (--recipe fp32), or at fp16 on qnn",
        )
