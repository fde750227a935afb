"""Where a model's error enters: each decoder block's output against the reference's on the
same windows, as a signal-to-noise ratio (the reference's output power over the difference's).
A block after which the ratio falls much is where the recipe loses; a steady slope is error
carried forward. Read from taps the models' modules carry (`qnn_quant.block_taps.BlockTap`):
the float and the fake-quantized model, never a .pte."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from qnn_common.causal_lm.steps import StepLm
from qnn_infer.evaluation.lm import logits


class Tap(Protocol):
    """Records each block's output while `active`; `take` returns and forgets them."""

    active: bool

    def take(self) -> dict[int, list[torch.Tensor]]: ...


def block_errors(
    reference: StepLm, reference_tap: Tap, model: StepLm, tap: Tap,
    windows: Sequence[list[int]],
) -> dict[str, Any]:
    """Per block, over `windows`: SQNR in dB of `model`'s output against `reference`'s, and how
    much it fell from the block before. Blocks whose outputs the two models do not both record
    (or record in other shapes) are left out."""
    signal: dict[int, float] = {}
    noise: dict[int, float] = {}
    tokens = 0
    for ids in windows:
        ours = _recorded(reference, reference_tap, ids)
        theirs = _recorded(model, tap, ids)
        tokens += len(ids)
        for block, outputs in ours.items():
            others = theirs.get(block, [])
            if len(others) != len(outputs):
                continue
            for a, b in zip(outputs, others, strict=True):
                if a.shape != b.shape:
                    continue
                signal[block] = signal.get(block, 0.0) + float(a.pow(2).sum())
                noise[block] = noise.get(block, 0.0) + float((a - b).pow(2).sum())
    rows: list[dict[str, Any]] = []
    for block in sorted(signal):
        db = _db(signal[block], noise[block])
        fell = None if not rows else round(rows[-1]["sqnr_db"] - db, 2)
        rows.append({"block": block, "sqnr_db": round(db, 2), "fell_db": fell})
    return {"reference": reference.name, "model": model.name, "tokens": tokens,
            "windows": len(windows), "blocks": rows}


def _recorded(lm: StepLm, tap: Tap, ids: list[int]) -> dict[int, list[torch.Tensor]]:
    tap.take()
    tap.active = True
    try:
        logits(lm, ids)
    finally:
        tap.active = False
    return tap.take()


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return 200.0  # identical outputs: a finite ceiling JSON can hold
    return 10 * math.log10(max(signal, 1e-30) / noise)


def worst_blocks(errors: dict[str, Any], count: int = 3) -> list[dict[str, Any]]:
    """The blocks after which the ratio fell most (the first block: from the ceiling)."""
    rows = [r for r in errors["blocks"] if r["fell_db"] is not None]
    return sorted(rows, key=lambda r: -r["fell_db"])[:count]
