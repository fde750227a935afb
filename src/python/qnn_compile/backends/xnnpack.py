"""XNNPACK: host CPU kernels for fp32 and 8a8w programs."""

from __future__ import annotations

from qnn_common.config import CompileConfig
from qnn_compile.backends import BackendLowering


def lowering(config: CompileConfig) -> BackendLowering:
    """Partition everything XNNPACK takes; the rest runs on the portable kernels."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.export import LoweringRecipe

    return BackendLowering(
        target=config.target,
        recipe=LoweringRecipe(partitioners=[XnnpackPartitioner()]),
        record=config.target.record(),
    )
