"""8da4w's weight forms on real torchao tensors and real exports: asymmetric groups split into a
symmetric int4 weight plus a float offset per group, symmetric groups, int8 output heads.
(Lowering and running them on XNNPACK and portable: tests/llm/recipe_8da4w_test.py.)"""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
from torch import nn

from qnn_common.config import QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.numerics.metrics import sqnr_db
from qnn_common.recipes import Backend, Recipe
from qnn_common.weight_groups import GroupMapping, default_group_mapping
from qnn_quant.engine import quantize_one
from qnn_quant.intx import IntxResult, split_asymmetric
from qnn_quant.report import accuracy_report

GROUP = 32


def _on_q4_1_grid(out_f: int, in_f: int, seed: int) -> torch.Tensor:
    """A weight whose every group of 32 input channels is `scale * q + minimum`, q in 0..15,
    minimum and scale drawn per group: GGUF Q4_1's form, not centred on 0."""
    gen = torch.Generator().manual_seed(seed)
    groups = in_f // GROUP
    q = torch.randint(0, 16, (out_f, groups, GROUP), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # each group spans its whole grid, as Q4_1's min/max does
    scale = torch.rand(out_f, groups, 1, generator=gen) * 0.02 + 0.002
    minimum = torch.randn(out_f, groups, 1, generator=gen) * 0.05 - 0.04
    return (scale * q + minimum).reshape(out_f, in_f)


class _Decoderish(nn.Module):
    """A linear, a nonlinearity and an output head named as a Hugging Face causal LM's."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.lm_head = nn.Linear(96, 200, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(_on_q4_1_grid(96, 64, seed=1))
            self.lm_head.weight.copy_(_on_q4_1_grid(200, 96, seed=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(torch.relu(self.up(x)))
        return out


def _quantize(mapping: GroupMapping, int8_weights: tuple[str, ...] | None = None) -> tuple[
    torch.export.ExportedProgram, torch.Tensor, torch.Tensor, dict[str, object]
]:
    torch.manual_seed(0)
    model = _Decoderish().eval()
    x = torch.randn(2, 7, 64)
    ep = torch.export.export(model, (x,))
    program, result = quantize_one(ep, QuantizeConfig(
        recipe=Recipe.A8DW4, group_mapping=mapping, int8_weights=int8_weights), [])
    assert isinstance(result, IntxResult)
    with torch.no_grad():
        return program, model(x), program.module()(x), result.to_json()


def _targets(program: torch.export.ExportedProgram) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def test_split_is_exact_on_a_min_max_grid_and_symmetric_in_int4() -> None:
    weight = _on_q4_1_grid(48, 128, seed=3)
    q, scale, offset = split_asymmetric(weight, GROUP)
    assert q.dtype == torch.int8 and int(q.min()) == -8 and int(q.max()) == 7
    assert scale.shape == offset.shape == (48, 128 // GROUP)
    rebuilt = q.float().reshape(48, -1, GROUP) * scale[..., None] + offset[..., None]
    assert torch.allclose(rebuilt.reshape(48, 128), weight, atol=1e-6)


def test_a_constant_group_is_kept_exactly() -> None:
    weight = torch.full((2, GROUP), 0.25)
    q, scale, offset = split_asymmetric(weight, GROUP)
    rebuilt = q.float() * scale[..., None].reshape(2, 1) + offset.reshape(2, 1)
    assert torch.allclose(rebuilt, weight, atol=1e-6)


def test_asymmetric_groups_add_the_offset_path_and_beat_symmetric_on_such_weights() -> None:
    asym, ref, out_asym, record = _quantize(GroupMapping.ASYMMETRIC, int8_weights=())
    sym, _, out_sym, sym_record = _quantize(GroupMapping.SYMMETRIC, int8_weights=())
    # Per 4-bit linear: the GEMM's input and weight dequantized, then the group sums of its
    # input and their constants as two float linears, added to the GEMM's output.
    assert _targets(asym).count("aten.linear.default") == 2 * 3
    assert _targets(asym).count("aten.add.Tensor") == 2
    assert record["offset_parameters"] == 96 * 64 // GROUP + 200 * 96 // GROUP
    assert _targets(sym).count("aten.linear.default") == 2
    assert sym_record["offset_parameters"] == 0
    # Weights on a min/max grid: the asymmetric split keeps them, so only the per-token int8
    # activations differ from fp32; symmetric groups round every weight a second time.
    asym_db, sym_db = sqnr_db(ref, out_asym), sqnr_db(ref, out_sym)
    assert asym_db >= 30 and asym_db >= sym_db + 6, (asym_db, sym_db)


def test_the_output_head_gets_int8_weights_by_default() -> None:
    program, ref, out, record = _quantize(GroupMapping.ASYMMETRIC)
    assert record["linears_int8_weights"] == {"lm_head": r"(^|\.)lm_head$"}
    assert record["linears_quantized"] == 2
    assert record["offset_parameters"] == 96 * 64 // GROUP  # the head has no groups
    values = {name: t for name, t in program.state_dict.items()
              if name.endswith("parametrizations.weight.original0")}
    head = next(t for name, t in values.items() if "lm_head" in name)
    up = next(t for name, t in values.items() if "up" in name)
    assert head.dtype == up.dtype == torch.int8
    assert int(head.abs().max()) > 7  # 8-bit values
    assert int(up.min()) >= -8 and int(up.max()) <= 7  # 4-bit values
    assert sqnr_db(ref, out) >= 30


def test_group_mapping_and_int8_weights_belong_to_grouped_recipes() -> None:
    # A TOML file or the CLI hands the value over as a string.
    as_text: Any = "symmetric"
    assert QuantizeConfig(recipe=Recipe.A8DW4, group_mapping=as_text).group_mapping is (
        GroupMapping.SYMMETRIC
    )
    lpbq = QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A16W4_BLOCK, soc="SM8650",
                          group_mapping=cast(Any, "asymmetric"))
    assert lpbq.group_mapping is GroupMapping.ASYMMETRIC
    # Unset: each recipe's own default.
    assert default_group_mapping(Recipe.A8DW4) is GroupMapping.ASYMMETRIC
    assert default_group_mapping(Recipe.A16W4_BLOCK) is GroupMapping.SYMMETRIC
    with pytest.raises(ConfigValidationError, match="only 8da4w's groups and 16a4w_block's"):
        QuantizeConfig(recipe=Recipe.A8W8, group_mapping=GroupMapping.SYMMETRIC)
    with pytest.raises(ConfigValidationError, match="only 8da4w's groups and 16a4w_block's"):
        QuantizeConfig(recipe=Recipe.A8W8, int8_weights=("lm_head",))
    assert QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A16W4_BLOCK, soc="SM8650",
                          int8_weights=("lm_head",)).int8_weights == ("lm_head",)
    with pytest.raises(ConfigValidationError, match="group_mapping"):
        QuantizeConfig(recipe=Recipe.A8DW4, group_mapping=cast(Any, "sideways"))


class _SharedInput(nn.Module):
    """q / k / v style: three linears reading one input."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(64, 32) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.q(x) * self.k(x) + self.v(x)
        return out


def test_linears_that_read_one_input_share_its_group_sums() -> None:
    torch.manual_seed(0)
    model = _SharedInput().eval()
    x = torch.randn(3, 64)
    program, result = quantize_one(
        torch.export.export(model, (x,)), QuantizeConfig(recipe=Recipe.A8DW4), [])
    assert isinstance(result, IntxResult)
    # Fused (qnn_quant.fused_linears): 1 GEMM, 1 group sum, 1 offset, sliced 3 ways; each 0/1
    # matrix read by one node only (a constant read by several would be copied per partition by
    # ExecuTorch).
    assert _targets(program).count("aten.linear.default") == 1 + 1 + 1
    assert _targets(program).count("aten.slice.Tensor") == 3
    assert result.fused == {"q+k+v": ["q", "k", "v"]}
    sums = [n for n in program.graph.nodes if n.op == "placeholder" and "group_sum" in n.name]
    assert len(sums) == 1 and len(sums[0].users) == 1
    # Against the model with each weight replaced by its groups' values: what is left is the
    # per-token int8 activations' noise, so each offset reached its own linear.
    grid = _SharedInput().eval()
    grid.load_state_dict(model.state_dict())
    with torch.no_grad():
        for linear in (grid.q, grid.k, grid.v):
            q, scale, offset = split_asymmetric(linear.weight, GROUP)
            values = q.float().reshape(32, -1, GROUP) * scale[..., None] + offset[..., None]
            linear.weight.copy_(values.reshape(32, 64))
        assert sqnr_db(grid(x), program.module()(x)) >= 30
    assert result.offset_parameters == 3 * 32 * 64 // GROUP
    # The layer report still finds q, k and v, through their slices.
    layers = {
        w["layer"] for w in accuracy_report(
            torch.export.export(model, (x,)), program, [(x,)], top_k=10
        )["worst_layers"]
    }
    assert {"q", "k", "v"} <= layers


def test_the_layer_report_reads_a_split_linear_after_its_offset_path() -> None:
    # The GEMM alone computes the symmetric part of the weight only: compared with the float
    # layer it read about 0 dB, and the report named the model's best-kept layers its worst.
    torch.manual_seed(0)
    model = _Decoderish().eval()
    samples = [(torch.randn(2, 7, 64),) for _ in range(2)]
    fp32 = torch.export.export(model, samples[0])
    program, _ = quantize_one(
        fp32, QuantizeConfig(recipe=Recipe.A8DW4, group_mapping=GroupMapping.ASYMMETRIC), [])
    layers = {w["layer"]: w for w in accuracy_report(fp32, program, samples)["worst_layers"]}
    assert layers["up"]["op"] == "linear"
    assert float(layers["up"]["sqnr_db"]) >= 30, layers["up"]


def test_folding_the_weights_dequantize_keeps_every_bit() -> None:
    from qnn_quant.fused_qdq import fold_weight_dequantize, reference_module

    program, _, _, _ = _quantize(GroupMapping.ASYMMETRIC)
    x = torch.randn(2, 7, 64)
    gm = reference_module(program, dynamic_per_row=True)
    with torch.no_grad():
        before = gm(x)
    def dequantize_ops() -> int:
        return sum(1 for n in gm.graph.nodes
                   if n.op == "call_function" and "dequantize" in str(n.target))

    dequantized = dequantize_ops()
    assert fold_weight_dequantize(gm) == 2  # both linears' weights; activations stay
    assert dequantize_ops() == dequantized - 2
    with torch.no_grad():
        assert torch.equal(gm(x), before)


def test_weights_on_a_q4_1_grid_cost_nothing_with_asymmetric_groups() -> None:
    """With its activations left in float (`float_activations`), a model whose weights are on
    GGUF Q4_1's grid computes what the float model does: what 8da4w loses on such a model
    (SmolLM2's GGUF) is its activations' rounding, per token, not its weights'."""
    from qnn_quant.fused_qdq import float_activations, fold_weight_dequantize, reference_module

    program, reference, fake_quant, _ = _quantize(GroupMapping.ASYMMETRIC, int8_weights=())
    torch.manual_seed(0)
    _Decoderish().eval()  # _quantize's draws, for the same x below
    x = torch.randn(2, 7, 64)
    gm = reference_module(program, dynamic_per_row=True)
    fold_weight_dequantize(gm)
    assert float_activations(gm) == 2  # each linear's input
    with torch.no_grad():
        weights_only = gm(x)
    exact = sqnr_db(reference, weights_only)
    assert exact > 90 and sqnr_db(reference, fake_quant) < exact - 30
