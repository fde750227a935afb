"""Every op case on the portable reference kernels: fp32 must match eager PyTorch, and 8a8w must
match the fake-quantized model (the same quantized_decomposed math, in C++)."""

from __future__ import annotations

from pathlib import Path

import pytest

from op.cases import CASES, Cosine, Metric, OpCase, Sqnr, Tolerance, assert_case
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target

FP32: tuple[Metric, ...] = (Sqnr(80.0), Cosine(0.999999), Tolerance(rtol=1e-5, atol=1e-5))
# Same integer math as fake quant; float ops between q/dq may round differently in the last bit.
A8W8: tuple[Metric, ...] = (Sqnr(40.0), Cosine(0.9999))

EXPECTED: dict[Recipe, tuple[Metric, ...]] = {Recipe.FP32: FP32, Recipe.A8W8: A8W8}


@pytest.mark.parametrize("recipe", list(EXPECTED), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op(case: OpCase, recipe: Recipe, tmp_path: Path) -> None:
    assert assert_case(case, Target(Backend.PORTABLE), recipe, EXPECTED[recipe], tmp_path) == 0
