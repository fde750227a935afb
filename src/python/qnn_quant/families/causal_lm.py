"""A generating decoder's `prefill` and `decode`: quantized with one set of scales (calibrated
through prefill, decode's observers given prefill's statistics: `qnn_quant.methods`); the
fake-quant reference is their teacher-forced logits on the eval texts, judged against the fp32
model's."""

from __future__ import annotations

import logging
import time

import torch

from qnn_common.llm import method_steps, teacher_forced_logits
from qnn_common.manifest import Manifest
from qnn_common.metrics import logits_accuracy
from qnn_common.stages import (
    CALIBRATION,
    EVAL_INPUTS,
    REFERENCE_FP32,
    QuantizeInput,
    llm_spec_of,
    rope_of,
    sink_of,
)
from qnn_common.torchio.samples import load_samples
from qnn_quant.families import Quantized
from qnn_quant.fused_qdq import reference_module
from qnn_quant.method_modules import lm_modules, module_runner
from qnn_quant.methods import quantize_causal_lm
from qnn_quant.quantizers import dynamic_scale_per_row

log = logging.getLogger(__name__)


def quantize(
    inp: QuantizeInput, src: Manifest, programs: dict[str, torch.export.ExportedProgram]
) -> Quantized:
    """Quantize prefill and decode with one set of scales, and their teacher-forced logits."""
    cfg = inp.config
    spec = llm_spec_of(inp.source, src)
    assert spec is not None  # family_for picked this family for its LLM record
    calibration = [s[0] for s in load_samples(inp.source / CALIBRATION)]
    eval_tokens = [s[0] for s in load_samples(inp.source / EVAL_INPUTS)]
    rope, sink = rope_of(inp.source, src), sink_of(inp.source, src)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    quantized, weights = quantize_causal_lm(
        programs, target=cfg.target, recipe=cfg.recipe, spec=spec, calibration=calibration,
        per_channel=cfg.per_channel, block_size=cfg.block_size, keep_float=cfg.keep_float,
        rope=rope, sink=sink, weight_rounding=cfg.rounding, dynamic_layers=cfg.dynamic_layers,
        group_size=cfg.group_size, group_mapping=cfg.group_mapping,
        int8_weights=cfg.int8_weights,
        embedding_weights=cfg.embedding_weights, smooth_blocks=cfg.smooth_blocks,
        layer_recipes=cfg.layer_recipes,
    )
    timings["quantize_s"] = time.perf_counter() - t
    log.info("quantized %s to %s for %s in %.1f s", ", ".join(quantized), cfg.recipe,
             cfg.target, timings["quantize_s"])

    t = time.perf_counter()
    per_row = dynamic_scale_per_row(cfg.backend)
    modules = lm_modules(quantized, lambda p: reference_module(p, dynamic_per_row=per_row))
    fake_quant = teacher_forced_logits(
        *method_steps(spec, module_runner(modules, spec), rope, sink), eval_tokens, spec
    )
    timings["report_s"] = time.perf_counter() - t
    reference = [s[0] for s in load_samples(inp.source / REFERENCE_FP32)]
    return Quantized(
        programs=dict(quantized), fake_quant=[(logits,) for logits in fake_quant],
        weights=weights, accuracy={"vs_fp32": logits_accuracy(reference, fake_quant)},
        timings=timings,
    )
