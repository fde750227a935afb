"""The quantize stage's config: the quantizer (backend, SoC), the recipe and its options."""

from __future__ import annotations

from dataclasses import dataclass

from qnn_common.config.checks import (
    normalize_enums,
    positive,
    regex_list,
    soc_or_none,
)
from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe, check_layer_recipes
from qnn_common.recipes import (
    Backend,
    Recipe,
    WeightGroups,
    WeightRounding,
    check_dynamic_layers,
    check_recipe,
    check_weight_rounding,
    default_weight_rounding,
    parse_enum,
)
from qnn_common.soc import Soc
from qnn_common.target import Target
from qnn_common.weight_groups import (
    DEFAULT_EMBEDDING_WEIGHTS,
    DEFAULT_GROUP_SIZE,
    EmbeddingWeights,
    GroupMapping,
    check_group_size,
)

# LPBQ block along a linear weight's input dimension (upstream's Llama export uses the same).
DEFAULT_LPBQ_BLOCK = 16


@dataclass(frozen=True)
class QuantizeConfig:
    """Post-training quantization: which quantizer (backend, SoC) and which recipe."""

    backend: Backend = Backend.XNNPACK
    recipe: Recipe = Recipe.A8W8
    soc: str | None = None
    # Weights with one scale per output channel (False: one per tensor).
    per_channel: bool = True
    # 16a4w_block (LPBQ) only: weights share a scale in blocks of this many input channels.
    block_size: int = DEFAULT_LPBQ_BLOCK
    # 8da4w only: input channels per 4-bit weight scale (weight_groups.DEFAULT_GROUP_SIZE).
    group_size: int = DEFAULT_GROUP_SIZE
    # 8da4w and 16a4w_block: how a 4-bit group's (or LPBQ block's) levels map to values
    # (qnn_common.weight_groups.GroupMapping). None: the recipe's default (default_group_mapping:
    # asymmetric for 8da4w, symmetric for 16a4w_block).
    group_mapping: GroupMapping | None = None
    # 8da4w and 16a4w_block: regexes over module paths of linear layers given 8-bit weights (one
    # scale per output channel) instead of 4-bit groups or blocks. None: the default (a causal
    # LM's output head, weight_groups.DEFAULT_INT8_WEIGHTS).
    int8_weights: tuple[str, ...] | None = None
    # 8da4w only: how embedding tables are stored (qnn_common.weight_groups.EmbeddingWeights).
    embedding_weights: EmbeddingWeights = DEFAULT_EMBEDDING_WEIGHTS
    # 8da4w, causal LMs: divide the block of channels holding a linear input's largest
    # activations by a power of two where the input is made (a norm's weight, a gated MLP's up
    # rows; chosen on a few calibration texts) and multiply it back into the weights reading it:
    # the same float model, a finer per-token int8 rounding of the rest
    # (qnn_quant.smoothed_blocks). False: upstream's plain 8da4w.
    smooth_blocks: bool = True
    # The worst layers (by SQNR vs fp32) to report; 0 skips the per-layer pass.
    report_layers: int = 10
    # Regexes over nn.Module paths of layers to leave in float. None: the default
    # (qnn_quant.layers: BERT-style outlier layers at 8-bit activations on xnnpack / portable,
    # none on qnn); () quantizes everything. A float linear on qnn is refused.
    keep_float: tuple[str, ...] | None = None
    # Regexes over nn.Module paths of linear layers whose activations are quantized at run time
    # (XNNPACK, portable). None: the default (encoder blocks' linears at 8-bit activations).
    dynamic_layers: tuple[str, ...] | None = None
    # None: the default (GPTQ for calibrated 4-bit weights, per channel or in LPBQ blocks;
    # nearest otherwise).
    weight_rounding: WeightRounding | None = None
    # Per-layer recipes (qnn_common.layer_recipes): module-path regexes, each giving the layers it
    # matches first another recipe than `recipe` (the same activation bits) or fp32 (float).
    # Wins over int8_weights and keep_float for the layers it names.
    layer_recipes: tuple[LayerRecipe, ...] = ()

    def __post_init__(self) -> None:
        normalize_enums(self, "quantize")
        if self.weight_rounding is not None and not isinstance(
            self.weight_rounding, WeightRounding
        ):
            object.__setattr__(self, "weight_rounding", parse_enum(
                WeightRounding, str(self.weight_rounding), "quantize.weight_rounding"))
        if not isinstance(self.embedding_weights, EmbeddingWeights):
            object.__setattr__(self, "embedding_weights", parse_enum(
                EmbeddingWeights, str(self.embedding_weights), "quantize.embedding_weights"))
        if self.group_mapping is not None and not isinstance(self.group_mapping, GroupMapping):
            object.__setattr__(self, "group_mapping", parse_enum(
                GroupMapping, str(self.group_mapping), "quantize.group_mapping"))
        for name in ("keep_float", "dynamic_layers", "int8_weights"):
            object.__setattr__(self, name, regex_list(f"quantize.{name}", getattr(self, name)))
        if self.dynamic_layers is not None:
            check_dynamic_layers(self.backend, self.dynamic_layers, "quantize.dynamic_layers")
            if self.recipe.is_dynamic and self.dynamic_layers:
                raise ConfigValidationError(
                    "quantize.dynamic_layers", list(self.dynamic_layers),
                    f"{self.recipe.value} quantizes every linear layer's activations at run "
                    "time already; leave dynamic_layers unset (keep_float still leaves layers "
                    "float)",
                )
        if not self.recipe.is_quantized:
            raise ConfigValidationError(
                "quantize.recipe",
                self.recipe.value,
                "a float recipe needs no quantization; skip the quantize stage instead",
                allowed=tuple(r.value for r in Recipe if r.is_quantized),
            )
        check_recipe(self.backend, self.recipe, soc_or_none(self.soc, "quantize.soc"),
                     "quantize.recipe")
        positive("quantize.report_layers", self.report_layers, minimum=0)
        positive("quantize.block_size", self.block_size, minimum=2)
        object.__setattr__(self, "layer_recipes", _layer_recipes(self.layer_recipes))
        check_layer_recipes(self.backend, self.recipe, self.soc_info, self.layer_recipes)
        blocked = any(r.traits.weight_groups is WeightGroups.LPBQ for r in self.recipes)
        if self.block_size != DEFAULT_LPBQ_BLOCK and not blocked:
            raise ConfigValidationError(
                "quantize.block_size", self.block_size,
                "only the 16a4w_block (LPBQ) recipe quantizes weights in blocks (as the "
                "model's recipe or a layer's)",
            )
        check_group_size(self.backend, self.recipe, self.group_size, "quantize.group_size")
        grouped = any(r.has_weight_groups for r in self.recipes)
        if self.group_mapping is not None and not grouped:
            raise ConfigValidationError(
                "quantize.group_mapping", self.group_mapping.value,
                f"only 8da4w's groups and 16a4w_block's blocks map 4-bit levels one way or "
                f"the other; {self.recipe.value} does not: drop group_mapping or use --recipe "
                "8da4w (CPU) or 16a4w_block (QNN)",
            )
        if self.int8_weights is not None and not self.recipe.has_weight_groups:
            raise ConfigValidationError(
                "quantize.int8_weights", self.int8_weights,
                f"only 8da4w's groups and 16a4w_block's blocks have 8-bit layers among their "
                f"4-bit weights; {self.recipe.value} does not: drop int8_weights or use "
                "--recipe 8da4w (CPU) or 16a4w_block (QNN)",
            )
        if not self.recipe.is_dynamic and not self.smooth_blocks:
            raise ConfigValidationError(
                "quantize.smooth_blocks", False,
                f"only 8da4w smooths blocks of its per-token int8 activations; "
                f"{self.recipe.value}'s activation scales are calibrated: drop smooth_blocks "
                "or use --recipe 8da4w",
            )
        if not self.recipe.is_dynamic and self.embedding_weights != DEFAULT_EMBEDDING_WEIGHTS:
            raise ConfigValidationError(
                "quantize.embedding_weights", self.embedding_weights,
                f"only 8da4w has quantized embedding tables; {self.recipe.value} does not: drop "
                "embedding_weights or use --recipe 8da4w",
            )
        if self.recipe.is_dynamic and not self.per_channel:
            raise ConfigValidationError(
                "quantize.per_channel", False,
                f"{self.recipe.value} gives its weights one scale per group of group_size input "
                "channels of each output channel; drop --per-tensor (a larger group_size "
                "means fewer scales)",
            )
        check_weight_rounding(self.recipe, self.rounding, self.per_channel,
                              "quantize.weight_rounding")
        _ = self.target  # validates backend / soc together

    @property
    def recipes(self) -> tuple[Recipe, ...]:
        """The model's recipe, then each other one its per-layer table gives."""
        return tuple(dict.fromkeys((self.recipe, *(e.recipe for e in self.layer_recipes))))

    @property
    def rounding(self) -> WeightRounding:
        """The weight rounding in effect: the one asked for, else the recipe's default."""
        if self.weight_rounding is None:
            return default_weight_rounding(self.recipe, self.per_channel)
        return self.weight_rounding

    @property
    def soc_info(self) -> Soc | None:
        return soc_or_none(self.soc, "quantize.soc")

    @property
    def target(self) -> Target:
        """The target the quantizer prepares the program for."""
        return Target(self.backend, self.soc_info)


def _layer_recipes(value: object) -> tuple[LayerRecipe, ...]:
    """`value` as the table, a tuple of LayerRecipe (a TOML file's `{pattern, recipe}` tables
    become LayerRecipe in the pipeline's config reader, `qnn_pipeline.context`)."""
    if not isinstance(value, list | tuple) or not all(isinstance(e, LayerRecipe) for e in value):
        raise ConfigValidationError(
            "quantize.layer_recipes", value,
            "must be a list of LayerRecipe(pattern, recipe) entries, e.g. "
            "(LayerRecipe(r'layers\\.0\\.', Recipe.A16W8),)",
        )
    return tuple(value)
