"""Block smoothing for 8da4w: which inputs qualify, the factor chosen, that the float graph
computes the same bits, and that the quantized graph tracks float better for it."""

from __future__ import annotations

import copy

import torch
from torch import nn

from qnn_common.numerics.metrics import sqnr_db
from qnn_quant.intx import quantize_graph_8da4w, split_asymmetric
from qnn_quant.smoothed_blocks import (
    BlockScale,
    apply_scales,
    choose_scale,
    per_token_int8,
    smoothable_inputs,
)

WIDTH, GROUP, LARGE = 256, 32, 40  # channel 40: block 1


class _Attention(nn.Module):
    """An RMSNorm feeding q / k / v only, one feeding a gated MLP and the output too, and the
    MLP's down projection reading ``silu(gate) * up``."""

    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.Parameter(torch.rand(WIDTH) + 0.5)
        self.post_norm = nn.Parameter(torch.rand(WIDTH) + 0.5)
        self.q_proj, self.k_proj, self.v_proj = (
            nn.Linear(WIDTH, n, bias=False) for n in (WIDTH, 32, 32)
        )
        self.gate_proj = nn.Linear(WIDTH, 64, bias=False)
        self.up_proj = nn.Linear(WIDTH, 64)
        self.down_proj = nn.Linear(64, 32, bias=False)

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm * self._norm(x)
        attn = torch.cat([self.q_proj(h), self.k_proj(h), self.v_proj(h)], -1)
        m = self.post_norm * self._norm(attn[..., :WIDTH])
        mlp = self.down_proj(torch.nn.functional.silu(self.gate_proj(m)) * self.up_proj(m))
        return torch.cat([attn, mlp, m], -1)  # m also read by the output


def _inputs() -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(1, 24, WIDTH)
    x[0, 0, LARGE] = 60.0  # a sink-like first token: one channel far above the rest
    x[0, 1:, LARGE] *= 6
    return x


def _on_grid(linear: nn.Linear) -> None:
    """Weights on a 4-bit grid of GROUP-wide groups (as SmolLM2's GGUF weights are): 8da4w
    holds them exactly, so what the quantized graph loses is the activations' rounding."""
    q, scale, offset = split_asymmetric(linear.weight, GROUP)
    grid = q.float().reshape(q.shape[0], -1, GROUP) * scale[..., None] + offset[..., None]
    linear.weight.data = grid.flatten(1)


def _graph() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    model = _Attention().eval()
    for linear in (model.q_proj, model.k_proj, model.v_proj, model.gate_proj, model.up_proj,
                   model.down_proj):
        _on_grid(linear)
    gm = torch.export.export(model, (_inputs(),)).module()
    assert isinstance(gm, torch.fx.GraphModule)
    return gm


def _all(node: torch.fx.Node, weight: torch.Tensor) -> bool:
    return True


def test_inputs_that_linears_alone_read_and_constants_make_qualify() -> None:
    found = {divided: len(linears)
             for divided, linears in smoothable_inputs(_graph(), _all, GROUP).values()}
    # The attention norm (q / k / v), and the down projection's input through up's rows and
    # bias; not the MLP's norm, which the output reads as well.
    assert found == {("input_layernorm",): 3, ("up_proj.weight", "up_proj.bias"): 1}
    # Nothing qualifies when one of its linears (or the dividing one) may not be scaled, or the
    # width is one group.
    assert smoothable_inputs(_graph(), lambda n, w: w.shape[0] not in (32, 64), GROUP) == {}
    assert smoothable_inputs(_graph(), _all, WIDTH) == {}


class _Tied(nn.Module):
    """A norm feeding a head whose weight a lookup reads too (tied embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Parameter(torch.ones(WIDTH))
        self.head = nn.Linear(WIDTH, 50, bias=False)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        table = torch.nn.functional.embedding(ids, self.head.weight)
        return torch.cat([self.head(self.norm * x), table.sum(-1, keepdim=True)], -1)


def test_a_weight_another_op_reads_is_not_scaled() -> None:
    args = (torch.tensor([[1, 2]]), torch.randn(1, 2, WIDTH))
    gm = torch.export.export(_Tied().eval(), args).module()
    assert isinstance(gm, torch.fx.GraphModule)
    assert smoothable_inputs(gm, _all, GROUP) == {}


def test_the_factor_is_chosen_for_the_block_with_the_large_channel() -> None:
    torch.manual_seed(0)
    rows = torch.randn(256, WIDTH)
    weights = [torch.randn(48, WIDTH), torch.randn(16, WIDTH)]
    assert choose_scale(("n",), rows, weights, GROUP).factor == 1  # nothing stands out
    rows[:, LARGE] *= 30
    scale = choose_scale(("n",), rows, weights, GROUP)
    assert (scale.block, scale.size) == (1, GROUP)
    assert scale.factor > 1 and scale.error_ratio < 0.8
    # The error it reports is the one it minimized: per-token rounding of the scaled rows.
    divide = torch.ones(WIDTH)
    divide[GROUP : 2 * GROUP] = scale.factor
    w = torch.cat(weights)
    err = (per_token_int8(rows / divide) * divide @ w.T - rows @ w.T).square().sum()
    base = (per_token_int8(rows) @ w.T - rows @ w.T).square().sum()
    assert abs(float(err / base) - scale.error_ratio) < 1e-3


def test_scaling_is_exact_in_float_and_helps_8da4w() -> None:
    x = _inputs()
    plain, smoothed = _graph(), _graph()
    reference = plain(x).detach()
    scale = BlockScale(("input_layernorm",), block=1, size=GROUP, factor=4, error_ratio=0.5)
    down = BlockScale(("up_proj.weight", "up_proj.bias"), block=1, size=GROUP, factor=2,
                      error_ratio=0.5)
    applied = apply_scales(smoothed, {"input_layernorm": scale, "up_proj.weight": down}, GROUP)
    assert applied == [scale, down]
    # The float function is unchanged to the bit: powers of two scale exactly.
    assert torch.equal(smoothed(x), reference)
    norm = torch.as_tensor(smoothed.input_layernorm)
    original = torch.as_tensor(plain.input_layernorm)
    assert torch.equal(norm[GROUP : 2 * GROUP] * 4, original[GROUP : 2 * GROUP])
    assert torch.equal(norm[:GROUP], original[:GROUP])
    q_weight = torch.as_tensor(smoothed.get_submodule("q_proj").weight)
    q_original = torch.as_tensor(plain.get_submodule("q_proj").weight)
    block = slice(GROUP, 2 * GROUP)
    assert torch.equal(q_weight[:, block], q_original[:, block] * 4)
    # The down projection's input: up's rows and bias halved, down's columns doubled.
    up, up_original = smoothed.get_submodule("up_proj"), plain.get_submodule("up_proj")
    assert torch.equal(torch.as_tensor(up.weight)[block] * 2,
                       torch.as_tensor(up_original.weight)[block])
    assert torch.equal(torch.as_tensor(up.bias)[block] * 2,
                       torch.as_tensor(up_original.bias)[block])
    assert torch.equal(torch.as_tensor(smoothed.get_submodule("down_proj").weight)[:, block],
                       torch.as_tensor(plain.get_submodule("down_proj").weight)[:, block] * 2)
    # An unknown norm, or factor 1, changes nothing.
    untouched = _graph()
    assert apply_scales(untouched, {"other": scale}, GROUP) == []
    assert apply_scales(untouched, {"input_layernorm": BlockScale(
        ("input_layernorm",), block=1, size=GROUP, factor=1, error_ratio=1.0)}, GROUP) == []
    assert torch.equal(torch.as_tensor(untouched.input_layernorm), original)

    # The factor chosen from the norm's output on the input, and what 8da4w makes of it (the
    # weights are on the 4-bit grid: the difference is the activations' rounding).
    rows = (original * _Attention._norm(x))[0].detach()
    chosen = choose_scale(("input_layernorm",), rows, [
        torch.as_tensor(plain.get_submodule(n).weight) for n in ("q_proj", "k_proj", "v_proj")
    ], GROUP)
    assert chosen.block == 1 and chosen.factor > 1
    attention = slice(0, WIDTH + 64)  # q / k / v: what the scaled norm feeds
    sqnr = {}
    for factor in (1, chosen.factor):
        gm = copy.deepcopy(plain)
        result = quantize_graph_8da4w(gm, group_size=GROUP, block_scales={
            "input_layernorm": BlockScale(("input_layernorm",), 1, GROUP, factor, 1.0)})
        assert [s.divided for s in result.smoothed] == [("input_layernorm",)] * (factor > 1)
        with torch.no_grad():
            sqnr[factor] = sqnr_db(reference[..., attention].numpy(),
                                   gm(x)[..., attention].numpy())
    assert sqnr[chosen.factor] > sqnr[1] + 1, sqnr
