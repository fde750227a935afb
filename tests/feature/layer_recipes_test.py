"""Per-layer recipes (`quantize.layer_recipes`) applied by the real quantizers to a tiny Llama:
the named layers take their recipe's weights and the rest the model's, asserted on the
quantized graph's q/dq ops; a pattern that names no layer is refused before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qnn_common.config import QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.numerics.metrics import sqnr_db
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_prepare.calibration import make_calibration
from qnn_prepare.task import LoadedModel
from qnn_quant.engine import quantize_program
from qnn_quant.layers import layer_recipe_record, module_path
from support.quantized_weights import weight_grids
from support.tiny_llama import tiny_llama_program

HTP = Target(Backend.QNN, lookup_soc("SM8650"))
DOWN_0 = "hf.model.layers.0.mlp.down_proj"
Q_1 = "hf.model.layers.1.self_attn.q_proj"


@pytest.fixture(scope="module")
def tiny_llama(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[LoadedModel, torch.export.ExportedProgram]:
    return tiny_llama_program(tmp_path_factory.mktemp("llama"))


def _run(ep: torch.export.ExportedProgram, sample: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = ep.module()(*sample)
    return out


def _quantize(
    tiny: tuple[LoadedModel, torch.export.ExportedProgram], target: Target, recipe: Recipe,
    table: tuple[LayerRecipe, ...],
) -> torch.export.ExportedProgram:
    model, ep = tiny
    calibration = make_calibration(model, num_samples=2, source=None, seed=1126)
    quantized = quantize_program(ep, target=target, recipe=recipe, calibration=calibration,
                                 progress=False, layer_recipes=table)
    # The mixed program still computes the model.
    assert sqnr_db(_run(ep, calibration[0]).numpy(), _run(quantized, calibration[0]).numpy()) > 10
    return quantized


def test_16a4w_block_with_a_down_projection_at_16a8w(
    tiny_llama: tuple[LoadedModel, torch.export.ExportedProgram],
) -> None:
    table = (LayerRecipe(r"layers\.0\.mlp\.down_proj$", Recipe.A16W8),)
    weights = weight_grids(_quantize(tiny_llama, HTP, Recipe.A16W4_BLOCK, table))

    assert weights[DOWN_0] == ("per channel", 127)  # 8-bit, not blocked, not a convolution
    blocked = {p for p, (form, _) in weights.items() if form == "blocks"}
    # Every other decoder linear is still in LPBQ blocks; the head is int8_weights' default.
    assert len(blocked) == 2 * 7 - 1 and DOWN_0 not in blocked
    assert weights["hf.lm_head"] == ("per channel", 127)


def test_16a8w_with_layers_at_4_bits_in_blocks_and_per_channel(
    tiny_llama: tuple[LoadedModel, torch.export.ExportedProgram],
) -> None:
    table = (
        LayerRecipe(r"layers\.1\.self_attn\.q_proj$", Recipe.A16W4_BLOCK),
        LayerRecipe(r"layers\.0\.mlp\.", Recipe.A16W4),
    )
    weights = weight_grids(_quantize(tiny_llama, HTP, Recipe.A16W8, table))

    assert weights[Q_1] == ("blocks", None)  # the one LPBQ layer, run as a 1x1 convolution
    assert [p for p, (form, _) in weights.items() if form == "blocks"] == [Q_1]
    four_bit = {p for p, w in weights.items() if w == ("per channel", 7)}
    assert four_bit == {f"hf.model.layers.0.mlp.{n}_proj" for n in ("gate", "up", "down")}
    assert all(w == ("per channel", 127) for p, w in weights.items()
               if p not in four_bit and p != Q_1)


def test_a_layer_left_float_on_xnnpack_and_in_8da4w(
    tiny_llama: tuple[LoadedModel, torch.export.ExportedProgram],
) -> None:
    table = (LayerRecipe(r"layers\.0\.mlp\.down_proj$", Recipe.FP32),)
    static = weight_grids(_quantize(tiny_llama, Target(Backend.XNNPACK), Recipe.A8W8, table))
    assert static[DOWN_0] == ("float", None)
    assert sum(form == "per channel" for form, _ in static.values()) == len(static) - 1

    model, ep = tiny_llama
    dynamic = quantize_program(ep, target=Target(Backend.XNNPACK), recipe=Recipe.A8DW4,
                               calibration=make_calibration(model, num_samples=1, source=None,
                                                            seed=1126),
                               progress=False, layer_recipes=table)
    linears = {module_path(n): n for n in dynamic.graph.nodes
               if n.target == torch.ops.aten.linear.default}
    # 8da4w's float linear keeps its fp32 weight; the others read a dequantized one (the
    # asymmetric groups' offset linears, which name no module, hold float offsets).
    assert linears[DOWN_0].args[1].op in ("get_attr", "placeholder")
    assert all(n.args[1].op == "call_function" for p, n in linears.items() if p and p != DOWN_0)


def test_a_pattern_that_names_no_layer_is_refused_with_the_closest_paths(
    tiny_llama: tuple[LoadedModel, torch.export.ExportedProgram],
) -> None:
    model, ep = tiny_llama
    with pytest.raises(ConfigValidationError, match="matches no layer.*closest") as err:
        quantize_program(
            ep, target=HTP, recipe=Recipe.A16W4_BLOCK,
            calibration=make_calibration(model, num_samples=1, source=None, seed=1126),
            progress=False, layer_recipes=(LayerRecipe(r"layers\.0\.mlp\.dwn_proj", Recipe.A16W8),),
        )
    assert "down_proj" in str(err.value)


def test_the_record_lists_what_each_entry_took(
    tiny_llama: tuple[LoadedModel, torch.export.ExportedProgram],
) -> None:
    _, ep = tiny_llama
    table = (LayerRecipe(r"layers\.0\.mlp\.down_proj$", Recipe.A16W8),
             LayerRecipe(r"layers\.0\.mlp\.", Recipe.A16W4))
    record = layer_recipe_record([ep.graph], table)
    assert record[0] == {"pattern": table[0].pattern, "recipe": "16a8w", "layers": 1,
                         "module_paths": [DOWN_0]}
    # The first match wins: the down projection is not counted again under the second entry.
    assert record[1]["module_paths"] == [
        f"hf.model.layers.0.mlp.{n}" for n in ("act_fn", "gate_proj", "up_proj")]


def test_a_mixed_recipe_is_part_of_the_config_and_its_cache_key(tmp_path: Path) -> None:
    from qnn_common.cache_keys import cache_key

    base = QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A16W4_BLOCK, soc="SM8650")
    mixed = QuantizeConfig(
        backend=Backend.QNN, recipe=Recipe.A16W4_BLOCK, soc="SM8650",
        layer_recipes=(LayerRecipe("down_proj", Recipe.A16W8),),
    )
    assert mixed.layer_recipes == (LayerRecipe("down_proj", Recipe.A16W8),)
    digests = {"prepare": "0" * 64}
    assert cache_key("quantize", base, digests, "v") != cache_key("quantize", mixed, digests, "v")
