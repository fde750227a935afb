"""Portable: ExecuTorch's reference kernels, no delegate (the yardstick for the others)."""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from qnn_common.config import CompileConfig
from qnn_compile.backends.backend import CompileBackend
from qnn_compile.backends.lowering import BackendLowering

# The affine quantize ops of torchao's quantized tensors (8da4w: qnn_quant.intx). The runtime
# has no kernels for them (its quantized library is quantized_decomposed's), and torchao
# registers each with its own decomposition into plain ATen ops (amin / amax, div, round,
# clamp, casts), which the portable kernels run: the program then computes exactly what the
# eager fake-quant reference computes, the 4-bit weights still held as int8 constants.
_TORCHAO_AFFINE_OPS = ("choose_qparams_affine", "quantize_affine", "dequantize_affine")


def _uses_torchao_affine_ops(program: ExportedProgram) -> bool:
    return any(
        node.op == "call_function" and str(node.target).split(".")[:2]
        in (["torchao", name] for name in _TORCHAO_AFFINE_OPS)
        for node in program.graph.nodes
    )


def decompose_torchao_affine_ops(program: ExportedProgram) -> ExportedProgram:
    """`program` with torchao's affine quantize ops decomposed into ATen ops (module comment);
    other ops are left as they are (a table of just these ops)."""
    if not _uses_torchao_affine_ops(program):
        return program
    from torch._inductor.decomposition import decompositions

    ops = [getattr(torch.ops.torchao, name).default for name in _TORCHAO_AFFINE_OPS]
    decomposed: ExportedProgram = program.run_decompositions(
        {op: decompositions[op] for op in ops}
    )
    return decomposed


def lowering(config: CompileConfig) -> BackendLowering:
    """No partitioner: every op runs on the portable (and quantized_decomposed) kernels."""
    from executorch.export import LoweringRecipe

    return BackendLowering(
        target=config.target,
        recipe=LoweringRecipe(partitioners=[]),
        aten_passes=(decompose_torchao_affine_ops,),
        record=config.target.record(),
    )


BACKEND = CompileBackend(lowering=lowering)
