"""The quantize stage as a library call: prepared artifact in, quantized artifact out."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import qnn_quant
from qnn_common.config import QuantizeConfig, Stage
from qnn_common.llm import LlmSpec, method_steps, teacher_forced_logits
from qnn_common.manifest import (
    Manifest,
    begin_artifact,
    cache_key,
    code_version,
    load_manifest,
    manifest_digest,
    seal_stage,
)
from qnn_common.metrics import compare_samples, logits_accuracy
from qnn_common.stages import (
    CALIBRATION,
    EVAL_INPUTS,
    PROGRAM,
    REFERENCE_FAKE_QUANT,
    REFERENCE_FP32,
    QuantizeInput,
    QuantizeOutput,
    carry_forward,
    llm_spec_of,
    method_program,
    program_files,
    rope_of,
)
from qnn_common.tensorio import (
    ModelInputs,
    flatten_outputs,
    load_inputs,
    load_program,
    load_samples,
    save_program,
    save_samples,
)
from qnn_quant.fused_qdq import reference_module
from qnn_quant.gptq import GptqResult
from qnn_quant.intx import IntxResult
from qnn_quant.methods import module_runner, quantize_causal_lm
from qnn_quant.pt2e import quantize_program_with_gptq
from qnn_quant.quantized_ops import dynamic_op_count, quantized_op_count, quantized_op_kinds
from qnn_quant.quantizers import dynamic_scale_per_row
from qnn_quant.report import accuracy_report_and_outputs

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
    llm = llm_spec_of(inp.source, src)
    if llm is not None:
        return _run_quantize_causal_lm(inp, src, llm)
    program = load_program(inp.source / PROGRAM)
    calibration = load_inputs(inp.source / CALIBRATION)
    eval_inputs = load_inputs(inp.source / EVAL_INPUTS)
    out = begin_artifact(inp.out_dir, inputs=[inp.source])
    timings: dict[str, float] = {}

    t = time.perf_counter()
    quantized, gptq = quantize_program_with_gptq(
        program,
        target=cfg.target,
        recipe=cfg.recipe,
        calibration=calibration,
        per_channel=cfg.per_channel,
        block_size=cfg.block_size,
        keep_float=cfg.keep_float,
        weight_rounding=cfg.rounding,
        dynamic_layers=cfg.dynamic_layers,
        group_size=cfg.group_size,
        group_mapping=cfg.group_mapping,
        int8_weights=cfg.int8_weights,
        embedding_weights=cfg.embedding_weights,
    )
    timings["quantize_s"] = time.perf_counter() - t
    log.info("quantized to %s for %s in %.1f s", cfg.recipe, cfg.target, timings["quantize_s"])

    t = time.perf_counter()
    # The fp32 outputs on the eval inputs were computed (and sealed) by prepare: not again here.
    reference = load_samples(inp.source / REFERENCE_FP32)
    # The fake-quant reference computes what the target's kernels compute (qnn_quant.fused_qdq).
    per_row = dynamic_scale_per_row(cfg.backend)
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

    save_program(out / PROGRAM, quantized)
    save_samples(out / REFERENCE_FAKE_QUANT, fake_quant)
    carried = carry_forward(inp.source, src, out)

    inputs = {"prepare": manifest_digest(inp.source)}
    manifest = _seal(
        out, cfg, inputs, [PROGRAM, REFERENCE_FAKE_QUANT, *carried], timings,
        metrics={
            "model": src.metrics.get("model"),
            "quantized_ops": quantized_op_count(quantized.graph_module),
            "quantized_op_kinds": quantized_op_kinds(quantized.graph_module),
            "dynamic_ops": dynamic_op_count(quantized.graph_module),
            **_rounding_metrics(cfg, gptq),
            "accuracy": report,
        },
    )
    return QuantizeOutput(inp.out_dir, manifest)


def _call(module: torch.nn.Module, sample: ModelInputs) -> tuple[torch.Tensor, ...]:
    """`module` on a copy of `sample`, its outputs flattened."""
    inputs = sample.clone()
    return flatten_outputs(module(*inputs.args, **inputs.kwargs))


def _run_quantize_causal_lm(inp: QuantizeInput, src: Manifest, spec: LlmSpec) -> QuantizeOutput:
    """Prefill and decode quantized with one set of scales; the fake-quant reference is their
    teacher-forced logits on the eval texts."""
    cfg: QuantizeConfig = inp.config
    programs = {m: load_program(inp.source / f) for m, f in program_files(src).items()}
    calibration = [s[0] for s in load_samples(inp.source / CALIBRATION)]
    eval_tokens = [s[0] for s in load_samples(inp.source / EVAL_INPUTS)]
    rope = rope_of(inp.source, src)
    out = begin_artifact(inp.out_dir, inputs=[inp.source])
    timings: dict[str, float] = {}

    t = time.perf_counter()
    quantized, gptq = quantize_causal_lm(
        programs, target=cfg.target, recipe=cfg.recipe, spec=spec, calibration=calibration,
        per_channel=cfg.per_channel, block_size=cfg.block_size, keep_float=cfg.keep_float,
        rope=rope, weight_rounding=cfg.rounding, dynamic_layers=cfg.dynamic_layers,
        group_size=cfg.group_size, group_mapping=cfg.group_mapping,
        int8_weights=cfg.int8_weights,
        embedding_weights=cfg.embedding_weights,
    )
    timings["quantize_s"] = time.perf_counter() - t
    log.info("quantized %s to %s for %s in %.1f s", ", ".join(quantized), cfg.recipe,
             cfg.target, timings["quantize_s"])

    t = time.perf_counter()
    per_row = dynamic_scale_per_row(cfg.backend)
    modules = {
        m: reference_module(program, dynamic_per_row=per_row) for m, program in quantized.items()
    }
    fake_quant = teacher_forced_logits(
        *method_steps(spec, module_runner(modules, spec), rope), eval_tokens, spec
    )
    timings["report_s"] = time.perf_counter() - t
    files = []
    for method, program in quantized.items():
        save_program(out / method_program(method), program)
        files.append(method_program(method))
    save_samples(out / REFERENCE_FAKE_QUANT, [(logits,) for logits in fake_quant])
    carried = carry_forward(inp.source, src, out)
    reference = [s[0] for s in load_samples(inp.source / REFERENCE_FP32)]
    inputs = {"prepare": manifest_digest(inp.source)}
    manifest = _seal(
        out, cfg, inputs, [*files, REFERENCE_FAKE_QUANT, *carried], timings,
        metrics={
            "model": src.metrics.get("model"),
            "kind": "causal-lm",
            "methods": list(quantized),
            "llm": spec.to_json(),
            "quantized_ops": sum(quantized_op_count(p.graph_module) for p in quantized.values()),
            "quantized_op_kinds": _merged_kinds(quantized.values()),
            "dynamic_ops": sum(dynamic_op_count(p.graph_module) for p in quantized.values()),
            **_rounding_metrics(cfg, gptq),
            "accuracy": {"vs_fp32": logits_accuracy(reference, fake_quant)},
        },
    )
    return QuantizeOutput(inp.out_dir, manifest)


def _rounding_metrics(
    cfg: QuantizeConfig, weights: GptqResult | IntxResult | None
) -> dict[str, Any]:
    """The weight rounding in effect and, for GPTQ, what it did; for 8da4w, its weight
    transform (groups, linears quantized and kept float) and that nothing was calibrated."""
    out: dict[str, Any] = {"weight_rounding": cfg.rounding.value}
    if isinstance(weights, IntxResult):
        out["calibration"] = "none: activation scales are chosen per token at run time"
        out[cfg.recipe.value] = weights.to_json()
    elif weights is not None:
        out["gptq"] = weights.to_json()
    return out


def _merged_kinds(programs: Any) -> dict[str, int]:
    """`quantized_op_kinds` summed over several methods' programs."""
    total: dict[str, int] = {}
    for program in programs:
        for kind, n in quantized_op_kinds(program.graph_module).items():
            total[kind] = total.get(kind, 0) + n
    return dict(sorted(total.items()))


def _seal(
    out: Path,
    cfg: Any,
    inputs: Mapping[str, str],
    files: Sequence[str],
    timings: Mapping[str, float],
    *,
    metrics: Mapping[str, Any],
    extra_tools: Mapping[str, str] | None = None,
) -> Manifest:
    return seal_stage(
        out, stage=Stage.QUANTIZE, package=PACKAGE, module=qnn_quant, config=cfg, inputs=inputs,
        files=files, timings=timings, metrics=metrics, extra_tools=extra_tools,
    )
