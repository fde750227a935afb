"""Fused fake quant: the same outputs as the quantized program's own q/dq ops, bit for bit."""

from __future__ import annotations

import pytest
import torch

from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_quant.engine import quantize_program
from qnn_quant.fused_qdq import float_activations, fuse_qdq_pairs, reference_module


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


def test_per_row_fake_quant_gives_each_row_its_own_grid() -> None:
    from qnn_quant.fused_qdq import fake_quantize_per_row

    torch.manual_seed(1126)
    x = torch.randn(2, 3, 64) * torch.tensor([0.01, 1.0, 100.0]).view(1, 3, 1)
    out = fake_quantize_per_row(x, -128, 127)
    assert out.shape == x.shape
    rows, got = x.reshape(-1, 64), out.reshape(-1, 64)
    for row, q in zip(rows, got, strict=True):
        step = (row.max().clamp(min=0) - row.min().clamp(max=0)) / 255
        assert (row - q).abs().max() <= step / 2 + 1e-6  # rounding error within its own grid
    # One scale for the whole tensor would flatten the 0.01 rows to a handful of levels.
    per_tensor = torch.fake_quantize_per_tensor_affine(x, float(x.abs().max() / 127), 0, -128, 127)
    assert (out - x)[:, 0].abs().max() < (per_tensor - x)[:, 0].abs().max() / 100


def test_dynamic_pairs_per_row_leave_no_qparams_to_compute() -> None:
    torch.manual_seed(1126)
    samples = [(3 * torch.randn(8, 16),) for _ in range(4)]
    fp32 = torch.export.export(_Block().eval(), samples[0], strict=False)
    program = quantize_program(fp32, target=Target(Backend.XNNPACK), recipe=Recipe.A8W8,
                               calibration=samples, progress=False, dynamic_layers=(r"^fc",))
    per_row = reference_module(program, dynamic_per_row=True)
    names = {str(n.target) for n in per_row.graph.nodes}
    assert not any("choose_qparams" in n or "quantize_per_tensor.tensor" in n for n in names)
    with torch.no_grad():
        ref = fp32.module()(*samples[0])
        out = per_row(*samples[0])
    assert torch.nn.functional.cosine_similarity(ref.flatten(), out.flatten(), dim=0) > 0.99


def test_float_activations_leaves_only_the_weights_rounded() -> None:
    torch.manual_seed(1126)
    samples = [(3 * torch.randn(8, 16),) for _ in range(6)]
    fp32 = torch.export.export(_Block().eval(), samples[0], strict=False)
    program = quantize_program(fp32, target=Target(Backend.XNNPACK), recipe=Recipe.A8W8,
                               calibration=samples[:4], progress=False)
    fused, weights_only = reference_module(program), reference_module(program)
    roundings = sum(n.target is torch.fake_quantize_per_tensor_affine for n in fused.graph.nodes)
    assert roundings >= 4
    assert float_activations(weights_only) == roundings
    targets = [str(n.target) for n in weights_only.graph.nodes if n.op == "call_function"]
    assert not any("fake_quantize" in t for t in targets)
    assert any("dequantize_per_channel" in t for t in targets), "the weights stay quantized"
    with torch.no_grad():
        x = samples[5][0]
        ref, all_rounded, weights_rounded = fp32.module()(x), fused(x), weights_only(x)
    weight_error = (weights_rounded - ref).abs().mean()
    assert 0 < weight_error < (all_rounded - ref).abs().mean()


def test_float_activations_where_selects() -> None:
    torch.manual_seed(1126)
    samples = [(3 * torch.randn(8, 16),) for _ in range(4)]
    fp32 = torch.export.export(_Block().eval(), samples[0], strict=False)
    program = quantize_program(fp32, target=Target(Backend.XNNPACK), recipe=Recipe.A8W8,
                               calibration=samples, progress=False)
    gm = reference_module(program)
    before = sum(n.target is torch.fake_quantize_per_tensor_affine for n in gm.graph.nodes)
    skipped = float_activations(gm, lambda node: "relu" in str(node.args[0]))
    after = sum(n.target is torch.fake_quantize_per_tensor_affine for n in gm.graph.nodes)
    assert skipped == 1 and after == before - 1
