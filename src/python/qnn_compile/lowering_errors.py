"""Upstream lowering failures as one StageError that names the failing operator.

ExecuTorch's lowering raises many unrelated exception types; the compile stage reports each as a
StageError whose message names the operator (from the exception chain, or the last op the QNN
library visited) and the backend's own error lines.
"""

from __future__ import annotations

import re

import torch.fx

from qnn_common.config import Stage
from qnn_common.errors import StageError
from qnn_compile.native_log import NativeLog
from qnn_compile.op_counts import op_name

# How upstream errors spell operators, most specific first; each yields (namespace, name,
# overload or None): `torch._ops.aten.lgamma.default` / `torch.ops.aten.foo.out`, then
# `mylib::op` / `aten::mean.dim`, then a bare dotted name in a namespace ops live in.
_OP_PATTERNS = (
    re.compile(r"\btorch\._?ops\.(\w+)\.(\w+)(?:\.(\w+))?"),
    re.compile(r"\b(\w+)::(\w+)(?:\.(\w+))?"),
    re.compile(
        r"\b(aten|prims|quantized_decomposed|dim_order_ops|executorch_prim|torchao)"
        r"\.(\w+)(?:\.(\w+))?"
    ),
)



def stage_error(what: str, exc: BaseException, native: NativeLog | None = None) -> StageError:
    """`exc`, raised while lowering, as a StageError naming the failing operator if known."""
    failing = _find_op_name(exc) or (native.last_visited() if native else None)
    where = f" at operator {failing}" if failing else ""
    detail = str(exc).strip().splitlines()
    first = detail[0] if detail else type(exc).__name__
    said = native.errors() if native else []
    backend_said = ("; the backend said: " + " | ".join(said[-5:])) if said else ""
    message = f"{what}{where}: {type(exc).__name__}: {first}{backend_said}"
    return StageError(Stage.COMPILE, message, exc)


def _find_op_name(exc: BaseException) -> str | None:
    """The first operator name in the exception chain's messages, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        node = getattr(current, "node", None)  # some fx errors carry the node they failed on
        if isinstance(node, torch.fx.Node) and node.op == "call_function":
            return op_name(node.target)
        text = str(current)
        for pattern in _OP_PATTERNS:
            match = pattern.search(text)
            if match:
                return ".".join(part for part in match.groups() if part)
        current = current.__cause__ or current.__context__
    return None
