"""The QNN quantizer's graph rewrite, on a real exported graph."""

from __future__ import annotations

import torch

from qnn_quant.quantizers.qnn import _integer_casts_as_adds


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
