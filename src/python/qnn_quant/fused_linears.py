"""Linears that read one input (a decoder's q / k / v projections, its MLP's gate and up) made
one linear whose output is sliced back into theirs.

Why: with activations quantized per token at run time (8da4w), each linear quantizes its input
again and is a GEMM call of its own. One GEMM over the concatenated weights quantizes the input
once and makes one call where there were three (or two); in a decoder's decode step, one token
wide, those calls and the threadpool's hand-offs between them are a large part of the step.

Exact for the weight forms it is used with: each output row keeps its own per-row or per-group
scales, so concatenating rows changes no quantized value, and per-token activation scales see
the same input whichever linear reads it. Not for static activation quantization (PT2E):
there, each linear's output has a scale of its own, which one fused output would share.

Each slice carries the module path of the linear it replaces, so layer reports and module-path
patterns still find `q_proj`; the fused linear is named for its parts (``q_proj+k_proj+v_proj``).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from qnn_quant.graph_params import add_param, owner
from qnn_quant.layers import module_path


def _constants(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The weight (and bias) of an ``aten.linear`` when they are constants read by it alone;
    else None."""
    if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
        return None
    constants = [
        c for c in node.args[1:]
        if isinstance(c, torch.fx.Node) and c.op == "get_attr" and len(c.users) == 1
    ]
    return constants if constants and len(constants) == len(node.args) - 1 else None


def fused_path(paths: list[str]) -> str:
    """``a.b.q_proj``, ``a.b.k_proj`` -> ``a.b.q_proj+k_proj``: the parent, then each leaf."""
    parents = {p.rpartition(".")[0] for p in paths}
    if len(parents) == 1:
        parent = parents.pop()
        leaves = "+".join(p.rpartition(".")[2] for p in paths)
        return f"{parent}.{leaves}" if parent else leaves
    return "+".join(paths)


def _with_path(meta: dict[str, Any], path: str) -> dict[str, Any]:
    """`meta` (a node's; fx types its values as Any) with the innermost nn.Module path replaced
    by `path`."""
    stack: dict[str, tuple[str, Any]] = dict(meta.get("nn_module_stack") or {})
    if stack:
        key = list(stack)[-1]
        _, kind = stack[key]
        stack[key] = (path, kind)
    else:
        stack["fused"] = (path, torch.nn.Linear)
    return {**meta, "nn_module_stack": stack}


def fuse_linears_by_input(
    gm: torch.fx.GraphModule, eligible: Callable[[torch.fx.Node, torch.Tensor], bool]
) -> dict[str, list[str]]:
    """Fuse, in place, every set of two or more ``aten.linear`` nodes of `gm` that read the same
    input, have constant weights of one dtype and input size, all with or all without a bias,
    and that `eligible(node, weight)` accepts. Returns fused path -> the paths it replaced."""
    by_input: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    held: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    # A constant another get_attr also names (a tied embedding) must stay where it is.
    named = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")
    for node in gm.graph.nodes:
        found = _constants(node)
        if (
            found is None
            or not isinstance(node.args[0], torch.fx.Node)
            or any(named[c.target] > 1 for c in found)
        ):
            continue
        weight = operator.attrgetter(str(found[0].target))(gm)
        if weight.dim() == 2 and eligible(node, weight):
            by_input.setdefault(node.args[0], []).append(node)
            held[node] = found
    fused: dict[str, list[str]] = {}
    for x, linears in by_input.items():
        constants = [[operator.attrgetter(str(c.target))(gm) for c in held[n]] for n in linears]
        weights = [c[0] for c in constants]
        if (
            len(linears) < 2
            or len({(w.shape[1], w.dtype) for w in weights}) != 1
            or len({len(c) for c in constants}) != 1
        ):
            continue
        paths = [module_path(n) or n.name for n in linears]
        path = fused_path(paths)
        fused[path] = paths
        _fuse(gm, x, linears, constants, [held[n] for n in linears], path)
    if fused:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return fused


def _fuse(
    gm: torch.fx.GraphModule, x: torch.fx.Node, linears: list[torch.fx.Node],
    constants: list[list[torch.Tensor]], constant_nodes: list[list[torch.fx.Node]], path: str,
) -> None:
    graph = gm.graph
    names = [add_param(gm, f"{path}.weight", torch.cat([c[0] for c in constants]))]
    if len(constants[0]) == 2:
        names.append(add_param(gm, f"{path}.bias", torch.cat([c[1] for c in constants])))
    first = linears[0]
    with graph.inserting_before(first):
        args = [graph.get_attr(name) for name in names]
        linear = graph.call_function(torch.ops.aten.linear.default, (x, *args))
    linear.meta = _with_path(first.meta, path)
    start = 0
    previous = linear
    for node, parts in zip(linears, constants, strict=True):
        end = start + parts[0].shape[0]
        with graph.inserting_after(previous):
            part = graph.call_function(torch.ops.aten.slice.Tensor, (linear, -1, start, end))
        part.meta = dict(node.meta)
        node.replace_all_uses_with(part)
        previous, start = part, end
    for node, old in zip(linears, constant_nodes, strict=True):
        graph.erase_node(node)
        for constant in old:
            holder, leaf = owner(gm, str(constant.target))
            graph.erase_node(constant)
            delattr(holder, leaf)  # the float weight lives on in the fused one only
