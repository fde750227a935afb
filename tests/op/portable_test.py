"""Every op case on the portable reference kernels (fp32): they must match eager PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest

from op.cases import CASES, Cosine, Metric, OpCase, Sqnr, Tolerance, check, run_case
from qnn_common.recipes import Backend, Recipe

FP32: tuple[Metric, ...] = (Sqnr(80.0), Cosine(0.999999), Tolerance(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op(case: OpCase, tmp_path: Path) -> None:
    reference, got, delegated = run_case(case, Backend.PORTABLE, Recipe.FP32, tmp_path)
    failures = check(FP32, reference, got)
    assert not failures, f"{case.name} on portable fp32: " + "; ".join(failures)
    assert delegated == 0
