"""CIA ops materialized once per query: the same set of ops, the same .pte, fewer C++ walks, and
an op registered between two queries is still found (nothing is cached across queries)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import torch
from torch._export import utils

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_compile.backends import lowering_for
from qnn_compile.cia_ops import materializing_once
from qnn_compile.lower import lower_program


@pytest.fixture
def materializations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts calls of the stock `_materialize_cpp_cia_ops` (patched in before ours wraps it)."""
    stock = utils._materialize_cpp_cia_ops
    calls = [0]

    def counted() -> None:
        calls[0] += 1
        stock()

    monkeypatch.setattr(utils, "_materialize_cpp_cia_ops", counted)
    yield calls


def test_the_same_ops_with_one_materialization_per_query(materializations: list[int]) -> None:
    stock = utils._collect_all_valid_cia_ops()
    namespaces = materializations[0]
    assert namespaces > 10  # one per op namespace: the repetition this removes
    materializations[0] = 0
    with materializing_once():
        ours = utils._collect_all_valid_cia_ops()
        assert materializations[0] == 1
        from torch.export import exported_program

        assert vars(exported_program)["_collect_all_valid_cia_ops"] is vars(utils)[
            "_collect_all_valid_cia_ops"
        ]
    assert ours == stock and len(ours) > 100
    assert utils._materialize_cpp_cia_ops.__name__ == "counted"  # put back


def _names(ops: Iterable[Any]) -> set[str]:
    return {op.name() for op in ops}


def test_an_op_registered_between_two_queries_is_found() -> None:
    library: Any = torch.library  # its stubs leave Library's methods untyped
    with materializing_once():
        before = _names(utils._collect_all_valid_cia_ops())
        lib = library.Library("qnn_cia_ops_test", "DEF")
        try:
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
            after = _names(utils._collect_all_valid_cia_ops())
        finally:
            lib._destroy()
    assert "qnn_cia_ops_test::twice" not in before
    assert "qnn_cia_ops_test::twice" in after


def test_a_lowering_writes_the_same_pte() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    ).eval()
    ep = torch.export.export(model, (torch.randn(2, 8),), strict=False)
    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.FP32))
    stock = lower_program(ep, lowering, materialize_cia_once=False)
    ours = lower_program(ep, lowering)
    assert stock.partitions >= 1
    assert ours.pte == stock.pte
