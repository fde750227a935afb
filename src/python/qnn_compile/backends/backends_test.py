"""The per-backend lowerings: what each hands ExecuTorch, and the QNN graph fix-up."""

from __future__ import annotations

import pytest
import torch

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_compile.backends import lowering_for
from qnn_compile.backends.qnn import explicit_pool_strides


def test_xnnpack_lowering_partitions_with_xnnpack() -> None:
    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.A8W8))
    assert [type(p).__name__ for p in lowering.recipe.partitioners] == ["XnnpackPartitioner"]
    assert lowering.record == {"backend": "xnnpack", "soc": None}
    assert not lowering.expect_full_delegation and not lowering.aten_passes


def test_portable_lowering_has_no_partitioner() -> None:
    lowering = lowering_for(CompileConfig(backend=Backend.PORTABLE))
    assert lowering.recipe.partitioners == []
    assert lowering.executorch_config is None


@pytest.mark.parametrize(("call", "stride"), [("max_pool2d(x, 2)", 2), ("avg_pool2d(x, 3)", 3)])
def test_default_pool_strides_are_spelled_out(call: str, stride: int) -> None:
    fn = getattr(torch.nn.functional, call.split("(")[0])
    kernel = int(call.split(", ")[1].rstrip(")"))

    class Pool(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = fn(x, kernel)
            return out

    x = torch.randn(1, 2, 12, 12)
    ep = torch.export.export(Pool(), (x,), strict=False)
    expected = ep.module()(x)
    ep = explicit_pool_strides(ep)
    (pool,) = (n for n in ep.graph.nodes if n.op == "call_function" and "pool" in str(n.target))
    assert list(pool.args[2]) == [stride, stride]
    torch.testing.assert_close(ep.module()(x), expected)
