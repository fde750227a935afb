"""Counting a lowered program's operators: inside delegates, and left to the portable kernels.

The compile report's numbers (`LoweredProgram.delegated_ops`, `non_delegated_ops`, `op_counts`)
and the op names they are keyed by, which match the names devtools' Inspector prints.
"""

from __future__ import annotations

import collections
import operator
from typing import Any

import torch
import torch.fx

# Top-level nodes that are plumbing around a delegate, not operators run outside it.
_DELEGATE_CALL = "executorch_call_delegate"


def count_ops(gm: torch.fx.GraphModule) -> tuple[int, list[int], collections.Counter[str]]:
    """(operator nodes inside delegates, each delegate call's payload bytes in call order,
    Counter of ops left outside by name)."""
    delegated = 0
    payloads: list[int] = []
    outside: collections.Counter[str] = collections.Counter()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if _is_delegate_call(node):
            lowered = getattr(gm, node.args[0].target)
            payloads.append(len(lowered.processed_bytes))
            delegated += _count_delegated(lowered)
        elif not _is_plumbing(node):
            outside[op_name(node.target)] += 1
    return delegated, payloads, outside


def _count_delegated(lowered: Any) -> int:
    """Operator nodes in one LoweredBackendModule's original graph, nested delegates included."""
    inner: torch.fx.GraphModule = lowered.original_module.graph_module
    count = 0
    for node in inner.graph.nodes:
        if node.op != "call_function":
            continue
        if _is_delegate_call(node):
            count += _count_delegated(getattr(inner, node.args[0].target))
        elif not _is_plumbing(node):
            count += 1
    return count


def _is_delegate_call(node: torch.fx.Node) -> bool:
    return getattr(node.target, "__name__", None) == _DELEGATE_CALL


def _is_plumbing(node: torch.fx.Node) -> bool:
    # getitem unpacks a multi-output node; it is Python indexing, not a kernel.
    return node.target is operator.getitem


def op_name(target: object) -> str:
    """A stable, short name for an FX call target: ``aten.mean.dim``, ``mylib.op.default``.

    Edge ops wrap an ATen OpOverload; the name is built from it so that counts here match the
    op names devtools' Inspector prints.
    """
    # Edge ops keep their ATen overload in `_op`; a plain OpOverload's `_op` is its C++ callable.
    overload = target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None)
    if isinstance(overload, torch._ops.OpOverload):
        schema_name = overload._schema.name  # e.g. "aten::mean"
        namespace, _, base = schema_name.partition("::")
        return f"{namespace}.{base}.{overload._overloadname}"
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else str(target)
