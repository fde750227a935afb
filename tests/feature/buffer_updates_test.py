"""A model that updates a registered buffer in place (issue 23, class 1: the static-KV-cache
pattern), through the real pipeline on every backend, float and quantized: right, or refused.

What was wrong: on QNN the buffer was delegated to the HTP graph (upstream's default), whose
runtime never fills it: garbage at fp16, off by units when quantized, or a failed lowering when
the buffer itself is returned. On every backend the .pte left the buffer's initial value out
(ExecuTorch starts a mutated buffer at zeros), calibration and the references ran on the
program's own buffers (the saved program started from the last sample's state), and a float
program failed to serialize under autograd.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.stages import PROGRAM
from qnn_common.torchio.program_state import buffers
from qnn_common.torchio.programs import load_program
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from support.stateful_models import initial_cache

_INDEX = "support.stateful_models:static_cache"  # cache.index_put_((pos,), rows)
_SLICE = "support.stateful_models:slice_cache"  # cache[2:4] = rows

# (model, backend, soc, recipe, SQNR floor vs eager fp32 in dB)
_CELLS = [
    (_INDEX, "xnnpack", None, "fp32", 60.0),
    (_INDEX, "xnnpack", None, "8a8w", 25.0),
    (_INDEX, "portable", None, "fp32", 60.0),
    (_INDEX, "qnn", "SM8650", "fp16", 40.0),
    (_INDEX, "qnn", "SM8650", "16a8w", 30.0),
    # Quantized, the slice write was lost (XNNPACK: the old rows, silently; QNN: no graph inputs).
    (_SLICE, "xnnpack", None, "8a8w", 25.0),
    (_SLICE, "qnn", "SM8650", "16a8w", 30.0),
]


def _run(out: Path, model: str, backend: str, soc: str | None, recipe: str) -> dict[str, Any]:
    ctx = PipelineContext.create(
        model, backend=backend, soc=soc, recipe=recipe, out_dir=out,
        prepare={"calibration_samples": 8, "eval_samples": 3},
        infer={"warmup": 1, "runs": 2},
    )
    return run_pipeline(ctx).checked().summary


def _stage_dir(out: Path, stage: str) -> Path:
    (found,) = (p for p in out.iterdir() if p.is_dir() and p.name.startswith(f"{stage}-"))
    return found


@pytest.mark.parametrize(
    ("model", "backend", "soc", "recipe", "floor"), _CELLS,
    ids=[f"{'slice' if m == _SLICE else 'index'}-{b}-{r}" for m, b, _, r, _ in _CELLS],
)
def test_a_buffer_updated_in_place_runs_right(
    model: str, backend: str, soc: str | None, recipe: str, floor: float, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    summary = _run(out, model, backend, soc, recipe)
    accuracy = summary["accuracy"]
    assert float(accuracy["sqnr_db_vs_fp32"]) > floor, accuracy
    assert accuracy["ok"] is True, accuracy
    # Every program handed on starts from the buffer's registered value, not a sample's state.
    quantized = any(p.name.startswith("quantize-") for p in out.iterdir())
    assert quantized is (recipe not in ("fp32", "fp16"))
    for stage in ("prepare", "quantize") if quantized else ("prepare",):
        program = load_program(_stage_dir(out, stage) / PROGRAM)
        (cache,) = (t for name, t in buffers(program).items() if name.endswith("cache"))
        torch.testing.assert_close(cache, initial_cache(), rtol=0, atol=0)
