"""The quantize stage as a library call: prepared artifact in, quantized artifact out."""

from __future__ import annotations

import copy
import logging
import time

import torch

import qnn_quant
from qnn_common.config import QuantizeConfig, Stage
from qnn_common.manifest import (
    atomic_copy,
    begin_artifact,
    cache_key,
    code_version,
    load_manifest,
    manifest_digest,
    write_manifest,
)
from qnn_common.stages import (
    CALIBRATION,
    EVAL_INPUTS,
    PROGRAM,
    REFERENCE_FAKE_QUANT,
    REFERENCE_FP32,
    QuantizeInput,
    QuantizeOutput,
)
from qnn_common.tensorio import (
    flatten_outputs,
    load_program,
    load_samples,
    save_program,
    save_samples,
)
from qnn_quant.pt2e import quantize_program, quantized_op_count
from qnn_quant.report import accuracy_report

PACKAGE = "qnn-quant"
log = logging.getLogger(__name__)


def quantize_cache_key(inp: QuantizeInput) -> str:
    """The cache key of `inp`'s artifact; needs only the source's manifest."""
    return cache_key(Stage.QUANTIZE, inp.config, {"prepare": manifest_digest(inp.source)},
                     code_version(qnn_quant))


def run_quantize(inp: QuantizeInput) -> QuantizeOutput:
    """PT2E-quantize a prepared program, and report what the quantization cost in accuracy."""
    cfg: QuantizeConfig = inp.config
    src = load_manifest(inp.source, expect_stage=Stage.PREPARE)
    program = load_program(inp.source / PROGRAM)
    calibration = load_samples(inp.source / CALIBRATION)
    eval_inputs = load_samples(inp.source / EVAL_INPUTS)
    out = begin_artifact(inp.out_dir)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    quantized = quantize_program(
        program,
        target=cfg.target,
        recipe=cfg.recipe,
        calibration=calibration,
        per_channel=cfg.per_channel,
        block_size=cfg.block_size,
        keep_float=cfg.keep_float,
    )
    timings["quantize_s"] = time.perf_counter() - t
    log.info("quantized to %s for %s in %.1f s", cfg.recipe, cfg.target, timings["quantize_s"])

    t = time.perf_counter()
    report = accuracy_report(program, quantized, eval_inputs, top_k=cfg.report_layers)
    timings["report_s"] = time.perf_counter() - t
    module = quantized.module()
    with torch.no_grad():
        # Copies: a model that updates an input in place must not change the eval inputs.
        fake_quant = [flatten_outputs(module(*copy.deepcopy(s))) for s in eval_inputs]

    save_program(out / PROGRAM, quantized)
    save_samples(out / REFERENCE_FAKE_QUANT, fake_quant)
    carried = [EVAL_INPUTS, REFERENCE_FP32] + [
        f.path for f in src.files if f.path.startswith("tokenizer/")
    ]
    for name in carried:
        atomic_copy(inp.source / name, out / name)

    inputs = {"prepare": manifest_digest(inp.source)}
    manifest = write_manifest(
        out,
        stage=Stage.QUANTIZE,
        package=PACKAGE,
        package_version=qnn_quant.__version__,
        config=cfg,
        inputs=inputs,
        files=[PROGRAM, REFERENCE_FAKE_QUANT, *carried],
        cache_key=cache_key(Stage.QUANTIZE, cfg, inputs, code_version(qnn_quant)),
        timings={k: round(v, 3) for k, v in timings.items()},
        metrics={
            "model": src.metrics.get("model"),
            "quantized_ops": quantized_op_count(quantized.graph_module),
            "accuracy": report,
        },
    )
    return QuantizeOutput(out, manifest)
