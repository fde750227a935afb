"""Issue 8, class 5: a quantized recipe quantizes everything the backend's quantizer takes.

Real exports, real PT2E quantization (XNNPACK's quantizer, and QNN's for the GPT-2 check), real
lowering and runs: a tiny GPT-2 (HF Conv1D = addmm) gets q/dq in every projection; add / mul /
cat / max pooling get q/dq on XNNPACK as with the stock quantizer's global config; `keep_float`
still leaves what it matches in float; a recipe that quantizes nothing is refused with the
recipe's name and what to do; the manifest and summary count the quantized ops by kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from qnn_common.config import CompileConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.numerics.metrics import sqnr_db
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from qnn_quant.engine import quantize_program
from qnn_quant.quantized_ops import NothingQuantizedError, quantized_op_kinds
from support import gpt2_model

XNNPACK = Target(Backend.XNNPACK)


def _export(model: nn.Module, *args: torch.Tensor) -> torch.export.ExportedProgram:
    return torch.export.export(model.eval(), args, strict=False)


def _calibration(example: torch.Tensor, n: int = 4) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(1126)
    if example.dtype.is_floating_point:
        return [(torch.randn(example.shape, generator=g),) for _ in range(n)]
    return [(torch.randint(0, gpt2_model.VOCAB, example.shape, generator=g),) for _ in range(n)]


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.export.ExportedProgram, torch.Tensor]:
    model, (ids,) = gpt2_model.tiny_gpt2()
    ep = _export(model, ids)
    assert any(n.target is torch.ops.aten.addmm.default for n in ep.graph.nodes)  # HF Conv1D
    return ep, ids


def test_gpt2_conv1d_projections_are_quantized_on_xnnpack(
    gpt2: tuple[torch.export.ExportedProgram, torch.Tensor], tmp_path: Path
) -> None:
    ep, ids = gpt2
    quantized = quantize_program(
        ep, target=XNNPACK, recipe=Recipe.A8W8, calibration=_calibration(ids), progress=False
    )
    kinds = quantized_op_kinds(quantized.graph_module)
    # Four Conv1D per block (c_attn, attn c_proj, c_fc, mlp c_proj), each now a quantized linear.
    assert kinds.get("linear") == 4 * gpt2_model.LAYERS, kinds
    assert kinds.get("add", 0) >= 2 * gpt2_model.LAYERS, kinds  # the residual adds
    # Measured (seq 16, 4 calibration samples): 48 ops between q/dq pairs; before: none at all.
    assert sum(kinds.values()) >= 40, kinds
    # Lowered and run: XNNPACK takes the quantized linears (no addmm left outside).
    lowered = lower_program(quantized, lowering_for(_compile(Backend.XNNPACK)))
    assert lowered.partitions >= 1
    assert "aten.addmm.default" not in lowered.op_counts, lowered.op_counts
    got = _run_pte(lowered.pte, tmp_path, ids)
    with torch.no_grad():
        fake_quant = quantized.module()(ids)
    assert sqnr_db(fake_quant.numpy(), got.numpy()) > 25.0


def test_gpt2_is_quantized_by_the_qnn_quantizer_too(
    gpt2: tuple[torch.export.ExportedProgram, torch.Tensor],
) -> None:
    ep, ids = gpt2
    target = Target(Backend.QNN, lookup_soc("SM8650"))
    quantized = quantize_program(
        ep, target=target, recipe=Recipe.A16W8, calibration=_calibration(ids), progress=False
    )
    kinds = quantized_op_kinds(quantized.graph_module)
    assert kinds.get("linear") == 4 * gpt2_model.LAYERS, kinds


class _AddMulCatPool(nn.Module):
    """A conv, then the ops the stock XNNPACK quantizer annotates beyond conv / linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = torch.cat([y + x, y * x], dim=1)
        return torch.nn.functional.max_pool2d(z, 2)


def test_add_mul_cat_and_pooling_are_quantized_and_delegated(tmp_path: Path) -> None:
    x = torch.randn(1, 4, 8, 8)
    ep = _export(_AddMulCatPool(), x)
    quantized = quantize_program(
        ep, target=XNNPACK, recipe=Recipe.A8W8, calibration=_calibration(x), progress=False
    )
    kinds = quantized_op_kinds(quantized.graph_module)
    for op in ("conv2d", "add", "mul", "cat", "max_pool2d"):
        assert kinds.get(op, 0) >= 1, (op, kinds)
    lowered = lower_program(quantized, lowering_for(_compile(Backend.XNNPACK)))
    assert lowered.partitions == 1 and lowered.op_counts == {}, lowered.op_counts
    got = _run_pte(lowered.pte, tmp_path, x)
    with torch.no_grad():
        fake_quant = quantized.module()(x)
    assert sqnr_db(fake_quant.numpy(), got.numpy()) > 30.0


def test_keep_float_still_leaves_matching_layers_float() -> None:
    x = torch.randn(1, 4, 8, 8)
    ep = _export(_AddMulCatPool(), x)
    quantized = quantize_program(
        ep,
        target=XNNPACK,
        recipe=Recipe.A8W8,
        calibration=_calibration(x),
        progress=False,
        keep_float=[r"^conv$"],
    )
    kinds = quantized_op_kinds(quantized.graph_module)
    assert "conv2d" not in kinds and kinds.get("add", 0) >= 1, kinds


class _Cumsum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


def test_a_recipe_that_quantizes_nothing_is_refused_with_what_to_do() -> None:
    x = torch.randn(2, 8)
    ep = _export(_Cumsum(), x)
    with pytest.raises(NothingQuantizedError) as info:
        quantize_program(ep, target=XNNPACK, recipe=Recipe.A8W8, calibration=[(x,)], progress=False)
    message = str(info.value)
    assert isinstance(info.value, ConfigValidationError)
    assert "8a8w" in message and "cumsum" in message and "--recipe fp32" in message


def test_the_summary_counts_quantized_ops_by_kind(tmp_path: Path) -> None:
    ctx = PipelineContext.create(
        "support.gpt2_model:tiny_gpt2",
        backend="xnnpack",
        recipe="8a8w",
        out_dir=tmp_path / "out",
        prepare={"calibration_samples": 4, "eval_samples": 2},
        quantize={"report_layers": 0},
        infer={"warmup": 1, "runs": 2},
    )
    summary = run_pipeline(ctx).checked().summary
    kinds = summary["quantized_op_kinds"]
    assert summary["quantized_ops"] == sum(kinds.values()) > 0, summary
    assert kinds["linear"] == 4 * gpt2_model.LAYERS, kinds


def _compile(backend: Backend) -> CompileConfig:
    return CompileConfig(backend=backend, recipe=Recipe.A8W8)


def _run_pte(pte: bytes, tmp_path: Path, *inputs: torch.Tensor) -> torch.Tensor:
    from executorch.runtime import Runtime

    path = tmp_path / "m.pte"
    path.write_bytes(pte)
    method = Runtime.get().load_program(path).load_method("forward")
    (out,) = method.execute(list(inputs))
    assert isinstance(out, torch.Tensor)
    return out
