"""Composable output checks: each judges one (reference, got) pair and explains a failure fully.

A check returns None when it passes and a sentence when it does not. Every failure sentence ends
with the same `describe_error` summary (worst element with its index, expected and got values,
max abs / rel error, SQNR, cosine), so a reader of a CI log knows what broke without rerunning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qnn_common.numerics.metrics import cosine, max_abs_error, sqnr_db

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ErrorSummary:
    """Where and how much two arrays differ."""

    worst_index: tuple[int, ...]
    expected: float
    got: float
    max_abs: float
    max_rel: float
    sqnr_db: float
    cosine: float

    def __str__(self) -> str:
        return (
            f"worst element at {self.worst_index}: expected {self.expected:.6g} "
            f"got {self.got:.6g}; "
            f"max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}, "
            f"SQNR {self.sqnr_db:.2f} dB, cosine {self.cosine:.6f}"
        )


def summarize(ref: Array, got: Array) -> ErrorSummary:
    """The error summary of `got` against `ref` (same shape; NaN compares as the worst)."""
    if ref.size == 0:
        return ErrorSummary((), 0.0, 0.0, 0.0, 0.0, math.inf, 1.0)
    diff = np.abs(got - ref)
    # A NaN in the output is the worst element there is; argmax would skip over it otherwise.
    diff = np.where(np.isnan(diff), np.inf, diff)
    flat = int(np.argmax(diff))
    index = tuple(int(i) for i in np.unravel_index(flat, ref.shape))
    rel = diff / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    finite = bool(np.isfinite(ref).all() and np.isfinite(got).all())
    return ErrorSummary(
        worst_index=index,
        expected=float(ref.flat[flat]),
        got=float(got.flat[flat]),
        max_abs=max_abs_error(ref, got) if finite else math.inf,
        max_rel=float(rel.max()),
        sqnr_db=sqnr_db(ref, got) if finite else -math.inf,
        cosine=cosine(ref, got) if finite else 0.0,
    )


@dataclass(frozen=True)
class Tolerance:
    """Element-wise |got - ref| <= atol + rtol * |ref|, like torch.allclose (NaN never passes)."""

    rtol: float
    atol: float

    def check(self, ref: Array, got: Array) -> str | None:
        """None if every element is within tolerance, else how many are not and the worst."""
        bad = ~(np.abs(got - ref) <= self.atol + self.rtol * np.abs(ref))
        if not bad.any():
            return None
        return (
            f"{int(bad.sum())}/{bad.size} elements outside rtol={self.rtol} atol={self.atol}; "
            f"{summarize(ref, got)}"
        )


@dataclass(frozen=True)
class Sqnr:
    """Signal-to-quantization-noise ratio at least `threshold_db`."""

    threshold_db: float

    def check(self, ref: Array, got: Array) -> str | None:
        """None if the SQNR reaches the threshold, else the measured value and the worst."""
        summary = summarize(ref, got)
        if summary.sqnr_db >= self.threshold_db:
            return None
        return f"SQNR {summary.sqnr_db:.2f} dB < {self.threshold_db} dB; {summary}"


@dataclass(frozen=True)
class CosineSimilarity:
    """Cosine similarity (outputs as flat vectors) at least `threshold`."""

    threshold: float

    def check(self, ref: Array, got: Array) -> str | None:
        """None if the cosine reaches the threshold, else the measured value and the worst."""
        summary = summarize(ref, got)
        if summary.cosine >= self.threshold:
            return None
        return f"cosine {summary.cosine:.6f} < {self.threshold}; {summary}"


@dataclass(frozen=True)
class SkipOutputCheck:
    """Compare nothing but the shape: for outputs with no meaningful values (e.g. torch.empty).

    `reason` is required, so that a skipped comparison always says why in the coverage table.
    """

    reason: str

    def check(self, ref: Array, got: Array) -> str | None:
        """Always None: only the shape check that precedes every metric applies."""
        return None


Check = Tolerance | Sqnr | CosineSimilarity | SkipOutputCheck


def check_outputs(
    checks: Sequence[Check], reference: Sequence[Array], got: Sequence[Array]
) -> list[str]:
    """Every failed check, per output, in words; empty when all pass.

    Output count and shapes are checked first: a metric over mismatched shapes means nothing.
    """
    if not checks:
        raise ValueError("a case must check something: pass at least one check")
    if len(reference) != len(got):
        return [f"{len(got)} outputs, expected {len(reference)}"]
    failures: list[str] = []
    for i, (ref, out) in enumerate(zip(reference, got, strict=True)):
        if ref.shape != out.shape:
            failures.append(f"output {i}: shape {out.shape}, expected {ref.shape}")
            continue
        failures += [f"output {i}: {msg}" for c in checks if (msg := c.check(ref, out))]
    return failures


def output_sqnr(reference: Sequence[Array], got: Sequence[Array]) -> float:
    """The worst SQNR over all outputs (what the coverage table reports); +inf for exact."""
    values = [
        summarize(r, g).sqnr_db for r, g in zip(reference, got, strict=True) if r.shape == g.shape
    ]
    if len(values) != len(reference):
        return -math.inf
    return min(values, default=math.inf)
