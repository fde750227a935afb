"""8da4w's embedding tables on real torchao tensors and real exports: int8 or 4-bit groups,
a table tied to the output head, and the float form. (Lowered to ExecuTorch's quantized lookup
kernels and run: tests/llm/recipe_8da4w_test.py.)"""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
from torch import nn

from qnn_common.config import QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.numerics.metrics import sqnr_db
from qnn_common.recipes import Recipe
from qnn_common.weight_groups import EmbeddingWeights
from qnn_quant.engine import quantize_one
from qnn_quant.intx import IntxResult

VOCAB, WIDTH = 300, 64


class _TiedLm(nn.Module):
    """Token table, one linear, and an output head that shares the table (SmolLM2's tying)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, WIDTH)
        self.up = nn.Linear(WIDTH, WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(torch.relu(self.up(self.embed_tokens(ids))))
        return out


def _quantize(
    weights: EmbeddingWeights,
) -> tuple[torch.export.ExportedProgram, torch.Tensor, torch.Tensor, dict[str, str]]:
    torch.manual_seed(0)
    model = _TiedLm().eval()
    ids = torch.randint(0, VOCAB, (1, 24))
    ep = torch.export.export(model, (ids,))
    program, result = quantize_one(
        ep, QuantizeConfig(recipe=Recipe.A8DW4, embedding_weights=weights), [])
    assert isinstance(result, IntxResult)
    with torch.no_grad():
        return program, model(ids), program.module()(ids), result.embeddings


def _lookup_table(program: torch.export.ExportedProgram) -> torch.fx.Node:
    (lookup,) = (n for n in program.graph.nodes if n.target is torch.ops.aten.embedding.default)
    table = lookup.args[0]
    assert isinstance(table, torch.fx.Node)
    return table


def _table_values(program: torch.export.ExportedProgram) -> torch.Tensor:
    """The integer values the lookup's dequantize reads."""
    values = _lookup_table(program).args[0]
    assert isinstance(values, torch.fx.Node)
    name = program.graph_signature.inputs_to_parameters[values.name]
    tensor: torch.Tensor = program.state_dict[name]
    return tensor


def _float_tables(program: torch.export.ExportedProgram) -> list[str]:
    return [name for name, t in program.state_dict.items()
            if t.is_floating_point() and tuple(t.shape) == (VOCAB, WIDTH)]


def test_int8_groups_are_looked_up_through_a_dequantize_and_the_float_table_is_gone() -> None:
    program, _, quantized, record = _quantize(EmbeddingWeights.INT8)
    assert record == {"embed_tokens": "8w (symmetric, one scale per 32 channels)"}
    table = _lookup_table(program)
    # The pattern ExecuTorch's quant fusion turns into quantized_decomposed.embedding_byte.
    assert str(table.target) == "torchao.dequantize_affine.default"
    assert table.args[1] == [1, 32] and table.args[5:7] == (-128, 127)
    values = _table_values(program)
    assert values.dtype == torch.int8 and tuple(values.shape) == (VOCAB, WIDTH)
    # Tied: the head has its own int8 weight, so nothing reads the float table any more.
    assert _float_tables(program) == []
    # Against the same program with a float table (so only the table's rounding counts).
    _, _, float_table, _ = _quantize(EmbeddingWeights.FLOAT)
    assert sqnr_db(float_table, quantized) > 35


def test_4bit_groups_take_the_group_size_and_stay_in_range() -> None:
    program, _, quantized, record = _quantize(EmbeddingWeights.INT4)
    assert record == {"embed_tokens": "4w (asymmetric, one scale per 32 channels)"}
    table = _lookup_table(program)
    assert table.args[1] == [1, 32] and table.args[5:7] == (-8, 7)
    values = _table_values(program)
    assert values.dtype == torch.int8 and int(values.min()) >= -8 and int(values.max()) <= 7
    assert _float_tables(program) == []
    _, _, float_table, _ = _quantize(EmbeddingWeights.FLOAT)
    assert sqnr_db(float_table, quantized) > 15


def test_float_keeps_the_table() -> None:
    program, _, _, record = _quantize(EmbeddingWeights.FLOAT)
    assert record == {}
    assert _lookup_table(program).op == "placeholder"
    assert _float_tables(program)  # (under both of its tied names)


def test_int8_groups_lose_less_than_4bit_groups() -> None:
    _, _, float_table, _ = _quantize(EmbeddingWeights.FLOAT)
    _, _, int8, _ = _quantize(EmbeddingWeights.INT8)
    _, _, int4, _ = _quantize(EmbeddingWeights.INT4)
    assert sqnr_db(float_table, int8) > sqnr_db(float_table, int4) + 12


def test_embedding_weights_belong_to_8da4w() -> None:
    # A TOML config gives the value as text.
    from_toml = QuantizeConfig(recipe=Recipe.A8DW4, embedding_weights=cast(Any, "4w"))
    assert from_toml.embedding_weights is EmbeddingWeights.INT4
    with pytest.raises(ConfigValidationError, match="only 8da4w"):
        QuantizeConfig(recipe=Recipe.A8W8, embedding_weights=EmbeddingWeights.FLOAT)
    with pytest.raises(ConfigValidationError, match="quantize.embedding_weights"):
        QuantizeConfig(recipe=Recipe.A8DW4, embedding_weights=cast(Any, "2w"))
