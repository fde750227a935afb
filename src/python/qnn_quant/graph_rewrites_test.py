"""Constant-weight matrix products become linear layers, computing the same values."""

from __future__ import annotations

import pytest
import torch

from qnn_quant.graph_rewrites import constant_matmuls_as_linear, constant_weight_views_folded


class _Products(torch.nn.Module):
    """HF Conv1D's addmm, a hand-written x @ W, and products the rewrite must leave alone."""

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(1126)
        self.w = torch.nn.Parameter(torch.randn(16, 8))
        self.b = torch.nn.Parameter(torch.randn(8))
        self.v = torch.nn.Parameter(torch.randn(8, 4))
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.addmm(self.b, x, self.w, alpha=self.alpha)  # Conv1D
        h = torch.matmul(h, self.v)  # constant weight
        return h + torch.mm(x, y)  # two activations: not a layer


def _gm(alpha: float = 1.0) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    args = (torch.randn(4, 16), torch.randn(16, 4))
    ep = torch.export.export(_Products(alpha).eval(), args, strict=False)
    return ep.module(), args


def _ops(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_constant_weight_products_become_linear_with_the_same_values() -> None:
    gm, args = _gm()
    with torch.no_grad():
        before = gm(*args)
    assert constant_matmuls_as_linear(gm) == 2
    ops = _ops(gm)
    assert ops.count("aten.linear.default") == 2
    assert "aten.addmm.default" not in ops and "aten.mm.default" in ops  # x @ y stays
    with torch.no_grad():
        torch.testing.assert_close(gm(*args), before)


@pytest.mark.parametrize("alpha", [0.5])
def test_a_scaled_addmm_is_left_alone(alpha: float) -> None:
    gm, _ = _gm(alpha)
    assert constant_matmuls_as_linear(gm) == 1  # only the matmul
    assert "aten.addmm.default" in _ops(gm)


class _SharedWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1126)
        self.conv = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        linear = torch.nn.functional.linear(y, self.conv.weight.reshape(4, 8).t().t())
        out: torch.Tensor = self.conv(x).mean((2, 3)) + linear
        return out


def test_a_weight_read_through_views_becomes_a_constant_of_its_own() -> None:
    args = (torch.randn(1, 8, 2, 2), torch.randn(1, 8))
    gm = torch.export.export(_SharedWeight().eval(), args, strict=False).module()
    with torch.no_grad():
        before = gm(*args)

    assert constant_weight_views_folded(gm) == 1

    (linear,) = (n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default)
    (conv,) = (n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default)
    assert linear.args[1].op == "get_attr" and conv.args[1].op == "get_attr"
    assert linear.args[1].target != conv.args[1].target  # the conv keeps its own weight
    assert not {"aten.reshape.default", "aten.t.default"} & set(_ops(gm))
    with torch.no_grad():
        torch.testing.assert_close(gm(*args), before)
