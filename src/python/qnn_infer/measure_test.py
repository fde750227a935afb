"""Latency statistics in constant memory, and the timed loop's bounds and progress."""

from __future__ import annotations

import logging
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from qnn_common.config import MAX_RUNS
from qnn_common.errors import ConfigValidationError
from qnn_infer import measure
from qnn_infer.measure import RESERVOIR_SIZE, LatencyStats, measure_latency
from qnn_infer.runner import HostRunner

SHAPE = (1, 8)


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


@pytest.fixture(scope="module")
def tiny_pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real XNNPACK program, as small as they come, so that a run costs microseconds."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    ep = torch.export.export(_Tiny().eval(), (torch.randn(*SHAPE),), strict=False)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    path = tmp_path_factory.mktemp("measure") / "tiny.pte"
    path.write_bytes(bytes(edge.to_executorch().buffer))
    return path


def test_exact_below_the_reservoir_size() -> None:
    rng = random.Random(2)
    values = [rng.expovariate(1.0) for _ in range(5000)]
    stats = LatencyStats()
    for v in values:
        stats.add(v)
    for q in (50, 90):
        assert stats.quantile(q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    assert stats.mean == pytest.approx(float(np.mean(values)))
    assert stats.min == min(values) and stats.max == max(values) and stats.count == 5000


def test_memory_is_bounded_and_quantiles_stay_close() -> None:
    """A million observations hold no more than the reservoir; p50 / p90 stay within 2%."""
    rng = np.random.default_rng(3)
    values = rng.lognormal(mean=0.0, sigma=0.3, size=1_000_000)
    stats = LatencyStats()
    for v in values.tolist():
        stats.add(v)
    assert stats.count == 1_000_000
    assert stats.nbytes() <= RESERVOIR_SIZE * 8
    for q in (50, 90):
        assert stats.quantile(q) == pytest.approx(float(np.percentile(values, q)), rel=0.02)
    assert stats.mean == pytest.approx(float(values.mean()), rel=1e-9)


def test_empty_stats_are_nan() -> None:
    stats = LatencyStats()
    assert np.isnan(stats.quantile(50)) and np.isnan(stats.mean)


def test_timed_loop_memory_does_not_grow_with_runs(tiny_pte: Path) -> None:
    """Real runs of a real program: the traced peak for 20,000 runs (measured: 190 KB, the
    reservoir is 80 of it) stays under what a list of them alone took before (660 KB)."""
    runner = HostRunner(tiny_pte)
    inputs = (torch.randn(*SHAPE),)
    measure_latency(runner, inputs, warmup=1, runs=10)  # first-run allocations out of the way
    tracemalloc.start()
    try:
        stats = measure_latency(runner, inputs, warmup=0, runs=20_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 < stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"]
    assert peak < 450_000, f"peak {peak} bytes traced while timing 20,000 runs"


def test_long_loops_report_progress(
    tiny_pte: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(measure, "PROGRESS_EVERY_S", 0.0)  # report at every run
    with caplog.at_level(logging.INFO, logger="qnn_infer.measure"):
        measure_latency(HostRunner(tiny_pte), (torch.randn(*SHAPE),), warmup=0, runs=3)
    assert "timed 3 of 3 runs" in caplog.text


@pytest.mark.parametrize(("warmup", "runs"), [(0, MAX_RUNS + 1), (10**6, 1), (0, True)])
def test_unbounded_counts_are_refused(tiny_pte: Path, warmup: int, runs: int) -> None:
    with pytest.raises(ConfigValidationError, match=r"infer\.(runs|warmup)"):
        measure_latency(HostRunner(tiny_pte), (torch.randn(*SHAPE),), warmup=warmup, runs=runs)
