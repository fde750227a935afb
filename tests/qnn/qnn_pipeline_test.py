"""The QNN HTP backend end to end: prepare -> quantize -> compile for a SoC -> run on the emulator.

Nothing is mocked: real PT2E quantization with QnnQuantizer, real HTP context binaries built by
the QNN 2.51 x86 libraries (through the project's development SDK and its compatibility bridge),
and the .pte executed in-process by the ExecuTorch runtime on the x86 HTP emulator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.config import Stage
from qnn_common.errors import BackendNotAvailableError, ConfigValidationError
from qnn_common.recipes import Backend, Recipe
from qnn_common.sealing import load_manifest
from qnn_common.stages import PROGRAM
from qnn_common.torchio.programs import load_program
from qnn_pipeline.cli import main as pipeline_main
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from support import (  # the models below, by name (an import, so Pants ships them)
    conv_models,
    encoder_models,
    htp_parity_models,
)
from support.summary import read_summary


def _run(out: Path, model: str, soc: str, recipe: Recipe, **prepare: Any) -> dict[str, Any]:
    ctx = PipelineContext.create(
        model, backend=Backend.QNN, recipe=recipe, soc=soc, out_dir=out,
        prepare={"calibration_samples": 4, "eval_samples": 2, **prepare},
        infer={"runs": 3, "warmup": 1},
    )
    return run_pipeline(ctx).checked().summary


def _manifest(summary: dict[str, Any], stage: Stage) -> Any:
    (entry,) = (s for s in summary["stages"] if s["name"] == stage.value)
    return load_manifest(Path(entry["artifact"]), expect_stage=stage)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One output directory for the module: stages shared between tests (prepare) run once.
    return tmp_path_factory.mktemp("qnn")


@pytest.mark.parametrize("soc", ["SM8650", "SM8550", "SM8850"])
def test_tiny_cnn_fp16_per_soc(out: Path, soc: str) -> None:
    summary = _run(out, "tiny-cnn", soc, Recipe.FP16)
    assert summary["backend"] == "qnn" and summary["soc"] == soc
    assert float(summary["accuracy"]["sqnr_db_vs_fp32"]) >= 50.0  # measured 65.5 dB
    assert summary["delegated_ops"] > 0 and summary["non_delegated_ops"] == 0
    target = summary["target"]
    assert target["soc"] == soc and target["htp_arch"] == {"SM8650": "V75", "SM8550": "V73",
                                                          "SM8850": "V81"}[soc]
    compile_manifest = _manifest(summary, Stage.COMPILE)
    assert compile_manifest.metrics["partitions"] == 1
    for stage in (Stage.COMPILE, Stage.INFER):
        tools = _manifest(summary, stage).tools
        assert tools["qnn"].startswith("2.")
        assert tools["qnn_bridge"] in ("yes", "no")
    sdk = compile_manifest.metrics["target"]["qnn_sdk"]
    assert sdk["qnn_version"] == compile_manifest.tools["qnn"]


# 16a4w on a decoder: tests/qnn/qnn_llm_test.py, with its KV cache and generating.
@pytest.mark.parametrize("recipe", [Recipe.A16W16])
def test_tiny_llama_16bit_activations_match_fake_quant(out: Path, recipe: Recipe) -> None:
    summary = _run(out, "tiny-llama", "SM8650", recipe, seq_len=16)
    # Measured 45-47 dB: the HTP computes what the quantizer's fake quant predicts.
    assert float(summary["accuracy"]["sqnr_db_vs_fake_quant"]) >= 40.0
    program = _manifest(summary, Stage.QUANTIZE)
    assert program.config["recipe"] == recipe.value
    compiled = _manifest(summary, Stage.COMPILE).metrics
    assert compiled["partitions"] >= 1 and compiled["delegated_ops"] > 100


def test_lpbq_blocks_linears_and_pointwise_convs(out: Path) -> None:
    # Issue 23, class 3: LPBQ used to block linears only, so a convolutional model was refused.
    summary = _run(out, f"{conv_models.__name__}:pointwise_and_spatial", "SM8650",
                   Recipe.A16W4_BLOCK)
    (entry,) = (s for s in summary["stages"] if s["name"] == Stage.QUANTIZE.value)
    graph = load_program(Path(entry["artifact"]) / PROGRAM).graph
    blocks = sorted(
        tuple(n.args[1]) for n in graph.nodes
        if str(n.target) == "torchao.dequantize_affine.default"
    )
    # The 1x1 convolution's, and the linear's, run as one (qnn_quant.quantizers.lpbq).
    assert blocks == [(1, 16, 1, 1), (1, 16, 1, 1)]
    per_channel = [
        n for n in graph.nodes
        if str(n.target) == "quantized_decomposed.dequantize_per_channel.default"
        and tuple(n.args[0].meta["val"].shape) == (32, 32, 3, 3)
    ]
    assert len(per_channel) == 1  # the 3x3 convolution: blocked, QNN computes garbage
    # Measured 36.9 dB for the 1x1 convolution alone; blocked 3x3 ones read 0.5 dB.
    assert float(summary["accuracy"]["sqnr_db_vs_fake_quant"]) >= 30.0
    assert _manifest(summary, Stage.COMPILE).metrics["non_delegated_ops"] == 0


@pytest.mark.parametrize("recipe", [Recipe.A8W8, Recipe.A16W8])
def test_a_weight_shared_by_a_conv_and_a_linear(out: Path, recipe: Recipe) -> None:
    # Issue 23, class 4: the linear read the weight through a reshape, quantized as an activation
    # and then per channel; QNN's AnnotateQuantAttrs failed on it (so do the plain upstream calls).
    summary = _run(out, f"{conv_models.__name__}:shared_weight", "SM8650", recipe)
    # Measured 45.9 dB (8a8w) and 83.7 dB (16a8w).
    assert float(summary["accuracy"]["sqnr_db_vs_fake_quant"]) >= 35.0
    (entry,) = (s for s in summary["stages"] if s["name"] == Stage.QUANTIZE.value)
    graph = load_program(Path(entry["artifact"]) / PROGRAM).graph
    per_channel = [
        n for n in graph.nodes
        if str(n.target) == "quantized_decomposed.dequantize_per_channel.default"
        and n.args[-1] in (torch.int8, torch.uint8)
    ]
    assert len(per_channel) == 2  # the convolution's weight and the linear's, each once
    assert not any(str(n.target).endswith("quantize_per_channel.default")
                   and not str(n.target).startswith("quantized_decomposed.de")
                   for n in graph.nodes)  # no weight re-quantized in the graph


def test_bert_8a8w_is_quantized_whole_and_runs_whole_on_the_htp(out: Path) -> None:
    # The FFN down projections used to stay float at 8a8w on QNN (an XNNPACK remedy for their
    # outliers); QNN then failed to lower them ("aten.linear ... not decomposed or delegated").
    summary = _run(out, f"{encoder_models.__name__}:tiny_bert", "SM8650", Recipe.A8W8)
    (entry,) = (s for s in summary["stages"] if s["name"] == Stage.QUANTIZE.value)
    graph = load_program(Path(entry["artifact"]) / PROGRAM).graph
    linears = [n for n in graph.nodes if n.target == torch.ops.aten.linear.default]
    assert len(linears) == 12  # q, k, v, attention output, FFN up, FFN down; two layers
    for linear in linears:  # every weight through a per-channel dequantize
        assert "dequantize_per_channel" in str(linear.args[1].target), linear.name
    compiled = _manifest(summary, Stage.COMPILE).metrics
    # All but the two casts of the integer attention mask (as `mask + 0.0`, see
    # qnn_quant.quantizers.qnn), which the HTP refuses and the CPU computes: the
    # padding mask before the layers, the pooling weights after them.
    assert compiled["non_delegated_op_counts"] == {"aten.add.Tensor": 2}
    assert compiled["partitions"] == 2 and compiled["delegated_ops"] > 150
    # Measured 44.7 dB (random weights: no outlier channels).
    assert float(summary["accuracy"]["sqnr_db_vs_fake_quant"]) >= 35.0


@pytest.mark.parametrize("recipe", [Recipe.A8W8, Recipe.A16W8])
def test_causal_attention_is_one_partition_and_matches(out: Path, recipe: Recipe) -> None:
    # Issue 23: QNN's decomposition of `is_causal` builds the mask from constants alone, a
    # partition QNN cannot build ("No graph inputs present") unless folded; at 16 bits the folded
    # mask's -inf took the scores' whole range, unless the quantizer clamps it (MASK_VALUE).
    summary = _run(out, f"{htp_parity_models.__name__}:causal_attention", "SM8650", recipe)
    compiled = _manifest(summary, Stage.COMPILE).metrics
    assert compiled["partitions"] == 1 and compiled["non_delegated_ops"] == 0
    accuracy = summary["accuracy"]
    if recipe is Recipe.A16W8:
        # Without the clamp the fake-quant model itself read under 20 dB against fp32.
        assert float(accuracy["fake_quant_sqnr_db_vs_fp32"]) >= 35.0
        assert float(accuracy["sqnr_db_vs_fake_quant"]) >= 40.0
    else:
        # At 8 bits the sum's 256 levels span the clamped mask: a step of about 1.0 in the
        # scores, which the HTP and fake quant round apart (docs/known-limits.md).
        assert float(accuracy["sqnr_db_vs_fake_quant"]) >= 20.0


@pytest.mark.parametrize("recipe", [Recipe.A8W8, Recipe.A16W8])
def test_sampling_on_a_computed_affine_grid_is_one_partition(out: Path, recipe: Recipe) -> None:
    # Issue 23: `affine_grid` stayed float through quantization and was decomposed after it; its
    # transpose then failed QNN's op validation and ran on the CPU between partitions.
    summary = _run(out, f"{htp_parity_models.__name__}:affine_sample", "SM8650", recipe)
    compiled = _manifest(summary, Stage.COMPILE).metrics
    assert compiled["partitions"] == 1 and compiled["non_delegated_ops"] == 0
    (entry,) = (s for s in summary["stages"] if s["name"] == Stage.QUANTIZE.value)
    graph = load_program(Path(entry["artifact"]) / PROGRAM).graph
    assert not any("affine_grid" in str(n.target) for n in graph.nodes)  # decomposed first
    # The grid's coordinates are 8-bit activations at 8a8w, a step of 1/128 of the image.
    floor = 20.0 if recipe is Recipe.A8W8 else 40.0
    assert float(summary["accuracy"]["sqnr_db_vs_fake_quant"]) >= floor


def test_a_cast_to_int_and_back_truncates_on_the_htp(out: Path) -> None:
    # QNN's preprocess fused `x.to(int32).to(float32)` into `x` (no truncation): 9 dB against
    # eager in the op suite. The compile truncates the cast's input explicitly (int_casts.py).
    summary = _run(out, f"{htp_parity_models.__name__}:truncating", "SM8650", Recipe.FP16)
    compiled = _manifest(summary, Stage.COMPILE).metrics
    assert compiled["partitions"] == 1 and compiled["non_delegated_ops"] == 0
    # Measured 72.6 dB (28.8 without the truncation: the pipeline's 30 dB gate failed).
    assert float(summary["accuracy"]["sqnr_db_vs_fp32"]) >= 60.0


def test_minilm_16a8w_on_sm8550(out: Path) -> None:
    summary = _run(out, "minilm", "SM8550", Recipe.A16W8, seq_len=32)
    assert float(summary["accuracy"]["cosine_vs_fp32"]) >= 0.98


def test_minilm_fp16_on_sm8650(out: Path) -> None:
    summary = _run(out, "minilm", "SM8650", Recipe.FP16, seq_len=32)
    assert float(summary["accuracy"]["cosine_vs_fp32"]) >= 0.999


def test_second_run_is_cached(out: Path) -> None:
    first = _run(out, "tiny-cnn", "SM8650", Recipe.FP16)
    again = _run(out, "tiny-cnn", "SM8650", Recipe.FP16)
    assert {s["status"] for s in again["stages"]} == {"cached", "skipped"}
    assert again["pte_bytes"] == first["pte_bytes"]


def test_the_cli_runs_qnn_end_to_end(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = pipeline_main(["--model", "tiny-cnn", "--backend", "qnn", "--soc", "sm8750",
                          "--recipe", "fp16", "--out", str(out / "cli"), "--runs", "2",
                          "--htp-performance-mode", "high_performance"])
    assert code == 0
    summary = read_summary(out / "cli")
    assert summary["soc"] == "SM8750" and summary["target"]["htp_performance_mode"] == (
        "high_performance"
    )
    assert "on qnn (fp16, SM8750)" in capsys.readouterr().out


def test_missing_sdk_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path / "no-sdk"))
    ctx = PipelineContext.create("tiny-cnn", backend=Backend.QNN, recipe=Recipe.FP16,
                                 soc="SM8650", out_dir=tmp_path / "out")
    with pytest.raises(BackendNotAvailableError, match="libQnnHtp.so") as info:
        run_pipeline(ctx).checked()
    assert "QNN_SDK_ROOT" in str(info.value)
    assert not (tmp_path / "out").exists()  # not even prepare ran


def test_unknown_soc_names_the_closest() -> None:
    with pytest.raises(ConfigValidationError, match="did you mean SM8650"):
        PipelineContext.create("tiny-cnn", backend=Backend.QNN, recipe=Recipe.FP16, soc="SM8655")


def test_recipe_the_arch_cannot_run_says_why() -> None:
    with pytest.raises(ConfigValidationError, match=r"needs HTP >= V73.*SM8350 is V68"):
        PipelineContext.create("tiny-cnn", backend=Backend.QNN, recipe=Recipe.A16W16,
                               soc="SM8350")


def test_qnn_needs_a_soc_and_xnnpack_takes_none() -> None:
    with pytest.raises(ConfigValidationError, match="compiles for one SoC"):
        PipelineContext.create("tiny-cnn", backend=Backend.QNN, recipe=Recipe.FP16)
    with pytest.raises(ConfigValidationError, match="takes no SoC"):
        PipelineContext.create("tiny-cnn", backend=Backend.XNNPACK, soc="SM8650")
