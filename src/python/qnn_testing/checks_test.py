"""The checks pass on matches, and a failure names the worst element and every error measure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qnn_testing.checks import (
    Check,
    CosineSimilarity,
    SkipOutputCheck,
    Sqnr,
    Tolerance,
    check_outputs,
    output_sqnr,
    summarize,
)


def _pair() -> tuple[np.ndarray, np.ndarray]:
    ref = np.linspace(-1.0, 1.0, 24).reshape(2, 3, 4)
    got = ref.copy()
    got[1, 2, 3] += 0.5  # one bad element
    return ref, got


def test_exact_outputs_pass_every_check() -> None:
    ref, _ = _pair()
    checks = (Tolerance(0.0, 0.0), Sqnr(100.0), CosineSimilarity(1.0))
    assert check_outputs(checks, [ref], [ref.copy()]) == []
    assert output_sqnr([ref], [ref]) == math.inf


@pytest.mark.parametrize("check", [Tolerance(1e-3, 1e-3), Sqnr(40.0), CosineSimilarity(0.9999)])
def test_a_failure_reports_worst_element_and_all_measures(check: Check) -> None:
    ref, got = _pair()
    failures = check_outputs((check,), [ref], [got])
    assert len(failures) == 1
    text = failures[0]
    for part in (
        "output 0",
        "(1, 2, 3)",
        "expected 1",
        "got 1.5",
        "max abs error 0.5",
        "max rel error",
        "SQNR",
        "cosine",
    ):
        assert part in text, (part, text)


def test_tolerance_counts_the_elements_outside() -> None:
    ref, got = _pair()
    assert check_outputs((Tolerance(0.0, 0.1),), [ref], [got])[0].startswith(
        "output 0: 1/24 elements outside"
    )


def test_nan_output_never_passes_and_is_the_worst_element() -> None:
    ref, got = _pair()
    got[0, 0, 1] = np.nan
    summary = summarize(ref, got)
    assert summary.worst_index == (0, 0, 1)
    assert summary.sqnr_db == -math.inf
    assert check_outputs((Tolerance(1.0, 1.0),), [ref], [got])


def test_shape_and_count_mismatches_are_reported_before_metrics() -> None:
    ref, _ = _pair()
    assert check_outputs((Sqnr(0.0),), [ref], [ref.reshape(6, 4)]) == [
        "output 0: shape (6, 4), expected (2, 3, 4)"
    ]
    assert check_outputs((Sqnr(0.0),), [ref, ref], [ref]) == ["1 outputs, expected 2"]


def test_skip_output_check_compares_shapes_only_and_needs_a_reason() -> None:
    ref, got = _pair()
    assert check_outputs((SkipOutputCheck("uninitialized memory"),), [ref], [got * 7]) == []
    with pytest.raises(TypeError):
        SkipOutputCheck()  # type: ignore[call-arg]  # the reason is mandatory: that is the test


def test_no_checks_is_refused() -> None:
    ref, _ = _pair()
    with pytest.raises(ValueError, match="at least one check"):
        check_outputs((), [ref], [ref])


def test_empty_outputs_match() -> None:
    empty = np.zeros((0, 16))
    assert check_outputs((Sqnr(40.0), Tolerance(0.0, 0.0)), [empty], [empty.copy()]) == []
