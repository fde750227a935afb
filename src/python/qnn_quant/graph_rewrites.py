"""Graph rewrites applied before any quantizer annotates: same math, in the form quantizers know.

Quantizers annotate weight-carrying layers by op: `aten.linear` (and conv). A matrix product with
a constant weight spelled another way is the same layer but is not annotated, so it stays float:
Hugging Face's `Conv1D` (GPT-2, its attention and MLP projections) computes
`addmm(bias, x, weight)`, and hand-written layers `x @ weight` (`mm` / `matmul`). A GPT-2 asked for
8a8w got no q/dq at all in its projections. Each becomes `linear(x, weight.t(), bias)`, which
computes the same values and is quantized like any linear (per-channel weights included: the
transposed weight's rows are the output channels).

A layer whose weight is a *view* of a constant (`linear(x, conv.weight.reshape(o, i))`: one
weight shared by a convolution and a linear) gets that view folded into a constant of its own
(`constant_weight_views_folded`). Left as a view, the quantizer treats the view as an
activation: the shared weight was quantized per tensor at the activation's bits, then again per
channel for the linear, and QNN's lowering failed on the re-quantization (`AnnotateQuantAttrs`:
`KeyError: 'scale'`), as it does for the plain upstream calls.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from qnn_quant.graph_params import add_param, give_fake_values, owner

aten = torch.ops.aten


def _constant(node: Any) -> bool:
    """A parameter or buffer of the module (get_attr), 2-D."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return False
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 2


def _linear_args(node: torch.fx.Node) -> tuple[Any, torch.fx.Node, Any] | None:
    """(input, weight, bias or None) when `node` is a constant-weight matrix product."""
    if node.op != "call_function":
        return None
    if node.target is aten.addmm.default:
        bias, x, weight = node.args[:3]
        scalars = [node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)]
        if any(s != 1 for s in scalars) or not _constant(weight):
            return None
        bias_val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
        if not isinstance(bias_val, torch.Tensor) or bias_val.dim() != 1:
            return None  # a 2-D bias is no linear's
        assert isinstance(weight, torch.fx.Node)
        return x, weight, bias
    if node.target in (aten.mm.default, aten.matmul.default):
        x, weight = node.args[:2]
        if not _constant(weight):
            return None
        assert isinstance(weight, torch.fx.Node)
        return x, weight, None
    return None


def constant_matmuls_as_linear(gm: torch.fx.GraphModule) -> int:
    """Rewrite addmm / mm / matmul with a constant 2-D weight as linear in place; the count.

    The linear node keeps the original's metadata (its nn.Module path, so `keep_float` patterns
    still match it).
    """
    count = 0
    for node in list(gm.graph.nodes):
        found = _linear_args(node)
        if found is None:
            continue
        x, weight, bias = found
        w_val = weight.meta["val"]
        with gm.graph.inserting_before(node):
            transposed = gm.graph.call_function(aten.t.default, (weight,))
            transposed.meta = {**node.meta, "val": w_val.t()}
            args = (x, transposed) if bias is None else (x, transposed, bias)
            linear = gm.graph.call_function(aten.linear.default, args)
        linear.meta = dict(node.meta)
        node.replace_all_uses_with(linear)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


# Ops that only re-index their input: a chain of them over a constant is a constant.
_VIEWS = frozenset({
    aten.t.default, aten.permute.default, aten.transpose.int, aten.reshape.default,
    aten.view.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default,
    aten.squeeze.dims, aten.flatten.using_ints, aten.contiguous.default,
})
_WEIGHTED = frozenset({
    aten.linear.default, aten.conv1d.default, aten.conv2d.default, aten.conv3d.default,
})


def _view_chain(node: Any) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    """(the constant, the views applied to it in order) when `node` is a non-empty chain of
    views over a get_attr, else None."""
    chain: list[torch.fx.Node] = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" \
            and node.target in _VIEWS:
        chain.append(node)
        node = node.args[0]
    if not chain or not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    return node, chain[::-1]


def constant_weight_views_folded(gm: torch.fx.GraphModule) -> int:
    """Give every linear / convolution whose weight is a view of a constant that view as a
    constant of its own, in place; the count. The constant itself is kept for its other uses."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _WEIGHTED or len(node.args) < 2:
            continue
        found = _view_chain(node.args[1])
        if found is None:
            continue
        root, chain = found
        holder, leaf = owner(gm, str(root.target))
        value = getattr(holder, leaf)
        with torch.no_grad():
            folded = value.detach()
            for view in chain:
                op = view.target
                assert callable(op)  # a call_function node in _VIEWS: an aten op
                folded = op(folded, *view.args[1:], **view.kwargs)
            folded = folded.contiguous().clone()
        name = add_param(gm, f"{root.target}_folded", folded)
        with gm.graph.inserting_before(node):
            weight = gm.graph.get_attr(name)
        weight.meta = dict(chain[-1].meta)
        node.replace_input_with(chain[-1], weight)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return count


def linears_as_pointwise_convs(
    gm: torch.fx.GraphModule, wanted: Callable[[torch.fx.Node], bool]
) -> list[torch.fx.Node]:
    """Rewrite each constant-weight linear for which `wanted(node)` holds as a 1x1 convolution
    in place (upstream's `convert_linear_to_conv2d`, done on the graph); the new conv nodes.

    `x (..., in)` is viewed as `(1, in, 1, N)` (N the leading dims' product), convolved with the
    weight viewed as `(out, in, 1, 1)`, and viewed back as `(..., out)`: the same values. The
    HTP's block-quantized (LPBQ) weights are right on pointwise convolutions, which is how
    upstream runs its LLMs' linears, and wrong on QNN's FullyConnected op on the x86 emulator
    (docs/known-limits.md). Every new node keeps the linear's metadata (its module path).
    """
    convs: list[torch.fx.Node] = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.linear.default:
            continue
        x, weight = node.args[:2]
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        if not _constant(weight) or not wanted(node):
            continue
        assert isinstance(x, torch.fx.Node) and isinstance(weight, torch.fx.Node)
        out_shape = list(node.meta["val"].shape)
        if len(out_shape) < 2 or not all(isinstance(size, int) for size in out_shape):
            continue  # one row (upstream's rewrite takes 2-D and 3-D), or a dynamic dim
        rows, in_features = math.prod(out_shape[:-1]), weight.meta["val"].shape[1]
        value = operator.attrgetter(str(weight.target))(gm).detach()
        name = add_param(gm, f"{weight.target}_pointwise", value[:, :, None, None])
        graph = gm.graph
        before = set(graph.nodes)
        with graph.inserting_before(node):
            conv_weight = graph.get_attr(name)
            as_rows = graph.call_function(aten.reshape.default, (x, [1, rows, 1, in_features]))
            image = graph.call_function(aten.transpose.int, (as_rows, 1, 3))
            conv = graph.call_function(aten.conv2d.default, (image, conv_weight, bias))
            back = graph.call_function(aten.permute.default, (conv, [0, 3, 1, 2]))
            out = graph.call_function(aten.reshape.default, (back, out_shape))
        give_fake_values(gm, node, [n for n in graph.nodes if n not in before])
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        convs.append(conv)
    if convs:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return convs
