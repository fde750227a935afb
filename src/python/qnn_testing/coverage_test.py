"""The coverage table: summary counts, one column per measured target x precision, reasons."""

from __future__ import annotations

from qnn_common.recipes import Recipe
from qnn_testing.coverage import Row, Status, render, summary
from qnn_testing.matrix import TARGETS_BY_NAME

ROWS = [
    Row("conv2d", "conv", "xnnpack", Recipe.FP32, Status.PASS, "140.1"),
    Row("conv2d", "conv", "xnnpack", Recipe.A8W8, Status.FAIL, "12.0", "SQNR 12 < 30 | bad"),
    Row("avg_pool2d_k4", "pooling", "qnn-v75", Recipe.A8W8, Status.XFAIL, "16.0", "emulator"),
]


def test_summary_counts_per_target() -> None:
    counts = summary(ROWS)
    assert counts["xnnpack"][Status.PASS] == 1 and counts["xnnpack"][Status.FAIL] == 1
    assert counts["qnn-v75"][Status.XFAIL] == 1


def test_render_has_a_column_per_measured_cell_and_the_reasons() -> None:
    text = render(ROWS, [TARGETS_BY_NAME["xnnpack"], TARGETS_BY_NAME["qnn-v75"]], "T", "P")
    assert "| op | xnnpack fp32 | xnnpack 8a8w | qnn-v75 8a8w |" in text
    assert "| conv2d | pass 140.1 | FAIL 12.0 |  |" in text
    assert "| xnnpack | 2 | 1 | 0 | 0 | 1 |" in text
    # Pipes in messages would break the table's neighbours: escaped.
    assert "SQNR 12 < 30 \\| bad" in text
    assert "`avg_pool2d_k4` qnn-v75 8a8w (xfail): emulator" in text
