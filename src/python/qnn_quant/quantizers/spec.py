"""What a PT2E quantizer is built for (`QuantizerSpec`): the one type every backend's quantizer
module reads, apart from the lookup of those modules (`qnn_quant.quantizers`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qnn_common.config import DEFAULT_LPBQ_BLOCK
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import Recipe
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
