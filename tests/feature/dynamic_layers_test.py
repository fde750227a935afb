"""MiniLM's encoder linears quantized dynamically (the XNNPACK / portable default at 8a8w,
`qnn_quant.layers`), lowered and run for real on both host backends."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qnn_common.config import CompileConfig
from qnn_common.numerics.metrics import cosine, sqnr_db
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target
from qnn_compile.backends import lowering_for
from qnn_compile.lower import LoweredProgram, lower_program
from qnn_infer.runner import HostRunner
from qnn_prepare.calibration import make_calibration
from qnn_prepare.models import load_model
from qnn_prepare.task import LoadedModel, export_program
from qnn_quant.engine import quantize_program
from qnn_quant.fused_qdq import reference_module
from qnn_quant.quantized_ops import dynamic_op_count
from qnn_quant.quantizers import dynamic_scale_per_row

Programs = tuple[LoadedModel, torch.export.ExportedProgram, torch.export.ExportedProgram]


def _quantized_minilm(layers: int | None = None) -> Programs:
    model = load_model("minilm", seq_len=32)
    if layers is not None:
        encoder = model.module.get_submodule("hf.encoder")
        blocks = encoder.get_submodule("layer")
        assert isinstance(blocks, torch.nn.ModuleList)
        encoder.layer = blocks[:layers]
    fp32 = export_program(model)
    calibration = make_calibration(model, num_samples=8, source=None, seed=1126)
    quantized = quantize_program(fp32, target=Target(Backend.XNNPACK), recipe=Recipe.A8W8,
                                 calibration=calibration, progress=False)
    return model, fp32, quantized


@pytest.fixture(scope="module")
def minilm() -> Programs:
    return _quantized_minilm()


def _lower_and_run(
    program: torch.export.ExportedProgram, backend: Backend, inputs: tuple[torch.Tensor, ...],
    tmp_path: Path,
) -> tuple[LoweredProgram, torch.Tensor]:
    lowered = lower_program(program, lowering_for(CompileConfig(backend=backend,
                                                                recipe=Recipe.A8W8)))
    pte = tmp_path / f"{backend.value}.pte"
    pte.write_bytes(lowered.pte)
    return lowered, HostRunner(pte).run(inputs)[0]


def test_every_encoder_linear_is_dynamic(minilm: Programs) -> None:
    _, _, quantized = minilm
    assert dynamic_op_count(quantized.graph_module) == 36  # 6 blocks x (q, k, v, out, up, down)


def test_xnnpack_runs_them_inside_its_delegate_closer_to_fp32_than_fake_quant(
    minilm: Programs, tmp_path: Path,
) -> None:
    model, fp32, quantized = minilm
    inputs = tuple(model.example_inputs)
    lowered, out = _lower_and_run(quantized, Backend.XNNPACK, inputs, tmp_path)
    outside = " ".join(lowered.op_counts)
    assert "linear" not in outside and "choose_qparams" not in outside, lowered.op_counts
    with torch.no_grad():
        ref = fp32.module()(*inputs)
        fake = quantized.module()(*inputs)
    # XNNPACK scales each row (token) on its own; fake quant, one scale per tensor. Measured
    # (seq 128): .pte 0.9986, fake quant 0.9908 vs fp32.
    assert cosine(ref.numpy(), out.numpy()) >= 0.995
    assert cosine(ref.numpy(), out.numpy()) > cosine(ref.numpy(), fake.numpy())


def test_per_row_reference_is_what_xnnpack_computes(minilm: Programs, tmp_path: Path) -> None:
    model, _, quantized = minilm
    inputs = tuple(model.example_inputs)
    _, out = _lower_and_run(quantized, Backend.XNNPACK, inputs, tmp_path)
    assert dynamic_scale_per_row(Backend.XNNPACK) and not dynamic_scale_per_row(Backend.PORTABLE)
    with torch.no_grad():
        per_row = reference_module(quantized, dynamic_per_row=True)(*inputs)
        per_tensor = reference_module(quantized)(*inputs)
    # Measured (seq 128): 26.0-33.4 dB per row, 17.5-21.1 dB per tensor.
    assert sqnr_db(per_row.numpy(), out.numpy()) >= 24.0
    assert sqnr_db(per_row.numpy(), out.numpy()) > sqnr_db(per_tensor.numpy(), out.numpy()) + 5


def test_portable_computes_what_fake_quant_computes(minilm: Programs, tmp_path: Path) -> None:
    """The same quantized_decomposed math, in one encoder block to float rounding. Over six, a
    value that lands on the other side of a rounding boundary moves one level, and each later
    dynamic quantization carries it on: how far depends on the CPU's float summation order
    (max |diff| 0.002 on one machine, 0.014 on another; cosine 0.9971 there)."""
    model, _, one_block = _quantized_minilm(layers=1)
    inputs = tuple(model.example_inputs)
    lowered, out = _lower_and_run(one_block, Backend.PORTABLE, inputs, tmp_path)
    assert lowered.partitions == 0
    assert lowered.op_counts["quantized_decomposed.choose_qparams.tensor"] == 4  # qkv, o, up, down
    with torch.no_grad():
        fake = one_block.module()(*inputs)
    assert float((fake - out).abs().max()) <= 1e-4

    _, _, quantized = minilm
    _, out = _lower_and_run(quantized, Backend.PORTABLE, inputs, tmp_path)
    with torch.no_grad():
        fake = quantized.module()(*inputs)
    assert cosine(fake.numpy(), out.numpy()) >= 0.995
