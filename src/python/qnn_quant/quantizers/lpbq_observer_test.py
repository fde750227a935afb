"""16a4w_block's weight observer, through the real PT2E flow of the QNN quantizer."""

from __future__ import annotations

import pytest
import torch

from qnn_common.numerics.metrics import sqnr_db
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_common.weight_groups import GroupMapping
from qnn_quant.engine import quantize_program
from qnn_quant.quantizers.lpbq_observer import lpbq_scales

HTP = Target(Backend.QNN, lookup_soc("SM8650"))
BLOCK = 32


def _lpbq_grid_weight(
    out_f: int, in_f: int, generator: torch.Generator, offsets: float
) -> torch.Tensor:
    """A weight LPBQ holds exactly: per block, 16 levels (all of -8..7 used) of a scale that is
    a 4-bit multiple of its row's largest / 16; plus a float offset per block (of about
    `offsets`), which LPBQ holds with the asymmetric mapping's offset linears."""
    blocks = in_f // BLOCK
    levels = torch.randint(-8, 8, (out_f, blocks, BLOCK), generator=generator).float()
    levels[..., 0], levels[..., 1] = -8, 7
    k = torch.randint(1, 17, (out_f, blocks), generator=generator).float()
    k[:, 0] = 16
    scale = (k * 1e-3).unsqueeze(-1)
    offset = torch.randn(out_f, blocks, 1, generator=generator) * offsets
    return (levels * scale + offset).reshape(out_f, in_f)


class _Mlp(torch.nn.Module):
    def __init__(self, offsets: float) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.up = torch.nn.Linear(64, 128, bias=False)
        self.down = torch.nn.Linear(128, 64, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(_lpbq_grid_weight(128, 64, generator, offsets))
            self.down.weight.copy_(_lpbq_grid_weight(64, 128, generator, offsets))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.up(x)))
        return out


def test_lpbq_scales_are_4_bit_multiples_of_the_channel_unit() -> None:
    scales = torch.tensor([[1.0, 0.5, 0.26, 0.01], [2.0, 2.0, 1.0, 0.7]])
    rounded = lpbq_scales(scales)
    unit = scales.amax(1, keepdim=True) / 16
    torch.testing.assert_close(rounded / unit, torch.tensor(
        [[16.0, 8.0, 4.0, 1.0], [16.0, 16.0, 8.0, 6.0]]))  # 0.26 -> 4/16; 0.01 up to 1/16


# Measured 85.8 and 54.8 dB; before this observer (-7..7, float block scales) 21.3 and 22.9 dB.
# With offsets, the 8-bit offset linears and their 16-bit group sums are most of the noise.
@pytest.mark.parametrize(
    ("offsets", "mapping", "min_db"),
    [(0.0, GroupMapping.SYMMETRIC, 60.0), (0.01, GroupMapping.ASYMMETRIC, 45.0)],
)
def test_a_weight_on_lpbq_s_own_grid_is_held_exactly(
    offsets: float, mapping: GroupMapping, min_db: float
) -> None:
    torch.manual_seed(0)
    model = _Mlp(offsets).eval()
    samples = [(torch.randn(4, 64),) for _ in range(4)]
    ep = torch.export.export(model, samples[0], strict=False)

    quantized = quantize_program(
        ep, target=HTP, recipe=Recipe.A16W4_BLOCK, calibration=samples, block_size=BLOCK,
        group_mapping=mapping, progress=False, keep_float=(),
    )

    module = quantized.module()
    dequantized = [
        n for n in module.graph.nodes if str(n.target) == "torchao.dequantize_affine.default"
    ]
    assert len(dequantized) == 2  # the two linears' weights (as 1x1 convolutions), blocked
    for node in dequantized:
        levels, scale = _tensor(module, node.args[0]), _tensor(module, node.args[2])
        assert tuple(node.args[1])[:2] == (1, BLOCK)  # the block size
        assert int(levels.min()) == -8 and int(levels.max()) == 7  # all 16 levels
        unit = scale.reshape(scale.shape[0], -1).amax(1, keepdim=True) / 16
        k = scale.reshape(scale.shape[0], -1) / unit
        torch.testing.assert_close(k, k.round(), rtol=0, atol=1e-4)  # what the HTP holds
    # Scored on the calibration samples: no activation clipped, so what is left is the weights'.
    with torch.no_grad():
        expected = torch.cat([model(*x) for x in samples])
        out = torch.cat([module(*x) for x in samples])
    assert sqnr_db(expected.numpy(), out.numpy()) >= min_db


def _tensor(module: torch.fx.GraphModule, arg: object) -> torch.Tensor:
    assert isinstance(arg, torch.fx.Node) and arg.op == "get_attr", arg
    value = getattr(module, str(arg.target))
    assert isinstance(value, torch.Tensor)
    return value


if __name__ == "__main__":
    pytest.main([__file__])
