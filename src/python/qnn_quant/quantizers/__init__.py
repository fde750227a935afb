"""One PT2E quantizer per backend, looked up by the target's backend."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from qnn_common.errors import BackendNotAvailableError
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target


class QuantizerProvider(Protocol):
    """A backend module's entry point: the torchao PT2E quantizer for one target and recipe."""

    def __call__(
        self,
        recipe: Recipe,
        per_channel: bool,
        block_size: int,
        target: Target,
        gm: torch.fx.GraphModule,
        float_nodes: frozenset[str],
    ) -> Any: ...


def quantizer_for(
    recipe: Recipe,
    per_channel: bool,
    block_size: int,
    target: Target,
    gm: torch.fx.GraphModule,
    float_nodes: frozenset[str],
) -> Any:
    """The quantizer that prepares `gm` for `target` at `recipe`, leaving `float_nodes` float."""
    # Portable runs the standard quantized_decomposed q/dq representation XNNPACK's quantizer
    # produces; its kernels then compute exactly what fake quant computes.
    if target.backend in (Backend.XNNPACK, Backend.PORTABLE):
        from qnn_quant.quantizers import xnnpack as module
    elif target.backend is Backend.QNN:
        from qnn_quant.quantizers import qnn as module  # type: ignore[no-redef]
    else:
        raise BackendNotAvailableError(f"no quantizer for backend {target.backend!r}")
    provider: QuantizerProvider = module.quantizer
    return provider(recipe, per_channel, block_size, target, gm, float_nodes)
