from __future__ import annotations

import gc
import weakref

import pytest
import torch

from qnn_quant.input_products import record_input_products


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(torch.relu(self.a(x)))
        return out


def _two_linears(net: _Net | None = None) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    gm = torch.export.export((net or _Net()).eval(), (torch.randn(3, 8),)).module()
    assert isinstance(gm, torch.fx.GraphModule)
    return gm


def _linears(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is torch.ops.aten.linear.default]


def test_products_are_each_input_x_transpose_x_summed_per_key_and_targets_come_back() -> None:
    net = _Net()
    gm = _two_linears(net)
    first, second = _linears(gm)
    batches = [torch.randn(3, 8), torch.randn(3, 8)]

    def calibrate() -> None:
        for batch in batches:
            gm(batch)

    products = record_input_products(
        [(gm, first, "a"), (gm, second, "b")], calibrate,
        rows_of=lambda x: x.reshape(-1, x.shape[-1]), dtype=torch.float64,
    )
    x = torch.cat(batches).double()
    weight, bias = net.a.weight.detach().double(), net.a.bias.detach().double()
    hidden = torch.relu(torch.nn.functional.linear(x, weight, bias))
    assert products["a"][1] == products["b"][1] == 6
    torch.testing.assert_close(products["a"][0], x.T @ x)
    # The second linear's inputs were computed by the model in float32, these in float64: equal
    # to float32's precision (float64's default tolerance failed by 1.8e-7 on an AVX2 host).
    torch.testing.assert_close(products["b"][0], hidden.T @ hidden, rtol=1e-5, atol=1e-5)
    assert [n.target for n in _linears(gm)] == [torch.ops.aten.linear.default] * 2
    assert "call" not in gm.code  # recompiled: the recorders are gone from the code


def test_the_graph_does_not_keep_what_was_recorded() -> None:
    # fx keeps every target a node has held as a key of its graph's lookup table: the
    # recorders, and whatever they hold, live as long as the graph (the quantized program).
    gm = _two_linears()
    products = record_input_products(
        [(gm, _linears(gm)[0], "a")], lambda: gm(torch.randn(3, 8)),
        rows_of=lambda x: x, dtype=torch.float32,
    )
    recorded = weakref.ref(products["a"][0])
    del products
    gc.collect()
    assert recorded() is None, "the graph still holds a recorded product"


def test_targets_come_back_when_calibration_fails() -> None:
    gm = _two_linears()
    x = torch.ones(3, 8)
    before = gm(x)

    def fail() -> None:
        gm(torch.randn(3, 8))
        raise RuntimeError("calibration failed")

    with pytest.raises(RuntimeError, match="calibration failed"):
        record_input_products([(gm, _linears(gm)[0], "a")], fail, rows_of=lambda x: x,
                              dtype=torch.float32)
    assert [n.target for n in _linears(gm)] == [torch.ops.aten.linear.default] * 2
    torch.testing.assert_close(gm(x), before)
