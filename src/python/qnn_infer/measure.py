"""Timing a runner and comparing its outputs with a reference."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from qnn_common import metrics
from qnn_common.errors import ConfigValidationError
from qnn_infer.runner import Runner, describe


def measure_latency(
    runner: Runner,
    inputs: tuple[torch.Tensor, ...],
    *,
    warmup: int = 3,
    runs: int = 20,
) -> dict[str, float]:
    """Time `runs` executions after `warmup` untimed ones: p50_ms, p90_ms, mean_ms, min_ms."""
    if warmup < 0:
        raise ConfigValidationError("infer.warmup", warmup, "must be >= 0")
    if runs < 1:
        raise ConfigValidationError("infer.runs", runs, "must be >= 1")
    for _ in range(warmup):
        runner.run(inputs)
    times_ms = []
    for _ in range(runs):
        start = time.perf_counter()
        runner.run(inputs)
        times_ms.append((time.perf_counter() - start) * 1e3)
    return {
        "p50_ms": float(np.percentile(times_ms, 50)),
        "p90_ms": float(np.percentile(times_ms, 90)),
        "mean_ms": statistics.fmean(times_ms),
        "min_ms": min(times_ms),
    }


def compare_outputs(
    reference: Sequence[torch.Tensor], actual: Sequence[torch.Tensor]
) -> list[dict[str, float]]:
    """Per output: sqnr_db, cosine and max_abs_error of `actual` against `reference`.

    Raises:
        ConfigValidationError: the two differ in output count or in an output's shape.
    """
    if len(reference) != len(actual):
        raise ConfigValidationError(
            "outputs",
            len(actual),
            f"the program returned {len(actual)} output(s), the reference has {len(reference)}",
        )
    results = []
    for i, (ref, got) in enumerate(zip(reference, actual, strict=True)):
        if tuple(ref.shape) != tuple(got.shape):
            raise ConfigValidationError(
                f"outputs[{i}]",
                describe(got.dtype, got.shape),
                f"the reference is {describe(ref.dtype, ref.shape)}",
            )
        ref_np = _to_float64(ref)
        got_np = _to_float64(got)
        results.append(
            {
                "sqnr_db": metrics.sqnr_db(ref_np, got_np),
                "cosine": metrics.cosine(ref_np, got_np),
                "max_abs_error": metrics.max_abs_error(ref_np, got_np),
            }
        )
    return results


def _to_float64(t: torch.Tensor) -> np.ndarray[Any, np.dtype[np.float64]]:
    return t.detach().cpu().to(torch.float64).numpy()
