"""Fused fake quant: the same outputs as the quantized program's own q/dq ops, bit for bit."""

from __future__ import annotations

import pytest
import torch

from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_quant.fused_qdq import fuse_qdq_pairs
from qnn_quant.pt2e import quantize_program


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.fc2(torch.relu(self.fc1(x))) + x)
        return out


@pytest.mark.parametrize(
    ("target", "recipe", "dynamic"),
    [(Target(Backend.XNNPACK), Recipe.A8W8, ()),
     (Target(Backend.XNNPACK), Recipe.A8W8, (r"^fc",)),
     (Target(Backend.QNN, lookup_soc("SM8650")), Recipe.A16W8, None)],
    ids=["xnnpack-8a8w", "xnnpack-8a8w-dynamic", "qnn-16a8w"],
)
def test_fused_pairs_compute_the_same_bits(
    target: Target, recipe: Recipe, dynamic: tuple[str, ...] | None
) -> None:
    torch.manual_seed(1126)
    samples = [(3 * torch.randn(8, 16),) for _ in range(6)]
    fp32 = torch.export.export(_Block().eval(), samples[0], strict=False)
    program = quantize_program(fp32, target=target, recipe=recipe, calibration=samples[:4],
                               progress=False, dynamic_layers=dynamic)
    plain, fused = program.module(), program.module()
    assert fuse_qdq_pairs(fused) >= (2 if dynamic else 4)
    names = {str(n.target) for n in fused.graph.nodes}
    assert not any(n.startswith("quantized_decomposed.quantize_per_tensor") for n in names)
    with torch.no_grad():
        for (x,) in samples:
            # Inputs outside the calibrated range too: the clamps must agree as well.
            for scaled in (x, 10 * x):
                assert torch.equal(plain(scaled), fused(scaled))
