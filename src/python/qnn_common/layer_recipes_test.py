"""The per-layer recipe table's rules: which recipes mix into which program, and what the
refusals say."""

from __future__ import annotations

import pytest

from qnn_common.config import QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import (
    LayerRecipe,
    check_layer_recipes,
    layer_recipe_for,
    mixable_recipes,
)
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.weight_groups import GroupMapping

SM8650, SM8350 = lookup_soc("SM8650"), lookup_soc("SM8350")


def test_parse_splits_at_the_last_equals_sign() -> None:
    assert LayerRecipe.parse(r"layers\.[0-3]\.mlp=16A8W") == LayerRecipe(
        r"layers\.[0-3]\.mlp", Recipe.A16W8)
    assert LayerRecipe.parse("a=b=fp32") == LayerRecipe("a=b", Recipe.FP32)
    assert LayerRecipe.parse("head=16a8w").to_text() == "head=16a8w"
    with pytest.raises(ConfigValidationError, match="PATTERN=RECIPE"):
        LayerRecipe.parse("down_proj")
    with pytest.raises(ConfigValidationError, match="unknown recipe.*allowed: fp32"):
        LayerRecipe.parse("down_proj=int4")
    with pytest.raises(ConfigValidationError, match="not a regular expression"):
        LayerRecipe("layers.(", Recipe.A16W8)


def test_the_first_matching_entry_decides() -> None:
    table = (LayerRecipe(r"layers\.0\.mlp\.down_proj$", Recipe.A16W8),
             LayerRecipe(r"layers\.0\.", Recipe.A16W4))
    assert layer_recipe_for("hf.model.layers.0.mlp.down_proj", table) is Recipe.A16W8
    assert layer_recipe_for("hf.model.layers.0.mlp.up_proj", table) is Recipe.A16W4
    assert layer_recipe_for("hf.model.layers.1.mlp.up_proj", table) is None
    assert layer_recipe_for(None, table) is None


def test_qnn_layers_mix_recipes_of_the_programs_activation_width() -> None:
    assert mixable_recipes(Backend.QNN, Recipe.A16W4_BLOCK, SM8650) == (
        Recipe.FP32, Recipe.A16W8, Recipe.A16W16, Recipe.A16W4, Recipe.A16W4_BLOCK,
        Recipe.A16W2)
    check_layer_recipes(Backend.QNN, Recipe.A16W4_BLOCK, SM8650, (
        LayerRecipe("down_proj", Recipe.A16W8), LayerRecipe("lm_head", Recipe.A16W16),
        LayerRecipe("norm", Recipe.FP32)))
    with pytest.raises(ConfigValidationError, match="activations are 16-bit") as err:
        check_layer_recipes(Backend.QNN, Recipe.A16W4_BLOCK, SM8650,
                            (LayerRecipe("down_proj", Recipe.A8W8),))
    assert err.value.field == "quantize.layer_recipes['down_proj']"
    assert err.value.allowed is not None and "16a8w" in err.value.allowed
    assert "8a8w" not in err.value.allowed


def test_a_layer_recipe_obeys_the_socs_htp_floor() -> None:
    with pytest.raises(ConfigValidationError, match="needs HTP >= V73.*SM8350"):
        check_layer_recipes(Backend.QNN, Recipe.A16W8, SM8350,
                            (LayerRecipe("lm_head", Recipe.A16W16),))


def test_cpu_programs_mix_with_fp32_only() -> None:
    check_layer_recipes(Backend.XNNPACK, Recipe.A8DW4, None, (LayerRecipe("x", Recipe.FP32),))
    with pytest.raises(ConfigValidationError, match="int8_weights"):
        check_layer_recipes(Backend.XNNPACK, Recipe.A8DW4, None,
                            (LayerRecipe("down_proj", Recipe.A8W8),))
    with pytest.raises(ConfigValidationError, match="backend xnnpack cannot run it"):
        check_layer_recipes(Backend.XNNPACK, Recipe.A8W8, None,
                            (LayerRecipe("down_proj", Recipe.A16W8),))


def test_the_config_takes_the_table_and_lets_its_lpbq_layers_choose_blocks() -> None:
    cfg = QuantizeConfig(
        backend=Backend.QNN, recipe=Recipe.A16W8, soc="SM8650", block_size=32,
        group_mapping=GroupMapping.ASYMMETRIC,
        layer_recipes=(LayerRecipe("q_proj", Recipe.A16W4_BLOCK),),
    )
    assert cfg.layer_recipes == (LayerRecipe("q_proj", Recipe.A16W4_BLOCK),)
    assert cfg.recipes == (Recipe.A16W8, Recipe.A16W4_BLOCK)
    with pytest.raises(ConfigValidationError, match="quantizes weights in blocks"):
        QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A16W8, soc="SM8650", block_size=32)
    with pytest.raises(ConfigValidationError, match="list of LayerRecipe"):
        QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A16W8, soc="SM8650",
                       layer_recipes=("q=16a4w",),  # type: ignore[arg-type]  # wrong on purpose
                       )
    with pytest.raises(ConfigValidationError, match="activations are 8-bit"):
        QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A8W8, soc="SM8650",
                       layer_recipes=(LayerRecipe("q", Recipe.A16W8),))
