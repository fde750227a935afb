"""Float-to-integer casts that QNN's lowering would drop, made explicit before it sees them.

QNN's preprocess fuses every chain of casts into one cast from the chain's input to its last
dtype (`FuseConsecutiveCast`, ExecuTorch 1.5; its own comment marks `fp -> to(i32) -> to(fp)` as
a TODO). So `x.to(torch.int32).to(torch.float32)`, a common way to truncate, became `x` itself
on the HTP, silently. Before partitioning, a float-to-integer cast whose result is cast again
gets its input truncated explicitly, `sign(x) * floor(abs(x))` (ops QNN has; a comparison with a
number would not be delegated at this point), so the fused chain computes what torch does. A
cast whose integer result is used as such is left alone (QNN's Cast truncates, as torch does),
and so is a quantized graph's (its casts carry encodings these ops would not have).

In a quantized graph, QNN's Cast from a quantized float to an integer moves the codes, not the
values (`x.to(int32)` of an 8-bit tensor read 187 for 3.02; at 16 bits its op validation refuses
the cast). `keep_code_casts_on_cpu` marks such casts for ExecuTorch's CPU fallback, where the
value is dequantized first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.fx.passes.infra.pass_base import PassResult

from qnn_compile.constant_subgraphs import QUANT_ATTRS

_TRUNCATED = "qnn_truncated_input"  # a cast whose input this pass truncated


def _casts() -> frozenset[Any]:
    from executorch.exir.dialects._ops import ops as exir_ops

    return frozenset({
        exir_ops.edge.aten._to_copy.default,
        exir_ops.edge.dim_order_ops._to_dim_order_copy.default,
    })


def _dtype(node: Any) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _float_to_int_casts(gm: torch.fx.GraphModule) -> Iterator[tuple[torch.fx.Node, Any]]:
    """Each cast of `gm` from a float to an integer dtype other than bool, with its source."""
    casts = _casts()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in casts or not node.args:
            continue
        source, out = node.args[0], _dtype(node)
        src = _dtype(source)
        if src is None or out is None or not src.is_floating_point or out.is_floating_point:
            continue
        if out != torch.bool:
            yield node, source


def _quantized(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and QUANT_ATTRS in node.meta


def dropped_truncations(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The float-to-integer casts of `gm` whose result feeds another cast, in a float graph."""
    casts = _casts()
    return [
        node for node, source in _float_to_int_casts(gm)
        if _TRUNCATED not in node.meta and not _quantized(node) and not _quantized(source)
        and any(user.op == "call_function" and user.target in casts for user in node.users)
    ]


def truncate_before_int_casts(gm: torch.fx.GraphModule) -> int:
    """Truncate the input of every cast `dropped_truncations` finds; return how many."""
    from executorch.exir.dialects._ops import ops as exir_ops

    edge = exir_ops.edge.aten
    nodes = dropped_truncations(gm)
    for cast in nodes:
        source = cast.args[0]
        assert isinstance(source, torch.fx.Node)  # dropped_truncations read its dtype
        x = source.meta["val"]
        with gm.graph.inserting_before(cast):
            size = gm.graph.call_function(edge.abs.default, (source,))
            size.meta["val"] = torch.abs(x)
            whole = gm.graph.call_function(edge.floor.default, (size,))
            whole.meta["val"] = torch.floor(size.meta["val"])
            sign = gm.graph.call_function(edge.sign.default, (source,))
            sign.meta["val"] = torch.sign(x)
            truncated = gm.graph.call_function(edge.mul.Tensor, (sign, whole))
            truncated.meta["val"] = torch.mul(sign.meta["val"], whole.meta["val"])
        for new in (size, whole, sign, truncated):
            for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node"):
                if key in cast.meta:
                    new.meta[key] = cast.meta[key]
        cast.replace_input_with(source, truncated)
        cast.meta[_TRUNCATED] = True
    if nodes:
        gm.graph.lint()
        gm.recompile()
    return len(nodes)


def code_casts(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The casts of `gm` from a quantized float (its source carries QNN's encoding) to an
    integer."""
    return [node for node, source in _float_to_int_casts(gm) if _quantized(source)]


def keep_code_casts_on_cpu(gm: torch.fx.GraphModule) -> PassResult:
    """Mark every cast `code_casts` finds for ExecuTorch's CPU fallback (QNN's partitioner
    reads the mark)."""
    from executorch.backends.qualcomm.utils.constants import QCOM_FALLBACK_NODE

    nodes = code_casts(gm)
    for node in nodes:
        node.meta[QCOM_FALLBACK_NODE] = True
    return PassResult(gm, bool(nodes))


def truncation_pass(gm: torch.fx.GraphModule) -> PassResult:
    """`truncate_before_int_casts` as an edge pass (ExecuTorch takes a plain graph-module pass)."""
    return PassResult(gm, truncate_before_int_casts(gm) > 0)
