"""The quantize stage as a library call: prepared artifact in, quantized artifact out."""

from __future__ import annotations

from typing import Any

import qnn_quant
from qnn_common.artifact import Artifact
from qnn_common.cache_keys import cache_key, code_version
from qnn_common.config import QuantizeConfig, Stage
from qnn_common.reports import QuantizeReport
from qnn_common.sealing import seal_stage
from qnn_common.stages import (
    REFERENCE_FAKE_QUANT,
    QuantizeInput,
    carry_forward,
    program_files,
)
from qnn_common.store.artifact_dir import begin_artifact
from qnn_common.torchio.programs import handed_on, load_methods, save_program
from qnn_common.torchio.samples import save_samples
from qnn_quant.families import family_for
from qnn_quant.gptq import GptqResult
from qnn_quant.intx import IntxResult
from qnn_quant.layers import layer_recipe_record
from qnn_quant.quantized_ops import dynamic_op_count, quantized_op_count, quantized_op_kinds

PACKAGE = "qnn-quant"


def quantize_cache_key(config: QuantizeConfig, source: Artifact) -> str:
    """The cache key of the artifact quantizing `source` at `config`: from its manifest alone."""
    digest = source.sealed_as(Stage.PREPARE).identity_digest()
    return cache_key(Stage.QUANTIZE, config, {"prepare": digest}, code_version(qnn_quant))


def run_quantize(inp: QuantizeInput) -> Artifact:
    """PT2E-quantize a prepared program's methods, and report what that cost in accuracy.

    Load the methods, pick the family (`qnn_quant.families`: how its methods are calibrated,
    quantized and judged), then for every family alike: write the methods and the fake-quant
    reference, carry the inputs forward, seal."""
    cfg: QuantizeConfig = inp.config
    src = inp.source.sealed_as(Stage.PREPARE)
    family = family_for(inp.source.path, src)
    files = program_files(inp.source.path, src)
    programs = load_methods({m: inp.source.path / f for m, f in files.items()}, inp.source.programs)
    out = begin_artifact(inp.out_dir, inputs=[inp.source.path])
    # Read off the float graphs, before the family consumes them.
    layer_recipes = layer_recipe_record([p.graph for p in programs.values()], cfg.layer_recipes)

    quantized = family.quantize(inp, src, programs)
    del programs  # the family's input, which it may have changed: not this stage's output
    saved = {m: save_program(out / files[m], p) for m, p in quantized.programs.items()}
    save_samples(out / REFERENCE_FAKE_QUANT, quantized.fake_quant)
    carried = carry_forward(inp.source.path, src, out)
    methods = list(quantized.programs.values())
    manifest = seal_stage(
        out, stage=Stage.QUANTIZE, package=PACKAGE, module=qnn_quant, config=cfg,
        inputs={"prepare": src.identity_digest()},
        files=[*files.values(), REFERENCE_FAKE_QUANT, *carried], timings=quantized.timings,
        program=src.program,
        metrics=QuantizeReport(
            model=src.metrics.get("model"),
            quantized_ops=sum(quantized_op_count(p.graph_module) for p in methods),
            quantized_op_kinds=_merged_kinds(methods),
            dynamic_ops=sum(dynamic_op_count(p.graph_module) for p in methods),
            weight_rounding=cfg.rounding.value,
            calibration=_calibration(quantized.weights),
            weight_records=_weight_records(cfg, quantized.weights),
            layer_recipes=layer_recipes or None,
            accuracy=quantized.accuracy,
        ).to_metrics(),
    )
    return Artifact(inp.out_dir, manifest, handed_on(saved))


def _calibration(weights: GptqResult | IntxResult | None) -> str | None:
    """A dynamic recipe's word on calibration: none chose an activation scale."""
    if not isinstance(weights, IntxResult):
        return None
    return "none: activation scales are chosen per token at run time" + (
        f"; {weights.smoothing_texts} calibration text(s) chose the smoothed blocks' factors"
        if weights.smoothing_texts else ""
    )


def _weight_records(
    cfg: QuantizeConfig, weights: GptqResult | IntxResult | None
) -> dict[str, dict[str, Any]]:
    """GPTQ's record, or a dynamic recipe's weight transform (groups, linears quantized and kept
    float), under its name (`reports.WEIGHT_RECORDS`)."""
    if isinstance(weights, IntxResult):
        return {cfg.recipe.value: weights.to_json()}
    return {} if weights is None else {"gptq": weights.to_json()}


def _merged_kinds(programs: Any) -> dict[str, int]:
    """`quantized_op_kinds` summed over the methods' programs."""
    total: dict[str, int] = {}
    for program in programs:
        for kind, n in quantized_op_kinds(program.graph_module).items():
            total[kind] = total.get(kind, 0) + n
    return dict(sorted(total.items()))
