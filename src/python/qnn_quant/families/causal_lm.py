"""A generating decoder's `prefill` and `decode`: quantized with one set of scales (calibrated
through prefill, decode's observers given prefill's statistics: `qnn_quant.shared_scales`); the
fake-quant reference is their teacher-forced logits on the eval texts, judged against the fp32
model's. A causal LM prepared without a KV cache records no LLM shapes: its one logits method is
quantized as any one-method program (`single`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from qnn_common.causal_lm.steps import method_steps, teacher_forced_logits
from qnn_common.causal_lm.tables import rope_of, sink_of
from qnn_common.errors import ArtifactError
from qnn_common.llm_spec import DECODE, PREFILL
from qnn_common.manifest import Manifest
from qnn_common.numerics.metrics import logits_accuracy
from qnn_common.stages import CALIBRATION, EVAL_INPUTS, REFERENCE_FP32, QuantizeInput, llm_spec_of
from qnn_common.torchio.samples import load_samples
from qnn_quant.calibration import causal_lm_calibration
from qnn_quant.engine import quantize_methods
from qnn_quant.families import single
from qnn_quant.families.family import Quantized
from qnn_quant.fused_qdq import reference_module
from qnn_quant.method_modules import lm_modules, module_runner
from qnn_quant.quantizers import dynamic_scale_per_row

log = logging.getLogger(__name__)


def check(source: Path, src: Manifest) -> None:
    """A generating export (its LLM record) is checked when its methods load; a logits-only one
    must be one method."""
    if llm_spec_of(source, src) is None:
        single.check(source, src)


def quantize(
    inp: QuantizeInput, src: Manifest, programs: dict[str, torch.export.ExportedProgram]
) -> Quantized:
    """Quantize prefill and decode with one set of scales, and their teacher-forced logits."""
    cfg = inp.config
    spec = llm_spec_of(inp.source.path, src)
    if spec is None:  # exported without a KV cache: one logits method
        return single.quantize(inp, src, programs)
    calibration = [s[0] for s in load_samples(inp.source.path / CALIBRATION)]
    eval_tokens = [s[0] for s in load_samples(inp.source.path / EVAL_INPUTS)]
    rope, sink = rope_of(inp.source.path, src), sink_of(inp.source.path, src)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    missing = {PREFILL, DECODE} - set(programs)
    if missing:
        raise ArtifactError(inp.source.path, f"a causal LM needs methods {PREFILL} and {DECODE}; "
                            f"it lacks {', '.join(sorted(missing))}")
    quantized, weights = quantize_methods(
        programs, cfg, causal_lm_calibration(spec, calibration, rope=rope, sink=sink))
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
    reference = [s[0] for s in load_samples(inp.source.path / REFERENCE_FP32)]
    return Quantized(
        programs=dict(quantized), fake_quant=[(logits,) for logits in fake_quant],
        weights=weights, accuracy={"vs_fp32": logits_accuracy(reference, fake_quant)},
        timings=timings,
    )
