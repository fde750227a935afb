"""The per-backend lowerings: what each hands ExecuTorch, and the QNN graph fix-up."""

from __future__ import annotations

import pytest
import torch

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_compile.backends import lowering_for
from qnn_compile.backends.qnn import explicit_pool_strides
from qnn_compile.backends.xnnpack import decompose_layer_norm, delegable_means


def test_xnnpack_lowering_partitions_with_xnnpack() -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.A8W8))
    (partitioner,) = lowering.recipe.partitioners  # XNNPACK's own, logging its progress
    assert isinstance(partitioner, XnnpackPartitioner)
    assert lowering.record == {"backend": "xnnpack", "soc": None}
    assert not lowering.expect_full_delegation
    assert lowering.aten_passes == (decompose_layer_norm, delegable_means)
    assert len(lowering.recipe.edge_transform_passes) == 1


class _NormAttention(torch.nn.Module):
    """A layer norm and a 4-D matmul (which reaches the edge dialect as expand + view + bmm)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm(x)).view(1, 8, 2, 8).transpose(1, 2)  # [1, 2, 8, 8]
        return torch.matmul(h, h.transpose(-1, -2))


def test_layer_norm_decomposition_matches_and_keeps_other_ops() -> None:
    x = torch.randn(1, 8, 16)
    model = _NormAttention().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    ep = torch.export.export(model, (x,), strict=False)
    decomposed = decompose_layer_norm(ep)
    targets = {str(n.target) for n in decomposed.graph.nodes if n.op == "call_function"}
    assert "aten.layer_norm.default" not in targets
    assert "aten.linear.default" in targets  # only layer_norm was decomposed
    torch.testing.assert_close(decomposed.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_xnnpack_takes_layer_norm_and_noop_expands() -> None:
    from qnn_compile.lower import lower_program

    x = torch.randn(1, 8, 16)
    ep = torch.export.export(_NormAttention().eval(), (x,), strict=False)
    lowered = lower_program(ep, lowering_for(CompileConfig(backend=Backend.XNNPACK)))
    assert lowered.op_counts == {}
    assert lowered.partitions == 1


class _RmsNormHead(torch.nn.Module):
    """Llama's RMSNorm (a mean of squares over the last dimension), then a linear; and a mean
    over another dimension, which stays as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return self.proj(norm), x.mean(1)


def _means(program: torch.export.ExportedProgram) -> list[list[int]]:
    return [list(n.args[1]) for n in program.graph.nodes
            if n.target is torch.ops.aten.mean.dim]


def test_last_dim_means_become_global_average_pooling_and_match() -> None:
    x = torch.randn(1, 5, 16)
    model = _RmsNormHead().eval()
    ep = torch.export.export(model, (x,), strict=False)
    assert _means(ep) == [[-1], [1]]
    rewritten = delegable_means(ep)
    assert _means(rewritten) == [[2, 3], [1]]  # the mean over dim 1 is not the norm's
    torch.testing.assert_close(rewritten.module()(x), model(x), rtol=1e-6, atol=1e-6)


def test_xnnpack_takes_rms_norm_whole() -> None:
    """Before the rewrite the norm's mean ran on the portable kernels between two partitions."""
    from qnn_compile.lower import lower_program

    x = torch.randn(1, 5, 16)
    model = _RmsNormHead().eval()
    lowered = lower_program(
        torch.export.export(model, (x,), strict=False),
        lowering_for(CompileConfig(backend=Backend.XNNPACK)),
    )
    # Only the other mean (over dim 1: XNNPACK pools the innermost dimensions only) is left.
    assert lowered.op_counts == {"aten.mean.dim": 1}
    assert lowered.partitions == 1


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
