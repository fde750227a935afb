"""Structural expectations: delegation, partition counts, q/dq presence and placement."""

from __future__ import annotations

from qnn_testing.structure import Delegation, Lowered, Structure, check_structure

_FULL = Lowered(partitions=1, delegated_ops=5, op_counts={})
_PARTIAL = Lowered(partitions=1, delegated_ops=5, op_counts={"aten.erf.default": 1})
_QDQ_OUT = Lowered(
    partitions=1,
    delegated_ops=5,
    op_counts={"aten.erf.default": 1, "quantized_decomposed.dequantize_per_tensor.default": 1},
)
_CPU = Lowered(partitions=0, delegated_ops=0, op_counts={"aten.add.Tensor": 1})


def _check(
    expect: Structure,
    lowered: Lowered,
    quantized: bool = False,
    qdq: int = 0,
    takes_qdq: bool = True,
) -> list[str]:
    return check_structure(
        expect, lowered, quantized=quantized, qdq_nodes=qdq, backend_takes_qdq=takes_qdq
    )


def test_full_delegation() -> None:
    assert _check(Structure(Delegation.FULL), _FULL) == []
    assert "expected full delegation" in _check(Structure(Delegation.FULL), _PARTIAL)[0]
    assert "aten.erf.default x1" in _check(Structure(Delegation.FULL), _PARTIAL)[0]


def test_partial_names_unexpected_ops() -> None:
    allowed = Structure(Delegation.PARTIAL, outside=frozenset({"aten.erf.default"}))
    assert _check(allowed, _PARTIAL) == []
    other = Structure(Delegation.PARTIAL, outside=frozenset({"aten.sin.default"}))
    assert _check(other, _PARTIAL) == ["unexpected ops outside the delegate: aten.erf.default"]
    assert "expected partial" in _check(allowed, _FULL)[0]


def test_qdq_outside_a_backend_that_takes_them_is_reported() -> None:
    allowed = Structure(Delegation.PARTIAL, outside=frozenset({"aten.erf.default"}))
    problems = _check(allowed, _QDQ_OUT, quantized=True, qdq=4)
    assert problems == [
        "q/dq ops left outside the delegate: quantized_decomposed.dequantize_per_tensor.default"
    ]
    # Portable runs q/dq itself: nothing to report there.
    assert _check(Structure(Delegation.NONE), _CPU, quantized=True, qdq=4, takes_qdq=False) == []


def test_none_and_partition_count() -> None:
    assert _check(Structure(Delegation.NONE), _CPU) == []
    assert "expected no delegate" in _check(Structure(Delegation.NONE), _FULL)[0]
    assert _check(Structure(Delegation.FULL, partitions=2), _FULL) == [
        "expected 2 partition(s), got 1"
    ]


def test_qdq_presence_follows_the_case() -> None:
    assert "nothing was quantized" in _check(Structure(Delegation.FULL), _FULL, True, 0)[0]
    integer = Structure(Delegation.NONE, qdq=False)
    assert _check(integer, _CPU, quantized=True, qdq=0) == []
    assert "expects none" in _check(integer, _CPU, quantized=True, qdq=2)[0]
