"""4-bit weights in groups: how many input channels share a scale, how a group's 16 levels map
to values, which linears and tables of a causal LM get int8 instead (8da4w's and 16a4w_block's
choices, the rules of which the quantize config checks)."""

from __future__ import annotations

import enum

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import BACKENDS, Backend, Recipe, WeightGroups

# 8da4w: input channels per weight scale. 32 is what ExecuTorch's LLM export
# (extension/llm/export/quantize.py) and optimum-executorch default to; upstream's older
# `export_llama -qmode 8da4w` falls back to 128, which does not divide SmolLM2's hidden size of
# 576 (those projections would stay float).
DEFAULT_GROUP_SIZE = 32


class GroupMapping(enum.StrEnum):
    """8da4w and 16a4w_block: how a 4-bit weight group's (or LPBQ block's) 16 levels map to
    values (`qnn_quant.intx`, `qnn_quant.quantizers.lpbq`)."""

    # levels from the group's minimum to its maximum: `scale * q + minimum`, the form of GGUF's
    # Q4_1 and of GPTQ / AWQ checkpoints. XNNPACK's 4-bit kernels hold no offset, so it runs as a
    # symmetric int4 weight plus the group's float offset times the sum of the group's inputs.
    ASYMMETRIC = "asymmetric"
    # levels symmetric around 0: `scale * q`, q in -8..7, scales fitted by HQQ; what ExecuTorch's
    # LLM export and optimum-executorch do. One GEMM, no offset, one 4-bit rounding more on
    # weights that were not centred on 0.
    SYMMETRIC = "symmetric"


DEFAULT_GROUP_MAPPING = GroupMapping.ASYMMETRIC


def default_group_mapping(recipe: Recipe) -> GroupMapping:
    """8da4w's groups min/max (DEFAULT_GROUP_MAPPING); 16a4w_block's LPBQ blocks symmetric, as
    upstream's. Asymmetric LPBQ blocks cost two small linears per layer input and a second
    rounding of weights not already on a min/max grid; they pay off on weights that are (GGUF
    Q4_1, GPTQ checkpoints: docs/quantization.md)."""
    lpbq = recipe.traits.weight_groups is WeightGroups.LPBQ
    return GroupMapping.SYMMETRIC if lpbq else DEFAULT_GROUP_MAPPING
# 8da4w: linears whose weights get int8 (one scale per output channel) instead of 4-bit groups.
# A causal LM's output head reads the residual stream's every feature into 49k-256k logits, and
# is the one linear whose 4-bit rounding moves the next-token choice most (measured per layer
# in bench/intx_sensitivity.py); int8 there costs a few MB against a 4-bit head.
DEFAULT_INT8_WEIGHTS: tuple[str, ...] = (r"(^|\.)lm_head$",)


class EmbeddingWeights(enum.StrEnum):
    """8da4w: how embedding tables are stored (`qnn_quant.embedding`); upstream's `--qembedding`."""

    FLOAT = "float"
    # int8, symmetric, one scale per group of group_size channels of a row.
    INT8 = "8w"
    # 4-bit, asymmetric groups of group_size input channels (GGUF Q4_1's form for tables).
    INT4 = "4w"


# A causal LM's token table is its largest float tensor once the linears are 4-bit (SmolLM2: 113
# of 229 MB); int8 groups cost ~1/4 of it and move logits less than the 4-bit linears do.
DEFAULT_EMBEDDING_WEIGHTS = EmbeddingWeights.INT8


def check_group_size(
    backend: Backend, recipe: Recipe, group_size: int, field: str = "group_size"
) -> None:
    """Refuse a weight group size the recipe does not use or the backend cannot run, saying why."""
    if recipe.traits.weight_groups is not WeightGroups.GROUPS:
        if group_size != DEFAULT_GROUP_SIZE:
            raise ConfigValidationError(
                field, group_size,
                f"only 8da4w groups its weights; {recipe.value} has "
                + ("blocks (set block_size)" if recipe.traits.weight_groups is WeightGroups.LPBQ
                   else "one scale per output channel")
                + "; drop group_size or use --recipe 8da4w",
            )
        return
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ConfigValidationError(
            field, group_size,
            f"8da4w weight groups are a number of input channels, at least 2; the default is "
            f"{DEFAULT_GROUP_SIZE}",
        )
    rule = BACKENDS[backend].group_size_rule
    if rule is not None and group_size % rule.multiple:
        raise ConfigValidationError(
            field, group_size,
            f"{rule.why}; a linear whose input size the group does not divide stays float",
        )
