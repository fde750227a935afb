"""One PT2E quantizer per backend, looked up by the target's backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from qnn_common.config import DEFAULT_LPBQ_BLOCK
from qnn_common.errors import BackendNotAvailableError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target
from qnn_common.weight_groups import GroupMapping
from qnn_quant.layers import node_recipe


@dataclass(frozen=True)
class QuantizerSpec:
    """What a quantizer is built for: a target and recipe, and the choices within them.

    `float_nodes` names the graph nodes to leave in float, `dynamic_nodes` the linear nodes whose
    activations are quantized at run time (`qnn_quant.layers`); `block_size` and
    `group_mapping` matter to 16a4w_block (LPBQ) only (8da4w does not use a PT2E quantizer), and
    so does `int8_nodes`, the linear nodes given 8-bit weights per channel instead of blocks.
    """

    target: Target
    recipe: Recipe
    per_channel: bool = True
    block_size: int = DEFAULT_LPBQ_BLOCK
    float_nodes: frozenset[str] = frozenset()
    dynamic_nodes: frozenset[str] = frozenset()
    group_mapping: GroupMapping = GroupMapping.SYMMETRIC  # default_group_mapping(16a4w_block)
    int8_nodes: frozenset[str] = frozenset()
    # Per-layer recipes (`qnn_common.layer_recipes`), matched by module path: on QNN a layer may
    # take another recipe with the same activation bits (the other backends mix fp32 only, which
    # `float_nodes` already holds).
    layer_recipes: tuple[LayerRecipe, ...] = ()

    def recipe_of(self, node: torch.fx.Node) -> Recipe:
        """The recipe `node` is quantized at (fp32: left float)."""
        return node_recipe(node, self.recipe, self.float_nodes, self.layer_recipes)


class QuantizerProvider(Protocol):
    """A backend module's entry point: the torchao PT2E quantizer for `spec`, annotating `gm`."""

    def __call__(self, spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any: ...


def _provider(backend: Backend) -> QuantizerProvider:
    # Imported lazily (torchao and executorch quantizers take seconds); returned as a
    # QuantizerProvider, so mypy checks each module's entry point against it.
    # Portable runs the standard quantized_decomposed q/dq representation XNNPACK's quantizer
    # produces; its kernels then compute exactly what fake quant computes.
    if backend in (Backend.XNNPACK, Backend.PORTABLE):
        from qnn_quant.quantizers import xnnpack

        return xnnpack.quantizer
    if backend is Backend.QNN:
        from qnn_quant.quantizers import qnn

        return qnn.quantizer
    raise BackendNotAvailableError(f"no quantizer for backend {backend!r}")


def dynamic_scale_per_row(backend: Backend) -> bool:
    """Whether `backend`'s kernels give a dynamically quantized activation one scale per row
    (XNNPACK's qd8 GEMMs: per token) rather than the one per tensor the program's ops choose
    (portable runs those ops as they are)."""
    return backend is Backend.XNNPACK


def decomposed_before_annotation(backend: Backend) -> tuple[torch._ops.OpOverload, ...]:
    """The ops `backend`'s quantizer needs decomposed before it annotates.

    QNN: `affine_grid_generator` has no QNN annotation, so it stayed float and edge conversion
    decomposed it after quantization; its last transpose then carried the next quantize's
    encoding with a float input, which QNN's op validation refuses (a CPU island between two
    partitions). Decomposed first, its matmul and views are annotated like any others, and the
    base grid it builds from literals is folded at compile (qnn_compile.constant_subgraphs).
    """
    if backend is Backend.QNN:
        return (torch.ops.aten.affine_grid_generator.default,)
    return ()


def quantizer_for(spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any:
    """The quantizer that prepares `gm` for `spec.target` at `spec.recipe`."""
    return _provider(spec.target.backend)(spec, gm)
