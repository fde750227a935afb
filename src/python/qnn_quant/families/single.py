"""One method: the quantization engine (`qnn_quant.engine`) on the prepared samples; the
accuracy report compares the quantized program with the fp32 one output by output and, where
the inputs are positional, layer by layer."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.numerics.metrics import compare_samples
from qnn_common.stages import (
    CALIBRATION,
    EVAL_INPUTS,
    REFERENCE_FP32,
    QuantizeInput,
    program_files,
)
from qnn_common.torchio.samples import ModelInputs, flatten_outputs, load_inputs, load_samples
from qnn_quant.calibration import program_calibration
from qnn_quant.engine import quantize_methods
from qnn_quant.families.family import Quantized
from qnn_quant.fused_qdq import reference_module
from qnn_quant.quantizers import dynamic_scale_per_row
from qnn_quant.report import accuracy_report_and_outputs

log = logging.getLogger(__name__)


def check(source: Path, src: Manifest) -> None:
    """One method, or the refusal naming the ones the artifact holds."""
    methods = list(program_files(source, src))
    if len(methods) != 1:
        raise ArtifactError(
            source, f"holds the methods {', '.join(methods)} and no causal-LM record; quantize "
            "takes one method, or a causal LM's prefill and decode",
        )


def quantize(
    inp: QuantizeInput, src: Manifest, programs: dict[str, torch.export.ExportedProgram]
) -> Quantized:
    """Quantize the one method of `programs`, and report what it cost in accuracy."""
    cfg = inp.config
    ((method, program),) = programs.items()
    calibration = load_inputs(inp.source.path / CALIBRATION)
    eval_inputs = load_inputs(inp.source.path / EVAL_INPUTS)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    quantized_methods, weights = quantize_methods(
        {method: program}, cfg, program_calibration(program, calibration))
    quantized = quantized_methods[method]
    timings["quantize_s"] = time.perf_counter() - t
    log.info("quantized to %s for %s in %.1f s", cfg.recipe, cfg.target, timings["quantize_s"])

    t = time.perf_counter()
    # The fp32 outputs on the eval inputs were computed (and sealed) by prepare: not again here.
    reference = load_samples(inp.source.path / REFERENCE_FP32)
    # The fake-quant reference computes what the target's kernels compute (qnn_quant.fused_qdq).
    per_row = dynamic_scale_per_row(cfg.backend)
    report: dict[str, Any]
    if any(s.kwargs for s in eval_inputs):
        # accuracy_report calls the programs positionally; keyword-only inputs get the output
        # comparison alone (the per-layer view needs positional inputs).
        module = reference_module(quantized, dynamic_per_row=per_row)
        with torch.no_grad():
            # Copies: a model that updates an input in place must not change the eval inputs.
            fake_quant = [_call(module, s) for s in eval_inputs]
        report = {
            "num_samples": len(eval_inputs),
            "vs_fp32": compare_samples(reference, fake_quant),
            "worst_layers": [],
            "layers_compared": 0,
        }
    else:
        # One pass of each program per sample: the per-layer capture and the fake-quant
        # reference ride on the same forward (the fp32 one only when layers are compared).
        args = [tuple(s.args) for s in eval_inputs]
        report, fake_quant = accuracy_report_and_outputs(
            program, quantized, args, top_k=cfg.report_layers, fp32_outputs=reference,
            dynamic_per_row=per_row,
        )
    timings["report_s"] = time.perf_counter() - t
    return Quantized(
        programs={method: quantized}, fake_quant=[tuple(s) for s in fake_quant],
        weights=weights, accuracy=dict(report), timings=timings,
    )


def _call(module: torch.nn.Module, sample: ModelInputs) -> tuple[torch.Tensor, ...]:
    """`module` on a copy of `sample`, its outputs flattened."""
    inputs = sample.clone()
    return flatten_outputs(module(*inputs.args, **inputs.kwargs))
