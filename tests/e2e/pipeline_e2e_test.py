"""End to end, for real: built-in models through all four stages on XNNPACK, then again (cached).

No mocks: real torch.export, real torchao PT2E quantization, real ExecuTorch lowering, and the
.pte executed by the ExecuTorch runtime.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qnn_common.config import Stage
from qnn_common.recipes import Recipe
from qnn_common.sealing import load_manifest
from qnn_pipeline.cli import main as pipeline_main
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from support.summary import stage_statuses

SUMMARY_KEYS = {"model", "backend", "recipe", "soc", "stages", "accuracy", "latency_ms",
                "pte_bytes"}



@pytest.fixture(scope="module")
def minilm_8a8w(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("minilm")
    code = pipeline_main(
        ["--model", "minilm", "--out", str(out), "--seq-len", "64",
         "--calibration-samples", "8", "--runs", "5"]
    )
    assert code == 0
    return out, json.loads((out / "summary.json").read_text())


def test_minilm_8a8w_embeddings_match_fp32(minilm_8a8w: tuple[Path, dict[str, Any]]) -> None:
    out, summary = minilm_8a8w
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["backend"] == "xnnpack" and summary["recipe"] == "8a8w"
    assert summary["soc"] is None
    assert stage_statuses(summary) == {s.value: "ran" for s in Stage}
    accuracy = summary["accuracy"]
    assert isinstance(accuracy, dict)
    assert float(accuracy["cosine_vs_fp32"]) >= 0.99
    # The reference scales dynamic activations per row, as XNNPACK does (per tensor: ~18 dB).
    assert float(accuracy["sqnr_db_vs_fake_quant"]) >= 22
    # The encoder's 36 linears quantize their activations per call (qnn_quant.layers).
    assert summary["dynamic_ops"] == 36
    assert summary["quantized_op_kinds"]["linear"] == 36
    latency = summary["latency_ms"]
    assert isinstance(latency, dict) and 0 < latency["p50"] <= latency["p90"]
    pte_bytes = summary["pte_bytes"]
    assert isinstance(pte_bytes, int) and pte_bytes > 1_000_000  # int8 weights of 22M params
    for stage in summary["stages"]:
        manifest = load_manifest(Path(stage["artifact"]), expect_stage=stage["name"])
        assert manifest.tools["executorch"] != "not installed"


def test_minilm_second_run_is_fully_cached(minilm_8a8w: tuple[Path, dict[str, Any]]) -> None:
    out, first = minilm_8a8w
    code = pipeline_main(
        ["--model", "minilm", "--out", str(out), "--seq-len", "64",
         "--calibration-samples", "8", "--runs", "5"]
    )
    assert code == 0
    second = json.loads((out / "summary.json").read_text())
    assert stage_statuses(second) == {s.value: "cached" for s in Stage}
    assert second["pte_bytes"] == first["pte_bytes"]


def test_tiny_cnn_fp32_path_is_exact(tmp_path: Path) -> None:
    ctx = PipelineContext.create("tiny-cnn", skip=frozenset({Stage.QUANTIZE}), out_dir=tmp_path,
                                 infer={"runs": 5})
    assert ctx.recipe is Recipe.FP32
    result = run_pipeline(ctx).checked()
    statuses = stage_statuses(result.summary)
    assert statuses["quantize"] == "skipped" and statuses["infer"] == "ran"
    assert float(result.summary["accuracy"]["sqnr_db_vs_fp32"]) >= 60


def test_tiny_cnn_8a8w_then_cached_and_force(tmp_path: Path) -> None:
    ctx = PipelineContext.create("tiny-cnn", out_dir=tmp_path, infer={"runs": 5})
    first = run_pipeline(ctx).checked()
    acc = first.summary["accuracy"]
    # The .pte computes what fake-quant computes; both are close to fp32.
    assert float(acc["sqnr_db_vs_fake_quant"]) >= 30
    assert float(acc["sqnr_db_vs_fp32"]) >= 25
    assert all(r.status == "cached" for r in run_pipeline(ctx).checked().records)
    forced = run_pipeline(PipelineContext.create("tiny-cnn", out_dir=tmp_path, force=True,
                                                 infer={"runs": 5}))
    assert all(r.status == "ran" for r in forced.records)


def test_tiny_llama_causal_lm_path(tmp_path: Path) -> None:
    """A decoder through all four stages: HF loading, constant causal mask, PT2E, XNNPACK."""
    ctx = PipelineContext.create("tiny-llama", out_dir=tmp_path,
                                 prepare={"seq_len": 16, "calibration_samples": 4},
                                 infer={"runs": 3})
    summary = run_pipeline(ctx).checked().summary
    assert stage_statuses(summary) == {s.value: "ran" for s in Stage}
    assert float(summary["accuracy"]["sqnr_db_vs_fp32"]) >= 20
    assert float(summary["accuracy"]["sqnr_db_vs_fake_quant"]) >= 20
