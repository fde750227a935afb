"""The 8da4w recipe for real: torchao's Int8DynamicActivationIntxWeightConfig on a trained tiny
decoder, lowered to XNNPACK (and portable), executed by the ExecuTorch runtime.

Structure is read from the .pte itself (`qnn_testing.xnnpack_graph`): every decoder linear of
both methods is one XNNPACK fully connected node with int8 activations quantized per token and
blockwise 4-bit weights, beside the float linears of its groups' offsets (asymmetric groups,
the default); the output head has int8 weights per channel. Numbers are the pipeline's own:
teacher-forced logits of the program against the eager fp32 HF model and the eager fake-quant
(torchao) program.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.cli.child_env import python_child_env
from qnn_common.config import Stage
from qnn_common.sealing import load_manifest
from qnn_common.stages import PROGRAM
from qnn_infer import cli as infer_cli  # imported: the child runs it (and Pants sees it)
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from qnn_testing.xnnpack_graph import (
    DYNAMIC_INT8_X_BLOCKWISE_INT4,
    DYNAMIC_INT8_X_CHANNEL_INT8,
    FLOAT_FC,
    cpu_operators,
    node_census,
)

PROMPT = "Once upon a time"
SHAPES = {"max_seq_len": 48, "prefill_len": 8}
# tiny-llama: 2 decoder layers x (q, k, v, o, gate, up, down), all with an input size (64 or
# 128) that groups of 32 tile, + the LM head (int8 weights). Linears that read one input are
# fused (qnn_quant.fused_linears): q+k+v, o, gate+up, down.
DECODER_LINEARS = 2 * 4
LINEARS_PER_METHOD = DECODER_LINEARS + 1


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _artifact(summary: dict[str, Any], stage: Stage) -> Path:
    (entry,) = (s for s in summary["stages"] if s["name"] == stage.value)
    return Path(entry["artifact"])


@pytest.fixture(scope="module")
def xnnpack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], list[str]]]:
    handler = _Lines()
    logger = logging.getLogger("qnn_quant")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        ctx = PipelineContext.create(
            "tiny-llama", backend="xnnpack", recipe="8da4w",
            out_dir=tmp_path_factory.mktemp("8da4w"),
            prepare={"kv_cache": True, "calibration_samples": 4, "eval_samples": 2, **SHAPES},
            infer={"generation": {"prompt": PROMPT, "max_new_tokens": 12}},
        )
        yield run_pipeline(ctx).checked().summary, handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_xnnpack_delegate_holds_every_linear_as_int8_dynamic_x_int4_or_int8(
    xnnpack: tuple[dict[str, Any], list[str]],
) -> None:
    summary, _ = xnnpack
    pte = (_artifact(summary, Stage.COMPILE) / "model.pte").read_bytes()
    census = node_census(pte)
    assert set(census) == {"prefill", "decode"}
    for method, nodes in census.items():
        fully_connected = {k: v for k, v in nodes.items() if k.startswith("XNNFullyConnected")}
        # Nothing else inside the delegate: no static int8 linear, no float one but the
        # offsets' constants and group sums, one each per 4-bit linear.
        assert fully_connected == {
            DYNAMIC_INT8_X_BLOCKWISE_INT4: DECODER_LINEARS,
            DYNAMIC_INT8_X_CHANNEL_INT8: 1,
            FLOAT_FC: 2 * DECODER_LINEARS,
        }, (method, nodes)
    compiled = load_manifest(_artifact(summary, Stage.COMPILE), expect_stage=Stage.COMPILE)
    # Nothing of the linears' quantization runs outside the delegate: no quantize op, no float
    # linear; the one dequantize left at the edge is the embedding table's ...
    outside = compiled.metrics["non_delegated_op_counts"]
    assert not [op for op in outside if "linear" in op or "mm" in op], outside
    assert [op for op in outside if "quant" in op] == ["torchao.dequantize_affine.default"]
    assert outside["torchao.dequantize_affine.default"] == 2  # one lookup per method
    # ... which the serialized program runs as one int8 lookup kernel per method, rows
    # dequantized as read: no torchao op and no float table is left.
    for method, ops in cpu_operators(pte).items():
        assert ops["quantized_decomposed::embedding_byte.out"] == 1, (method, ops)
        assert not [op for op in ops if "torchao" in op or op.startswith("aten::embedding")], ops
    quantized = load_manifest(_artifact(summary, Stage.QUANTIZE), expect_stage=Stage.QUANTIZE)
    record = quantized.metrics["8da4w"]
    assert record["group_size"] == 32 and record["linears_kept_float"] == {}
    assert record["group_mapping"] == "asymmetric" and record["offset_parameters"] > 0
    assert [path.rpartition(".")[2] for path in record["linears_int8_weights"]] == ["lm_head"]
    assert list(record["embeddings"].values()) == ["8w (symmetric, one scale per 32 channels)"]
    assert record["linears_quantized"] == 2 * LINEARS_PER_METHOD
    assert record["linears_fused"] == {"into": 2 * 2, "from": 2 * 5}  # per layer, in one method
    assert quantized.metrics["quantized_op_kinds"] == {"linear": 2 * LINEARS_PER_METHOD}
    assert quantized.metrics["dynamic_ops"] == 2 * LINEARS_PER_METHOD
    # 4-bit weights: the program is well under the fp32 weights' bytes (fp32 tiny-llama .pte:
    # 524,928 bytes; 8a8w 275,076; 8da4w 221,060 with a float embedding table).
    parameters = load_manifest(
        _artifact(summary, Stage.PREPARE), expect_stage=Stage.PREPARE
    ).metrics["parameters"]
    assert compiled.metrics["pte_bytes"] < 0.7 * 4 * parameters


def test_the_infer_cli_runs_the_program_in_a_process_of_its_own(
    xnnpack: tuple[dict[str, Any], list[str]], tmp_path: Path,
) -> None:
    """As a user runs the stages one by one: a fresh process that compiled nothing must register
    the quantized kernels itself (the embedding lookups are quantized_decomposed ops)."""
    summary, _ = xnnpack
    out = tmp_path / "infer"
    done = subprocess.run(
        [sys.executable, "-m", infer_cli.__name__, str(_artifact(summary, Stage.COMPILE)),
         "--prompt", PROMPT, "--max-new-tokens", "4", "--no-stream", "-o", str(out), "-q"],
        env=python_child_env(), capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    generation = load_manifest(out, expect_stage=Stage.INFER).metrics["generation"]
    assert generation["new_tokens"] == 4


def test_calibration_is_skipped_and_said_so(xnnpack: tuple[dict[str, Any], list[str]]) -> None:
    summary, lines = xnnpack
    skipped = [line for line in lines if "calibration skipped" in line]
    assert len(skipped) == 2, lines  # one per method
    # What the calibration samples were used for instead: choosing the smoothed blocks' factors.
    assert all("per token at run time" in line and "4 calibration sample(s)" in line
               and "chose the smoothed blocks' factors" in line for line in skipped)
    quantized = load_manifest(_artifact(summary, Stage.QUANTIZE), expect_stage=Stage.QUANTIZE)
    assert quantized.metrics["calibration"].startswith("none")
    assert "calibration text(s) chose the smoothed blocks' factors" in quantized.metrics[
        "calibration"]
    assert quantized.metrics["weight_rounding"] == "nearest"


def test_xnnpack_8da4w_numbers_vs_eager_and_fake_quant(
    xnnpack: tuple[dict[str, Any], list[str]],
) -> None:
    summary, _ = xnnpack
    accuracy, generation = summary["accuracy"], summary["generation"]
    # Measured (2 eval windows of 16 tokens): argmax vs eager fp32 0.844, logits 22.7 dB vs
    # fp32 and 41.4 dB vs the fake-quant program (XNNPACK's per-token scales and torchao's
    # differ in rounding only).
    assert generation["argmax_agreement_vs_eager"] >= 0.75
    assert float(accuracy["sqnr_db_vs_fp32"]) >= 18
    assert float(accuracy["sqnr_db_vs_fake_quant"]) >= 30
    assert accuracy["ok"] is True
    assert generation["new_tokens"] == 12 and generation["decode_tokens_per_s"] > 0


def test_portable_8da4w_computes_what_fake_quant_computes(tmp_path: Path) -> None:
    """The reference backend runs torchao's affine ops as plain ATen ops: bit-for-bit close to
    the eager fake-quant program. One method (no KV cache) keeps the compile short."""
    ctx = PipelineContext.create(
        "tiny-llama", backend="portable", recipe="8da4w", out_dir=tmp_path,
        prepare={"seq_len": 16, "calibration_samples": 2, "eval_samples": 2},
        infer={"runs": 2, "warmup": 1},
    )
    summary = run_pipeline(ctx).checked().summary
    accuracy = summary["accuracy"]
    # Measured 59.7 dB with a KV cache (the logits differ from fake quant by float rounding).
    assert float(accuracy["sqnr_db_vs_fake_quant"]) >= 50
    assert float(accuracy["cosine_vs_fp32"]) >= 0.99
    compiled = load_manifest(_artifact(summary, Stage.COMPILE), expect_stage=Stage.COMPILE)
    assert compiled.metrics["delegated_ops"] == 0
    assert not [op for op in compiled.metrics["non_delegated_op_counts"] if "torchao" in op]
    quantized = load_manifest(_artifact(summary, Stage.QUANTIZE), expect_stage=Stage.QUANTIZE)
    assert quantized.metrics["8da4w"]["linears_quantized"] == LINEARS_PER_METHOD
    program = torch.export.load(_artifact(summary, Stage.QUANTIZE) / PROGRAM)
    # Each quantized weight is stored as its 4-bit values held in int8 (torchao's qdata, the
    # parametrization's first tensor), then its group scales and zero points; the head's
    # values are int8.
    values = {name: t for name, t in program.state_dict.items()
              if name.endswith("parametrizations.weight.original0")}
    assert len(values) == LINEARS_PER_METHOD + 1  # and the embedding table's int8 rows
    four_bit = [t for name, t in values.items() if "lm_head" not in name and "embed" not in name]
    assert len(four_bit) == DECODER_LINEARS
    assert all(t.dtype == torch.int8 and int(t.min()) >= -8 and int(t.max()) <= 7
               for t in four_bit)
