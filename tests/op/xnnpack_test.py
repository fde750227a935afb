"""Every op case on XNNPACK at fp32 and 8a8w, executed by the ExecuTorch runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from op.cases import CASES, Cosine, Metric, OpCase, Sqnr, Tolerance, assert_case
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target

# fp32: XNNPACK reorders float math, so exact equality is not expected; 60 dB is ~0.1 % error.
FP32: tuple[Metric, ...] = (Sqnr(60.0), Cosine(0.99999), Tolerance(rtol=1e-3, atol=1e-4))
# 8a8w vs fake-quant: the same integer math, so only requantization rounding (1 LSB) differs.
A8W8: tuple[Metric, ...] = (Sqnr(30.0), Cosine(0.999))

EXPECTED: dict[Recipe, tuple[Metric, ...]] = {Recipe.FP32: FP32, Recipe.A8W8: A8W8}


@pytest.mark.parametrize("recipe", list(EXPECTED), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op(case: OpCase, recipe: Recipe, tmp_path: Path) -> None:
    delegated = assert_case(case, Target(Backend.XNNPACK), recipe, EXPECTED[recipe], tmp_path)
    if case.name in ("linear", "conv2d"):
        assert delegated > 0, f"{case.name} was not delegated to XNNPACK"
