"""qnn_quant on its own: a self-contained MLP, quantized for real (model zoo tests live in
tests/feature, since loading those models is qnn_prepare's job)."""

from __future__ import annotations

import pytest
import torch
from torch.export import ExportedProgram

from qnn_common.errors import ConfigValidationError
from qnn_common.numerics.metrics import cosine
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target
from qnn_common.torchio.samples import Sample
from qnn_quant.engine import quantize_program
from qnn_quant.pt2e import writes_into_a_view
from qnn_quant.report import accuracy_report


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(torch.relu(self.fc1(x)))
        return out


Programs = tuple[ExportedProgram, ExportedProgram, list[Sample]]


@pytest.fixture(scope="module")
def programs() -> Programs:
    torch.manual_seed(1126)
    fp32 = torch.export.export(_Mlp().eval(), (torch.randn(4, 16),), strict=False)
    calibration: list[Sample] = [(torch.randn(4, 16),) for _ in range(8)]
    quantized = quantize_program(fp32, target=Target(Backend.XNNPACK), recipe=Recipe.A8W8,
                                 calibration=calibration, progress=False)
    held_out: list[Sample] = [(torch.randn(4, 16),) for _ in range(3)]
    return fp32, quantized, held_out


def test_8a8w_inserts_quantize_ops_and_stays_close(programs: Programs) -> None:
    fp32, quantized, held_out = programs
    targets = {str(n.target) for n in quantized.graph.nodes if n.op == "call_function"}
    assert any("quantize_per_tensor" in t for t in targets)
    assert any("dequantize_per_channel" in t for t in targets)  # per-channel weights
    x = held_out[0][0]
    with torch.no_grad():
        ref, got = fp32.module()(x), quantized.module()(x)
    assert cosine(ref.numpy(), got.numpy()) > 0.99


def test_report_names_layers_and_outputs(programs: Programs) -> None:
    fp32, quantized, held_out = programs
    report = accuracy_report(fp32, quantized, held_out, top_k=2)
    assert report["num_samples"] == 3 and len(report["vs_fp32"]["per_output"]) == 1
    assert float(report["vs_fp32"]["sqnr_db"]) > 20
    assert len(report["worst_layers"]) == 2
    assert {w["layer"] for w in report["worst_layers"]} <= {"fc1", "fc2", "relu", ""}


@pytest.mark.parametrize("recipe", [Recipe.FP32, Recipe.FP16, Recipe.A16W8, Recipe.A16W4])
def test_recipes_xnnpack_cannot_run(programs: Programs, recipe: Recipe) -> None:
    fp32, _, held_out = programs
    with pytest.raises(ConfigValidationError):
        quantize_program(fp32, target=Target(Backend.XNNPACK), recipe=recipe, calibration=held_out,
                         progress=False)


def test_quantized_program_does_not_carry_the_float_weights_it_replaced(
    programs: Programs,
) -> None:
    fp32, quantized, _ = programs
    float_weights = {
        n for n, t in fp32.state_dict.items() if t.is_floating_point() and t.dim() == 2
    }
    assert float_weights == {"fc1.weight", "fc2.weight"}
    assert not float_weights & set(quantized.state_dict)  # only their int8 foldings remain
    int8 = [t for t in quantized.state_dict.values() if t.dtype == torch.int8]
    assert len(int8) == 2


class _SliceWrite(torch.nn.Module):
    """`cache[2:4] = rows`, then a read of the whole cache (the static-KV-cache write)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(16, 16)
        self.register_buffer("cache", torch.randn(8, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = self.get_buffer("cache")
        cache[2:4] = self.fc(x)
        return cache * 2.0


@pytest.mark.parametrize(
    ("target", "recipe"),
    [(Target(Backend.XNNPACK), Recipe.A8W8), (Target.parse("qnn", "SM8650"), Recipe.A16W8)],
    ids=["xnnpack-8a8w", "qnn-16a8w"],
)
def test_a_read_after_a_write_into_a_slice_sees_the_write(target: Target, recipe: Recipe) -> None:
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    ep = torch.export.export(_SliceWrite().eval(), (x,), strict=False)
    assert writes_into_a_view(ep)
    quantized = quantize_program(ep, target=target, recipe=recipe, calibration=[(x,)],
                                 progress=False)
    with torch.no_grad():
        expected = _SliceWrite().eval()(x)
        got = quantized.module()(x)
    # The written rows, not the cache's old ones (those were 5x off before: PT2E quantized the
    # read before the write). Within the recipe's noise everywhere.
    assert cosine(expected[2:4].numpy(), got[2:4].numpy()) > 0.999
    assert (expected - got).abs().max().item() < 0.1


def test_writes_into_the_tensor_itself_are_left_as_exported() -> None:
    class _IndexWrite(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(8, 16))

        def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            self.get_buffer("cache").index_copy_(0, pos, x)
            return self.get_buffer("cache") + 1.0

    ep = torch.export.export(_IndexWrite(), (torch.randn(2, 16), torch.tensor([1, 5])),
                             strict=False)
    assert not writes_into_a_view(ep)
