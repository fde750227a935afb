"""Timing a runner and comparing its outputs with a reference."""

from __future__ import annotations

import logging
import math
import random
import time
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from qnn_common.config import MAX_RUNS, MAX_WARMUP
from qnn_common.errors import ConfigValidationError
from qnn_common.numerics import metrics
from qnn_infer.runner import Runner, describe

log = logging.getLogger(__name__)


# Latency quantiles come from a uniform reservoir of this many runs: exact up to it, a fixed-size
# random sample beyond (quantile error ~1/sqrt(size), well under run-to-run noise), so memory
# stays constant however many runs are asked for.
RESERVOIR_SIZE = 10_000
# The timed loop logs how far it got at most this often (seconds), so a long run shows progress.
PROGRESS_EVERY_S = 10.0


class LatencyStats:
    """Running latency statistics in constant memory: count, mean, min, max exactly, and
    quantiles from a reservoir sample (Vitter's algorithm R, seeded, so runs are repeatable)."""

    def __init__(self, reservoir_size: int = RESERVOIR_SIZE, seed: int = 0) -> None:
        if reservoir_size < 1:
            raise ValueError(f"reservoir_size must be >= 1, got {reservoir_size}")
        self._size = reservoir_size
        self._reservoir = array("d")
        self._rng = random.Random(seed)
        self.count = 0
        self._sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        """Record one observation."""
        self.count += 1
        self._sum += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        if len(self._reservoir) < self._size:
            self._reservoir.append(value)
        else:
            slot = self._rng.randrange(self.count)
            if slot < self._size:
                self._reservoir[slot] = value

    @property
    def mean(self) -> float:
        return self._sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """The q-th percentile (0..100), linear interpolation as numpy.percentile's default."""
        if not self._reservoir:
            return math.nan
        return float(np.percentile(np.frombuffer(self._reservoir, dtype=np.float64), q))

    def nbytes(self) -> int:
        """Bytes held for the samples: bounded by the reservoir, whatever the count."""
        return self._reservoir.buffer_info()[1] * self._reservoir.itemsize


def measure_latency(
    runner: Runner,
    inputs: tuple[torch.Tensor, ...],
    *,
    warmup: int = 3,
    runs: int = 20,
) -> dict[str, float]:
    """Time `runs` executions after `warmup` untimed ones: p50_ms, p90_ms, mean_ms, min_ms.

    Memory does not grow with `runs` (see LatencyStats); a long loop logs its progress every
    PROGRESS_EVERY_S seconds.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= MAX_WARMUP:
        raise ConfigValidationError("infer.warmup", warmup, f"must be in 0..{MAX_WARMUP}")
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_RUNS:
        raise ConfigValidationError("infer.runs", runs, f"must be in 1..{MAX_RUNS}")
    for _ in range(warmup):
        runner.run(inputs)
    stats = LatencyStats()
    next_report = time.monotonic() + PROGRESS_EVERY_S
    for i in range(runs):
        start = time.perf_counter()
        runner.run(inputs)
        stats.add((time.perf_counter() - start) * 1e3)
        if time.monotonic() >= next_report:
            next_report = time.monotonic() + PROGRESS_EVERY_S
            log.info("timed %d of %d runs (p50 so far %.3f ms)", i + 1, runs, stats.quantile(50))
    return {
        "p50_ms": stats.quantile(50),
        "p90_ms": stats.quantile(90),
        "mean_ms": stats.mean,
        "min_ms": stats.min,
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
