"""GPTQ for 16a4w_block: the per-block grid alone, and through the real PT2E flow of the QNN
quantizer (blocked 1x1 convolutions, LPBQ observers, convert)."""

from __future__ import annotations

import pytest
import torch

from qnn_common.config import QuantizeConfig
from qnn_common.recipes import Backend, Recipe, WeightRounding
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_common.weight_groups import GroupMapping
from qnn_quant.engine import quantize_one
from qnn_quant.gptq import GptqResult, gptq, nearest
from qnn_quant.quantizers.lpbq_observer import lpbq_scales
from qnn_testing.rounding import each_rounding, held_out_sqnr, low_rank_batches

HTP = Target(Backend.QNN, lookup_soc("SM8650"))
BLOCK = 16


def _output_error(weight: torch.Tensor, rounded: torch.Tensor, hessian: torch.Tensor) -> float:
    d = (weight - rounded).double()
    return float(((d @ hessian.double()) * d).sum())


def test_gptq_on_lpbq_block_scales_stays_on_each_block_s_grid_and_beats_nearest() -> None:
    torch.manual_seed(1126)
    weight = torch.randn(24, 64) * (0.2 + torch.rand(24, 4).repeat_interleave(BLOCK, dim=1))
    inputs = torch.randn(512, 8) @ torch.randn(8, 64) + 0.1 * torch.randn(512, 64)
    hessian = inputs.T @ inputs / len(inputs)
    blocks = weight.reshape(24, -1, BLOCK)
    per_block = lpbq_scales(torch.maximum(blocks.amax(-1) / 7, -blocks.amin(-1) / 8))
    per_weight = per_block.repeat_interleave(BLOCK, dim=1)

    rounded = gptq(weight, hessian, per_weight, 7, -8)

    levels = rounded / per_weight
    assert torch.allclose(levels, levels.round(), atol=1e-4)  # each on its own block's scale
    assert levels.min() >= -8 - 1e-4 and levels.max() <= 7 + 1e-4
    assert (levels.round() == -8).any()  # the asymmetric range is used, not -7..7
    ours = _output_error(weight, rounded, hessian)
    theirs = _output_error(weight, nearest(weight, per_weight, 7, -8), hessian)
    assert ours < 0.5 * theirs, (ours, theirs)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64, bias=False)
        self.down = torch.nn.Linear(64, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.up(x)))
        return out


def _blocked(program: torch.export.ExportedProgram) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(integer weights, block scales) of each blocked weight's dequantize, in order."""
    module = program.module()
    out = []
    for node in module.graph.nodes:
        if str(node.target) == "torchao.dequantize_affine.default":
            levels, scale = (getattr(module, str(a.target)) for a in (node.args[0], node.args[2]))
            out.append((levels, scale))
    return out


@pytest.mark.parametrize("mapping", [GroupMapping.SYMMETRIC, GroupMapping.ASYMMETRIC])
def test_gptq_through_pt2e_keeps_lpbq_s_scales_and_beats_nearest(mapping: GroupMapping) -> None:
    samples = low_rank_batches()
    fp32 = torch.export.export(_Mlp().eval(), samples[0], strict=False)
    # The caller's weights are kept: a 1x1 convolution's weight is a view of its linear's, and
    # rounding in place once rounded the reference too.
    programs, results = each_rounding(fp32, lambda rounding: quantize_one(
        fp32, QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.A16W4_BLOCK,
                             weight_rounding=rounding, block_size=BLOCK, group_mapping=mapping,
                             keep_float=()), samples[:8], progress=False))
    result = results[WeightRounding.GPTQ]
    assert isinstance(result, GptqResult) and results[WeightRounding.NEAREST] is None
    assert len(result.scales) == 2 and result.mean_gain_db > 1  # the two blocked weights
    ours = _blocked(programs[WeightRounding.GPTQ])
    theirs = _blocked(programs[WeightRounding.NEAREST])
    assert len(ours) == len(theirs) == 2
    for (levels, scale), (nearest_levels, nearest_scale) in zip(ours, theirs, strict=True):
        # The observers' block scales (LPBQ's 4-bit multiples) are kept; the integers moved.
        torch.testing.assert_close(scale, nearest_scale)
        assert int(levels.min()) >= -8 and int(levels.max()) <= 7
        assert not torch.equal(levels, nearest_levels)
    # Held-out inputs of the calibration's distribution read closer to fp32.
    sqnr = held_out_sqnr(fp32, programs, samples[8:])
    assert sqnr[WeightRounding.GPTQ] > sqnr[WeightRounding.NEAREST] + 1, sqnr


if __name__ == "__main__":
    pytest.main([__file__])
