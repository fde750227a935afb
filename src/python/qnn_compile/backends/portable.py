"""Portable: ExecuTorch's reference kernels, no delegate (the yardstick for the others)."""

from __future__ import annotations

from qnn_common.config import CompileConfig
from qnn_compile.backends import BackendLowering


def lowering(config: CompileConfig) -> BackendLowering:
    """No partitioner: every op runs on the portable (and quantized_decomposed) kernels."""
    from executorch.export import LoweringRecipe

    return BackendLowering(
        target=config.target,
        recipe=LoweringRecipe(partitioners=[]),
        record=config.target.record(),
    )
