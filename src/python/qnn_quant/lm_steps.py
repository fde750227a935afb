"""A prepare or quantize artifact's causal LM as prefill and decode steps (`StepLm`), for the
evaluation to score beside the program: the float model as exported, and the fake-quantized
model the quantize stage judges itself by (its q/dq pairs fused, as `families.causal_lm` runs
it for its report)."""

from __future__ import annotations

from pathlib import Path

import torch

from qnn_common.causal_lm.steps import StepLm, method_steps
from qnn_common.causal_lm.tables import rope_of, sink_of
from qnn_common.errors import ArtifactError
from qnn_common.sealing import load_manifest
from qnn_common.stages import llm_spec_of, program_files, quantized_for
from qnn_common.torchio.programs import load_methods
from qnn_quant.block_taps import BlockTap
from qnn_quant.fused_qdq import float_activations, fold_weight_dequantize, reference_module
from qnn_quant.method_modules import lm_modules, module_runner
from qnn_quant.quantizers import dynamic_scale_per_row


def artifact_lm(artifact: Path, name: str, *, weights_only: bool = False,
                tap: BlockTap | None = None) -> StepLm:
    """The causal LM in a prepare artifact (its float methods) or a quantize artifact (its
    fake-quantized ones) as steps named `name`; `weights_only`: a quantize artifact's with its
    activations left in float (`fused_qdq.float_activations`), what the weights alone cost;
    `tap`: attached to every method, to record each decoder block's output."""
    return artifact_lm_modules(artifact, name, weights_only=weights_only, tap=tap)[0]


def artifact_lm_modules(
    artifact: Path, name: str, *, weights_only: bool = False, tap: BlockTap | None = None,
) -> tuple[StepLm, dict[str, torch.nn.Module]]:
    """`artifact_lm`, and the method modules its steps run (method name -> module), for a
    caller that changes their weights between runs (the recipe search's sensitivity pass).
    A quantize artifact's modules read each weight as one float constant (its dequantize
    folded)."""
    manifest = load_manifest(artifact)
    spec = llm_spec_of(artifact, manifest)
    if spec is None:
        raise ArtifactError(artifact, "holds no causal LM (prefill and decode) to evaluate")
    files = program_files(artifact, manifest)
    programs = load_methods({m: artifact / f for m, f in files.items()})
    modules: dict[str, torch.nn.Module]
    if manifest.stage == "quantize":
        target, _ = quantized_for(artifact, manifest)
        per_row = dynamic_scale_per_row(target.backend)
        modules = lm_modules(programs, lambda p: reference_module(p, dynamic_per_row=per_row))
        for module in modules.values():
            assert isinstance(module, torch.fx.GraphModule)
            fold_weight_dequantize(module)
            if weights_only:
                float_activations(module)
    else:
        modules = lm_modules(programs, torch.export.ExportedProgram.module)
    if tap is not None:
        for module in modules.values():
            assert isinstance(module, torch.fx.GraphModule)
            tap.attach(module)
    prefill, decode = method_steps(spec, module_runner(modules, spec),
                                   rope_of(artifact, manifest), sink_of(artifact, manifest))
    return StepLm(name, prefill, decode, spec), modules
