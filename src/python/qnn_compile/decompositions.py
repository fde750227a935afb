"""Operators the stock ExecuTorch flow cannot run, rewritten into ones it can; and the check that
what is left has a kernel.

ExecuTorch 1.5.1 refuses some operators at edge conversion (not in the Core ATen opset:
`adaptive_max_pool2d`, `grid_sampler_3d`, `rand_like`, `randn_like`), has no runtime kernel for
others (`avg_pool3d`, `max_pool3d_with_indices`, `_adaptive_avg_pool3d`, `sort`,
`scatter_reduce`), and its portable convolution refuses 5-D tensors at run time (3-D
convolution). `decompose` rewrites each of them before edge conversion (the 3-D convolution and
pooling ones on XNNPACK and portable only: QNN has its own ops for them) into operators that have
kernels and that backends can take, with functions written in torch (`qnn_compile.op_rewrites`;
the divisible `adaptive_max_pool2d` follows torch's decomposition). For QNN also `max.dim`,
`lerp` with a number weight and the uneven `adaptive_avg_pool3d`, which its lowering crashes on,
fails to build, or does not take (see `_QNN`). An op is rewritten only where
its arguments are within what the rewrite computes exactly; everything else is left alone, and
`check_kernels` / `check_ranks` then fail the compile, naming the operator and what to do, instead
of the runtime failing later.

Every rewrite computes what the operator computes (tested against eager PyTorch, op by op, in
tests/feature/decompositions_test.py) except where noted: `sort` and `argsort` become `topk`
over the whole dimension, which orders equal elements arbitrarily (stable=True is not honoured
for ties).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from qnn_common.config import Stage
from qnn_common.errors import BackendNotAvailableError
from qnn_common.recipes import BACKENDS, Backend
from qnn_compile import op_rewrites as ops
from qnn_compile import value_rewrites as values

log = logging.getLogger(__name__)
aten = torch.ops.aten


class MissingKernelError(BackendNotAvailableError):
    """The program needs operators the ExecuTorch runtime cannot run: found at compile time, so
    no .pte that fails when loaded or run is written. `ops` names them."""

    def __init__(self, ops: Iterable[str], what: str = "has no kernel for") -> None:
        self.ops = tuple(sorted(set(ops)))
        self.stage = Stage.COMPILE.value
        hints = "; ".join(f"{op}: {_hint(op)}" for op in self.ops)
        super().__init__(
            f"[{self.stage}] the ExecuTorch runtime {what} {', '.join(self.ops)}, so the program "
            f"would fail when run; what to do: {hints}"
        )


# What to do instead, per operator (runtime name without the overload).
_ALTERNATIVES = {
    "aten::sort": "use torch.topk(x, x.shape[dim], dim, largest=descending)",
    "aten::scatter_reduce": "use scatter_add (reduce='sum'), or index shapes equal to src's "
    "with self matching them outside `dim` (then it is rewritten for you)",
    "aten::grid_sampler_3d": "use mode 'bilinear' or 'nearest' with padding 'zeros' or 'border'",
    "aten::avg_pool3d": "drop divisor_override (then it is rewritten into 2-D pooling)",
    "aten::convolution": "the runtime's convolution takes 1-D and 2-D convolutions only: "
    "reshape a 3-D transposed convolution into 2-D ones",
}


def _hint(op: str) -> str:
    base = op.split(".")[0]
    return _ALTERNATIVES.get(
        base,
        "rewrite that part of the model with other operators, or compile for a backend "
        "that delegates it",
    )


# --------------------------------------------------------------------------------------------
# The table and the entry points.


def _val(node: Any, i: int) -> Any:
    arg = node.args[i] if len(node.args) > i else None
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def _weight_5d(node: torch.fx.Node) -> bool:
    weight = _val(node, 1)
    transposed = node.args[6] if node.target is aten.convolution.default else False
    return isinstance(weight, torch.Tensor) and weight.dim() == 5 and not transposed


def _always(node: torch.fx.Node) -> bool:
    return True


# The host CPU backends, whose non-delegated ops run on the runtime's portable kernels. QNN has
# 3-D convolution and pooling ops of its own: there these stay whole for the HTP to take (and
# if it does not, `check_kernels` / `check_ranks` stop the compile).
_HOST = frozenset(b for b, traits in BACKENDS.items() if not traits.needs_soc)


# QNN (measured on V75, executorch 1.5.1): ops its partitioner takes but its lowering then fails
# on (max.dim: a segfault in `qnn_preprocess._check_io_binding`, at fp16 and 16a8w; lerp: the edge
# form fails to build, "Failed to append node QNN_ElementWiseAbs", at fp16, 8a8w and 16a8w), or
# does not take at all (uneven adaptive_avg_pool3d, whose runtime kernel is missing too).
_QNN = frozenset({Backend.QNN})


def _uneven_3d(node: torch.fx.Node) -> bool:
    x, out = _val(node, 0), node.args[1] if len(node.args) > 1 else None
    if not isinstance(x, torch.Tensor) or not isinstance(out, list | tuple):
        return False
    sizes = x.shape[-3:]
    return any(o is not None and s % int(o) for s, o in zip(sizes, out, strict=False))


@dataclass(frozen=True)
class Decomposition:
    """One rewrite: the op, the function computing it from other ops, which nodes need it, and
    for which backends (None: all)."""

    op: torch._ops.OpOverload
    fn: Callable[..., Any]
    applies: Callable[[torch.fx.Node], bool] = _always
    backends: frozenset[Backend] | None = None


DECOMPOSITIONS: tuple[Decomposition, ...] = (
    Decomposition(aten.adaptive_max_pool2d.default, ops.adaptive_max_pool2d),
    Decomposition(aten.max_pool3d.default, ops.max_pool3d, backends=_HOST),
    Decomposition(
        aten.max_pool3d_with_indices.default, ops.max_pool3d_with_indices, backends=_HOST
    ),
    Decomposition(aten.avg_pool3d.default, ops.avg_pool3d, backends=_HOST),
    Decomposition(aten.adaptive_avg_pool3d.default, ops.adaptive_avg_pool3d, backends=_HOST),
    Decomposition(aten._adaptive_avg_pool3d.default, ops.adaptive_avg_pool3d, backends=_HOST),
    Decomposition(aten.conv3d.default, ops.conv3d_op, backends=_HOST),
    Decomposition(aten.convolution.default, ops.convolution, _weight_5d, backends=_HOST),
    Decomposition(aten.sort.default, values.sort),
    Decomposition(aten.sort.stable, values.sort_stable),
    Decomposition(aten.argsort.default, values.argsort),
    Decomposition(aten.argsort.stable, values.argsort_stable),
    Decomposition(aten.scatter_reduce.two, values.scatter_reduce),
    Decomposition(aten.grid_sampler.default, ops.grid_sampler),
    Decomposition(aten.grid_sampler_3d.default, ops.grid_sampler_3d),
    Decomposition(aten.max.dim, values.max_dim, backends=_QNN),
    Decomposition(aten.lerp.Scalar, values.lerp_scalar, backends=_QNN),
    Decomposition(
        aten.adaptive_avg_pool3d.default, ops.adaptive_avg_pool3d, _uneven_3d, backends=_QNN
    ),
    Decomposition(
        aten._adaptive_avg_pool3d.default, ops.adaptive_avg_pool3d, _uneven_3d, backends=_QNN
    ),
    Decomposition(aten.rand_like.default, values.rand_like),
    Decomposition(aten.randn_like.default, values.randn_like),
)


def needed(
    ep: ExportedProgram, backend: Backend
) -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """The decompositions `ep`'s nodes need on `backend`: op -> function (empty: none)."""
    # An op may have one entry per backend set (disjoint): the one for `backend` is kept.
    by_op = {d.op: d for d in DECOMPOSITIONS if d.backends is None or backend in d.backends}
    table: dict[torch._ops.OpOverload, Callable[..., Any]] = {}
    for node in ep.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        dec = by_op.get(node.target)
        if dec is not None and dec.applies(node):
            table[dec.op] = dec.fn
    return table


def decompose(ep: ExportedProgram, backend: Backend) -> ExportedProgram:
    """`ep` with every operator the stock flow cannot run on `backend` rewritten (see the module
    docstring). A program with none of them is returned as it is (not re-traced).
    """
    table = needed(ep, backend)
    if not table:
        return ep
    log.info("rewriting %s into operators the runtime has", ", ".join(sorted(map(str, table))))
    decomposed: ExportedProgram = ep.run_decompositions(table)
    return decomposed


def registered_kernels() -> frozenset[str]:
    """Operator names (``aten::sort.values``) the ExecuTorch runtime of this process can run:
    the portable and optimized kernels linked into its Python runtime, plus the quantized ones."""
    import importlib

    importlib.import_module("executorch.kernels.quantized")  # registers quantized_decomposed
    from executorch.extension.pybindings import portable_lib

    return frozenset(portable_lib._get_operator_names())


def program_operators(program: Any) -> set[str]:
    """The kernel names a serialized ExecuTorch program calls (delegated ops are not among them)."""
    names = set()
    for plan in program.execution_plan:
        for op in plan.operators:
            names.add(f"{op.name}.{op.overload}" if op.overload else op.name)
    return names


def check_ranks(gm: torch.fx.GraphModule) -> None:
    """Raise MissingKernelError for ops left to the portable kernels with inputs of a rank their
    kernel refuses at run time (convolution: 3-D ones, i.e. 5-D tensors; the 3-D transposed
    convolution has no rewrite here)."""
    bad = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or "convolution" not in str(node.target):
            continue
        val = _val(node, 0)
        if isinstance(val, torch.Tensor) and val.dim() > 4:
            bad.append("aten::convolution.out")
    if bad:
        raise MissingKernelError(bad, "refuses 5-D inputs (3-D convolutions) in")


def check_kernels(program: Any) -> None:
    """Raise MissingKernelError if `program` (an emitted `executorch.exir.schema.Program`) calls
    an operator the runtime has no kernel for."""
    missing = program_operators(program) - registered_kernels()
    if missing:
        raise MissingKernelError(missing)
