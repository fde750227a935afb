"""The QNN quantizer's graph rewrite, on a real exported graph."""

from __future__ import annotations

import torch

from qnn_quant.quantizers.qnn import _integer_casts_as_adds, _lpbq_block_sizes


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

    sizes = _lpbq_block_sizes(gm, 16)

    pointwise, spatial, grouped, narrow = convs
    assert sizes[pointwise.name] == sizes[pointwise.args[1].name] == (1, 16, 1, 1)
    assert sizes[narrow.name] == (1, 16, 1, 1)
    assert spatial.name not in sizes and grouped.name not in sizes
    # The linear's 8 inputs are not a whole block of 16; at blocks of 8 it is blocked.
    assert linear.name not in sizes
    assert _lpbq_block_sizes(gm, 8)[linear.name] == (1, 8)
