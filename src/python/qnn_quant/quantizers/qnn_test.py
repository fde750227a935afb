"""The QNN quantizer's graph rewrites (integer casts, LPBQ's), on real exported graphs."""

from __future__ import annotations

import operator

import pytest
import torch

from qnn_common.llm_spec import MASK_VALUE
from qnn_common.weight_groups import GroupMapping
from qnn_quant.quantizers.lpbq import (
    block_sizes,
    configure,
    min_max_grid_block,
    split_group_offsets,
)
from qnn_quant.quantizers.qnn import _constant_masks_bounded, _integer_casts_as_adds


class _MaskedSum(torch.nn.Module):
    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) + mask.to(torch.int32).sum()


def test_integer_to_float_casts_become_adds_and_compute_the_same() -> None:
    hidden = torch.randn(2, 5, 3)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    gm = torch.export.export(_MaskedSum(), (hidden, mask), strict=False).module()
    expected = gm(hidden, mask)

    rewritten = _integer_casts_as_adds(gm)

    casts = [
        n for n in rewritten.graph.nodes
        if n.target in (torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default)
    ]
    # The int64 -> int32 cast is not a float cast and stays; the int64 -> float32 one is gone.
    assert [n.args[1] for n in casts if len(n.args) > 1] == [torch.int32]
    assert any(
        n.target == torch.ops.aten.add.Tensor and n.args[1] == 0.0 for n in rewritten.graph.nodes
    )
    torch.testing.assert_close(rewritten(hidden, mask), expected)


class _MaskedScores(torch.nn.Module):
    """Softmax over scores plus a causal mask built from literals, and plus a mask given at run
    time (which the rewrite must leave alone: its values are the caller's)."""

    def forward(self, scores: torch.Tensor, given: torch.Tensor) -> torch.Tensor:
        n = scores.shape[-1]
        causal = torch.full((n, n), float("-inf")).triu(1)
        return torch.softmax(scores + causal, -1) + torch.softmax(scores + given, -1)


def test_a_constant_additive_mask_is_clamped_where_it_meets_the_scores() -> None:
    scores = torch.randn(2, 6, 6) * 4
    given = torch.full((6, 6), -1e4).triu(1)
    gm = torch.export.export(_MaskedScores(), (scores, given), strict=False).module()
    expected = gm(scores, given)

    rewritten = _constant_masks_bounded(gm)

    clamps = [n for n in rewritten.graph.nodes if n.target is torch.ops.aten.clamp.default]
    assert [c.args[1] for c in clamps] == [MASK_VALUE]  # the causal mask only
    (add,) = clamps[0].users
    assert add.target is torch.ops.aten.add.Tensor
    assert {u.target for u in add.users} & {
        torch.ops.aten.softmax.int, torch.ops.aten._softmax.default
    }
    # The masked weights were already below float32's resolution at -255: the same output.
    torch.testing.assert_close(rewritten(scores, given), expected)


class _Convs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pointwise = torch.nn.Conv2d(32, 16, 1)
        self.spatial = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.grouped = torch.nn.Conv2d(16, 32, 1, groups=2)
        self.narrow = torch.nn.Conv2d(32, 8, 1)
        self.head = torch.nn.Linear(8, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.narrow(self.grouped(self.spatial(self.pointwise(x))))
        out: torch.Tensor = self.head(y.mean((2, 3)))
        return out


def test_lpbq_blocks_linears_and_ungrouped_pointwise_convs_only() -> None:
    gm = torch.export.export(_Convs(), (torch.randn(1, 32, 4, 4),), strict=False).module()
    convs = [n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default]
    (linear,) = (n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default)

    sizes = block_sizes(gm, 16)

    pointwise, spatial, grouped, narrow = convs
    assert sizes[pointwise.name] == sizes[pointwise.args[1].name] == (1, 16, 1, 1)
    assert sizes[narrow.name] == (1, 16, 1, 1)
    assert spatial.name not in sizes and grouped.name not in sizes
    # The linear's 8 inputs are not a whole block of 16; at blocks of 8 it is blocked.
    assert linear.name not in sizes
    assert block_sizes(gm, 8)[linear.name] == (1, 8)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 96)
        self.down = torch.nn.Linear(96, 64, bias=False)
        self.odd = torch.nn.Linear(64, 10)  # 10 outputs, but 64 inputs: blockable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.odd(self.down(torch.relu(self.up(x))) + x)
        return out


def _q4_1_grid(weight: torch.Tensor, block: int) -> torch.Tensor:
    """`weight` moved onto a min/max 4-bit grid per block (GGUF Q4_1's form)."""
    out_f, in_f = weight.shape
    groups = weight.reshape(out_f, in_f // block, block)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = (high - low) / 15
    return (torch.round((groups - low) / scale) * scale + low).reshape(out_f, in_f)


def _linears(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default]


def test_group_offsets_leave_symmetric_blocks_and_compute_the_same() -> None:
    torch.manual_seed(0)
    model = _Mlp()
    with torch.no_grad():
        for layer in (model.up, model.down, model.odd):
            layer.weight.copy_(_q4_1_grid(layer.weight, 32))
    x = torch.randn(2, 5, 64)
    gm = torch.export.export(model, (x,), strict=False).module()
    expected = gm(x)

    added = split_group_offsets(gm, 32, lambda node: True)

    # Per linear a group-sum and a group-offset linear (each reads an input of its own).
    assert len(_linears(gm)) == 3 + 3 + 3 and len(added) == 6
    torch.testing.assert_close(gm(x), expected, rtol=1e-4, atol=1e-4)
    for node in _linears(gm):
        if node.name in added:
            continue
        weight_node = node.args[1]
        assert isinstance(weight_node, torch.fx.Node)
        weight = operator.attrgetter(str(weight_node.target))(gm)
        blocks = weight.reshape(weight.shape[0], -1, 32)
        # What LPBQ holds: each block symmetric, -8..7 steps of one scale.
        scale = (blocks.amax(-1) - blocks.amin(-1)) / 15
        torch.testing.assert_close(blocks.amin(-1), -8 * scale, rtol=1e-4, atol=1e-6)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            assert isinstance(node.meta["val"], torch.Tensor)  # what quantizers read


class _Quantizer:
    """Records what `configure` tells a QnnQuantizer."""

    def __init__(self) -> None:
        self.sizes: dict[str, tuple[int, ...]] = {}
        self.offset_rule: object = None

    def set_block_size_map(self, sizes: dict[str, tuple[int, ...]]) -> None:
        self.sizes = sizes

    def set_submodule_qconfig_list(self, rules: list[tuple[object, object]]) -> None:
        ((self.offset_rule, _),) = rules

    def _get_quant_config(self, node: torch.fx.Node) -> None:
        return None


def test_configure_runs_blocked_linears_as_pointwise_convs() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 64)
    gm = torch.export.export(_Mlp(), (x,), strict=False).module()
    expected = gm(x)
    quantizer = _Quantizer()

    sizes = configure(quantizer, gm, 32, GroupMapping.ASYMMETRIC, frozenset(), "8-bit")

    convs = [n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default]
    assert len(convs) == 3 and all(sizes[c.name] == (1, 32, 1, 1) for c in convs)
    # The group sums and offsets stay linears, unblocked, under the offsets' own config.
    offsets = _linears(gm)
    assert len(offsets) == 6 and not any(n.name in sizes for n in offsets)
    assert callable(quantizer.offset_rule) and all(quantizer.offset_rule(n) for n in offsets)
    torch.testing.assert_close(gm(x), expected, rtol=1e-4, atol=1e-4)


def test_configure_symmetric_and_float_layers() -> None:
    x = torch.randn(3, 64)  # 2-D input: rows as the convolution's width
    gm = torch.export.export(_Mlp(), (x,), strict=False).module()
    expected = gm(x)
    (up, down, odd) = _linears(gm)
    quantizer = _Quantizer()

    sizes = configure(quantizer, gm, 32, GroupMapping.SYMMETRIC, frozenset({odd.name}), None)

    assert quantizer.offset_rule is None
    assert [n.name for n in _linears(gm)] == [odd.name]  # float: neither blocked nor rewritten
    assert len(sizes) == 4  # two convolutions and their weights
    torch.testing.assert_close(gm(x), expected, rtol=1e-4, atol=1e-4)


def test_a_checkpoint_s_own_4_bit_grid_is_found_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    model = _Mlp()
    with torch.no_grad():
        for layer in (model.up, model.down, model.odd):
            layer.weight.copy_(_q4_1_grid(layer.weight, 32))
    assert min_max_grid_block(model.up.weight) == 32
    assert min_max_grid_block(torch.randn(96, 64)) is None
    x = torch.randn(2, 5, 64)

    for block, mapping, warned in [
        (16, GroupMapping.SYMMETRIC, True),
        (32, GroupMapping.SYMMETRIC, True),
        (32, GroupMapping.ASYMMETRIC, False),
    ]:
        caplog.clear()
        gm = torch.export.export(model, (x,), strict=False).module()
        configure(_Quantizer(), gm, block, mapping, frozenset(), "8-bit")
        advice = [r.getMessage() for r in caplog.records if "min/max grid" in r.getMessage()]
        assert bool(advice) is warned, (block, mapping)
        if warned:
            assert "--block-size 32 --group-mapping asymmetric" in advice[0]


def test_int8_linears_are_neither_blocked_nor_split_and_get_8_bit_weights() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 64)
    gm = torch.export.export(_Mlp(), (x,), strict=False).module()
    (up, down, odd) = _linears(gm)
    quantizer = _Quantizer()

    sizes = configure(quantizer, gm, 32, GroupMapping.ASYMMETRIC, frozenset(), "8-bit",
                      frozenset({odd.name}))

    convs = [n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default]
    assert len(convs) == 2 and odd.name not in sizes and odd in _linears(gm)
    assert callable(quantizer.offset_rule) and quantizer.offset_rule(odd)
    assert not any(quantizer.offset_rule(c) for c in convs)
    # The offsets of the two blocked linears: a group sum and a group offset each.
    assert len(_linears(gm)) == 1 + 4
