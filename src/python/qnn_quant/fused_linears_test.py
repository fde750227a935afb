"""Fusing linears that read one input: which fuse, that the float graph computes the same, and
that 8da4w's quantized values are the same fused or not."""

from __future__ import annotations

import copy

import torch
from torch import nn

from qnn_quant.fused_linears import fuse_linears_by_input, fused_path
from qnn_quant.intx import quantize_graph_8da4w


class _Block(nn.Module):
    """Attention-like projections (one with a different input size), an MLP's gate and up, a
    down projection alone, and a head the caller may exclude."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(64, n, bias=bias) for n in (64, 32, 32))
        self.gate_proj, self.up_proj = nn.Linear(64, 96, bias=False), nn.Linear(64, 96, bias=False)
        self.down_proj = nn.Linear(96, 64, bias=False)
        self.lm_head = nn.Linear(64, 50, bias=False)
        self.other = nn.Linear(64, 50, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.q_proj(x) + torch.cat([self.k_proj(x), self.v_proj(x)], -1)
        h = attn + self.down_proj(torch.relu(self.gate_proj(attn)) * self.up_proj(attn))
        return self.lm_head(h), self.other(h)


def _graph(bias: bool) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    x = (torch.randn(2, 5, 64),)
    return torch.export.export(_Block(bias).eval(), x).module(), x


def _linears(gm: torch.fx.GraphModule) -> int:
    return sum(
        1 for n in gm.graph.nodes
        if n.target in (torch.ops.aten.linear.default, torch.nn.functional.linear)
    )


def test_fused_path_names_the_parts() -> None:
    assert fused_path(["a.b.q_proj", "a.b.k_proj"]) == "a.b.q_proj+k_proj"
    assert fused_path(["q", "k"]) == "q+k"
    assert fused_path(["a.x", "b.y"]) == "a.x+b.y"


def test_linears_reading_one_input_fuse_and_compute_the_same() -> None:
    for bias in (False, True):
        gm, x = _graph(bias)
        before = gm(*x)
        fused = fuse_linears_by_input(gm, lambda node, weight: "lm_head" not in str(node.meta))
        # q / k / v (biases fused too) and gate / up; down reads its own input; lm_head excluded
        # leaves `other` alone on h.
        assert fused == {
            "q_proj+k_proj+v_proj": ["q_proj", "k_proj", "v_proj"],
            "gate_proj+up_proj": ["gate_proj", "up_proj"],
        }, bias
        assert _linears(gm) == 8 - 5 + 2
        slices = [n for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
        assert [n.args[2:] for n in slices] == [(0, 64), (64, 96), (96, 128), (0, 96), (96, 192)]
        # The replaced weights are gone, not kept beside the fused ones.
        names = {name for name, _ in gm.named_parameters()}
        assert "q_proj.weight" not in names and "q_proj+k_proj+v_proj.weight" in names
        for want, got in zip(before, gm(*x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_8da4w_values_are_the_same_fused_or_not() -> None:
    gm, x = _graph(bias=False)
    plain = copy.deepcopy(gm)
    fused = quantize_graph_8da4w(gm, group_size=32)
    unfused = quantize_graph_8da4w(plain, group_size=32, fuse=False)
    assert len(fused.fused) == 2 and not unfused.fused
    assert fused.quantized == unfused.quantized - 3
    assert fused.offset_parameters == unfused.offset_parameters
    with torch.no_grad():
        for want, got in zip(plain(*x), gm(*x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _Tied(nn.Module):
    """A head whose weight a lookup table also reads, beside a linear on the same input."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 64)
        self.lm_head = nn.Linear(64, 50, bias=False)
        self.lm_head.weight = self.embed.weight
        self.other = nn.Linear(64, 50, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        out: torch.Tensor = self.lm_head(h) + self.other(h)
        return out


def test_a_weight_something_else_reads_is_not_fused() -> None:
    ids = (torch.tensor([[1, 2, 3]]),)
    gm = torch.export.export(_Tied().eval(), ids).module()
    before = gm(*ids)
    assert fuse_linears_by_input(gm, lambda node, weight: True) == {}
    torch.testing.assert_close(gm(*ids), before)
