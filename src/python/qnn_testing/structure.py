"""Structural checks on a lowered program: delegation and where the q/dq nodes ended up.

Numbers alone can pass for the wrong reason: a program the backend refused runs on the portable
kernels and may still match the reference. So every case also states how it should be lowered,
and `check_structure` compares that with the counts the compile stage reports.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

# Op namespaces of PT2E's quantize / dequantize nodes.
QDQ_NAMESPACES = ("quantized_decomposed", "torchao")


class Delegation(enum.StrEnum):
    """How much of a program a backend should take."""

    FULL = "full"  # one or more partitions, no operator left outside
    PARTIAL = "partial"  # some partitions, some operators on the portable kernels
    NONE = "none"  # no partition: the portable kernels run everything


@dataclass(frozen=True)
class Structure:
    """What a lowered program must look like.

    `partitions` pins the number of delegate partitions when given. `outside` names the ops that
    may stay outside a delegate under PARTIAL (None: any). `qdq` says whether a quantized
    program must hold q/dq nodes at all: False for cases with nothing a quantizer annotates
    (integer and bool ops), where a q/dq node would mean the quantizer changed integer math.
    """

    delegation: Delegation
    partitions: int | None = None
    outside: frozenset[str] | None = None
    qdq: bool = True


@dataclass(frozen=True)
class Lowered:
    """The counts of one lowered program, as the compile stage reports them."""

    partitions: int
    delegated_ops: int
    op_counts: Mapping[str, int]  # op name -> nodes left outside any delegate


def is_qdq(op: str) -> bool:
    """Whether an op name (``quantized_decomposed.quantize_per_tensor.default``) is a q/dq op."""
    return op.split(".")[0] in QDQ_NAMESPACES


def check_structure(
    expect: Structure,
    lowered: Lowered,
    *,
    quantized: bool,
    qdq_nodes: int,
    backend_takes_qdq: bool,
) -> list[str]:
    """Every way `lowered` differs from `expect`, in words; empty when it matches.

    `qdq_nodes` counts q/dq nodes in the quantized program before lowering (0 for float ones);
    `backend_takes_qdq` says whether the backend absorbs q/dq into its partitions (XNNPACK, QNN),
    in which case none may be left outside unless the case allows the op around them outside.
    """
    problems: list[str] = []
    outside_total = sum(lowered.op_counts.values())
    outside_desc = ", ".join(f"{k} x{v}" for k, v in sorted(lowered.op_counts.items())) or "none"
    where = f"{lowered.partitions} partition(s), ops outside: {outside_desc}"
    if expect.delegation is Delegation.FULL:
        if lowered.partitions == 0 or outside_total:
            problems.append(f"expected full delegation, got {where}")
    elif expect.delegation is Delegation.PARTIAL:
        if lowered.partitions == 0 or not outside_total:
            problems.append(f"expected partial delegation, got {where}")
        allowed = expect.outside if expect.outside is not None else None
        qdq_allowed = allowed or frozenset()
        stray = sorted(op for op in lowered.op_counts if is_qdq(op) and op not in qdq_allowed)
        if backend_takes_qdq and stray:
            # The backend takes q/dq: one left outside means a quantized op ran on the CPU.
            problems.append(f"q/dq ops left outside the delegate: {', '.join(stray)}")
        if allowed is not None:
            extra = sorted(op for op in lowered.op_counts if op not in allowed and not is_qdq(op))
            if extra:
                problems.append(f"unexpected ops outside the delegate: {', '.join(extra)}")
    elif lowered.partitions:
        problems.append(f"expected no delegate, got {where}")
    if expect.partitions is not None and lowered.partitions != expect.partitions:
        problems.append(f"expected {expect.partitions} partition(s), got {lowered.partitions}")
    if quantized and expect.qdq and qdq_nodes == 0:
        problems.append("quantized program holds no q/dq node: nothing was quantized")
    if quantized and not expect.qdq and qdq_nodes:
        problems.append(f"{qdq_nodes} q/dq node(s) where the case expects none (integer math?)")
    return problems
