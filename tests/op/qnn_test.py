"""Every op case on the QNN HTP (SM8650, V75) at fp16, 8a8w and 16a8w, on the x86 HTP emulator.

Quantized programs are judged against their fake-quantized PyTorch model (what the quantizer
promised), float ones against eager fp32. Known deviations are expected failures with their
reason, never loosened thresholds.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from op.cases import CASES, Cosine, Metric, OpCase, Sqnr, assert_case
from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program

TARGET = Target(Backend.QNN, lookup_soc("SM8650"))

# fp16 vs fp32: half precision keeps ~3 decimal digits; 40 dB is ~1 % error.
FP16: tuple[Metric, ...] = (Sqnr(40.0), Cosine(0.9999))
# Quantized vs fake quant: the HTP's integer kernels round differently by about an LSB.
A8W8: tuple[Metric, ...] = (Sqnr(25.0), Cosine(0.995))
A16W8: tuple[Metric, ...] = (Sqnr(40.0), Cosine(0.9999))

EXPECTED: dict[Recipe, tuple[Metric, ...]] = {
    Recipe.FP16: FP16, Recipe.A8W8: A8W8, Recipe.A16W8: A16W8,
}


@pytest.mark.parametrize("recipe", list(EXPECTED), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op(case: OpCase, recipe: Recipe, tmp_path: Path) -> None:
    delegated = assert_case(case, TARGET, recipe, EXPECTED[recipe], tmp_path)
    assert delegated > 0, f"{case.name} was not delegated to QNN"


class _AvgPool(torch.nn.Module):
    def __init__(self, kernel: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 1)
        self.pool = torch.nn.AvgPool2d(kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.pool(self.conv(x))
        return out


def _avg_pool_case(kernel: int) -> OpCase:
    def make() -> torch.nn.Module:
        torch.manual_seed(1126)
        return _AvgPool(kernel).eval()

    return OpCase(f"avg_pool2d_k{kernel}", make,
                  lambda g: (torch.randn(1, 4, 16, 16, generator=g),))


@pytest.mark.parametrize(
    "kernel",
    [
        2,
        pytest.param(4, marks=pytest.mark.xfail(
            strict=True,
            reason="measured 16 dB vs fake quant (k=8: 5 dB) on the QNN 2.51 x86 emulator, "
            "which logs `q::AvgPool_valid does not have a valid splitting rule`; fp16 is right. "
            "Emulator or version skew: unknown without a device",
        )),
    ],
)
def test_quantized_avg_pool2d(kernel: int, tmp_path: Path) -> None:
    assert_case(_avg_pool_case(kernel), TARGET, Recipe.A8W8, (Sqnr(30.0),), tmp_path)


class _Erfinv(torch.nn.Module):
    """erfinv between two linears: QNN has no op for it (measured; validation refuses it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(torch.erfinv(torch.tanh(self.fc(x)) * 0.9))
        return out


def test_an_op_qnn_refuses_is_named(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(1126)
    ep = torch.export.export(_Erfinv().eval(), (torch.randn(4, 16),), strict=False)
    config = CompileConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.FP16)
    with caplog.at_level(logging.WARNING):
        lowered = lower_program(ep, lowering_for(config))
    assert lowered.op_counts == {"aten.erfinv.default": 1}
    assert lowered.delegated_ops > 0 and lowered.partitions == 2  # the linears, either side
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused and "aten.erfinv.default x1" in refused[0], caplog.text
