"""Support for weight-rounding tests (GPTQ against round-to-nearest): calibration data where
GPTQ has something to win, a check that quantizing left the caller's program alone, and the
held-out comparison both roundings are judged by."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch.export import ExportedProgram

from qnn_common.numerics.metrics import sqnr_db
from qnn_common.recipes import WeightRounding

K = TypeVar("K")
R = TypeVar("R")


def low_rank_batches(
    count: int = 12, rows: int = 16, width: int = 32, rank: int = 6, seed: int = 1126
) -> list[tuple[torch.Tensor]]:
    """`count` single-input batches whose features mostly lie in a `rank`-dimensional subspace:
    correlated inputs, the case where rounding against the input's Hessian beats rounding each
    weight alone."""
    torch.manual_seed(seed)
    basis = torch.randn(rank, width)
    return [(torch.randn(rows, rank) @ basis + 0.05 * torch.randn(rows, width),)
            for _ in range(count)]


@contextmanager
def weights_kept(program: ExportedProgram) -> Iterator[None]:
    """Fails if the block changed any of `program`'s weights: its `.module()` shares them, so
    rounding in place would also round the caller's float reference."""
    before = {name: value.clone() for name, value in program.state_dict.items()}
    yield
    for name, value in program.state_dict.items():
        assert torch.equal(value, before[name]), f"{name} was changed in the caller's program"


def each_rounding(
    fp32: ExportedProgram, quantize: Callable[[WeightRounding], tuple[ExportedProgram, R]]
) -> tuple[dict[WeightRounding, ExportedProgram], dict[WeightRounding, R]]:
    """`quantize(rounding)` of `fp32` for every weight rounding: the programs and the results,
    by rounding; fails if any of them changed `fp32`'s weights (`weights_kept`)."""
    programs: dict[WeightRounding, ExportedProgram] = {}
    results: dict[WeightRounding, R] = {}
    with weights_kept(fp32):
        for rounding in WeightRounding:
            programs[rounding], results[rounding] = quantize(rounding)
    return programs, results


def held_out_sqnr(
    reference: ExportedProgram,
    programs: Mapping[K, ExportedProgram],
    batches: list[tuple[torch.Tensor]],
) -> dict[K, float]:
    """Each program's outputs on `batches` against `reference`'s, in dB."""
    with torch.no_grad():
        expected = torch.cat([reference.module()(*b) for b in batches]).numpy()
        return {key: sqnr_db(expected, torch.cat([p.module()(*b) for b in batches]).numpy())
                for key, p in programs.items()}
