from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from qnn_common.numerics.metrics import cosine, sqnr_db
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_prepare.calibration import make_calibration, random_samples
from qnn_prepare.causal_lm.tiny_decoders import save_tiny_llama
from qnn_prepare.models import load_model
from qnn_prepare.task import LoadedModel, export_program
from qnn_quant.engine import quantize_program
from qnn_quant.report import accuracy_report, accuracy_report_and_outputs


@pytest.fixture(scope="module")
def cnn_pair() -> tuple[LoadedModel, torch.export.ExportedProgram, torch.export.ExportedProgram]:
    model = load_model("tiny-cnn")
    ep = export_program(model)
    calibration = make_calibration(model, num_samples=4, source=None, seed=1126)
    quantized = quantize_program(
        ep, target=Target(Backend.XNNPACK), recipe=Recipe.A8W8, calibration=calibration,
        progress=False,
    )
    return model, ep, quantized


def test_report_shape_and_numbers(
    cnn_pair: tuple[LoadedModel, torch.export.ExportedProgram, torch.export.ExportedProgram],
) -> None:
    model, ep, quantized = cnn_pair
    samples = random_samples(model, num_samples=3, seed=11)
    report = accuracy_report(ep, quantized, samples, top_k=3)
    json.dumps(report, allow_nan=False)  # strictly JSON-serializable

    assert report["num_samples"] == 3
    (out,) = report["vs_fp32"]["per_output"]
    with torch.no_grad():
        ref = np.concatenate([ep.module()(*s).numpy() for s in samples])
        fake = np.concatenate([quantized.module()(*s).numpy() for s in samples])
    assert out["output"] == 0
    assert out["sqnr_db"] == pytest.approx(sqnr_db(ref, fake))
    assert out["cosine"] == pytest.approx(cosine(ref, fake))
    assert out["max_abs_error"] == pytest.approx(float(np.abs(ref - fake).max()), rel=1e-5)
    assert report["vs_fp32"]["sqnr_db"] == pytest.approx(out["sqnr_db"])

    worst = report["worst_layers"]
    assert len(worst) == 3
    assert [w["sqnr_db"] for w in worst] == sorted(w["sqnr_db"] for w in worst)
    assert {w["layer"] for w in worst} <= {"conv1", "conv2", "pool", "head", "relu", "relu_1"}
    assert all(w["op"] in {"conv2d", "relu", "max_pool2d", "linear"} for w in worst)
    assert all(0.9 < w["cosine"] <= 1.0 for w in worst)
    assert report["layers_compared"] == 7  # 2 conv, 2 relu, 2 pool, 1 linear


def test_identical_programs_report_infinite_sqnr(
    cnn_pair: tuple[LoadedModel, torch.export.ExportedProgram, torch.export.ExportedProgram],
) -> None:
    model, ep, _ = cnn_pair
    report = accuracy_report(ep, ep, [model.example_inputs], top_k=100)
    json.dumps(report, allow_nan=False)
    assert report["vs_fp32"]["sqnr_db"] == "inf"
    assert report["vs_fp32"]["cosine"] == pytest.approx(1.0)
    assert report["vs_fp32"]["max_abs_error"] == 0.0
    assert len(report["worst_layers"]) == report["layers_compared"] == 7
    assert all(w["sqnr_db"] == "inf" for w in report["worst_layers"])


def test_top_k_and_empty_samples(
    cnn_pair: tuple[LoadedModel, torch.export.ExportedProgram, torch.export.ExportedProgram],
) -> None:
    model, ep, quantized = cnn_pair
    assert accuracy_report(ep, quantized, [model.example_inputs], top_k=0)["worst_layers"] == []
    with pytest.raises(ValueError, match="at least one sample"):
        accuracy_report(ep, quantized, [])


def test_one_pass_gives_the_fake_quant_outputs(
    cnn_pair: tuple[LoadedModel, torch.export.ExportedProgram, torch.export.ExportedProgram],
) -> None:
    """The per-layer capture rides on the pass that also yields the fake-quant reference: its
    outputs are the plain quantized module's, bit for bit, and the report is unchanged."""
    model, ep, quantized = cnn_pair
    samples = random_samples(model, num_samples=2, seed=5)
    report, outputs = accuracy_report_and_outputs(ep, quantized, samples, top_k=3)
    assert report == accuracy_report(ep, quantized, samples, top_k=3)
    with torch.no_grad():
        plain = [quantized.module()(*s) for s in samples]
    assert len(outputs) == 2
    for (got,), want in zip(outputs, plain, strict=True):
        assert torch.equal(got, want)


def test_given_fp32_outputs_replace_the_fp32_run_without_layers(
    cnn_pair: tuple[LoadedModel, torch.export.ExportedProgram, torch.export.ExportedProgram],
) -> None:
    model, ep, quantized = cnn_pair
    samples = random_samples(model, num_samples=2, seed=6)
    with torch.no_grad():
        stored = [(ep.module()(*s),) for s in samples]
    # The "fp32 program" passed is the quantized one: were it run, the SQNR would be infinite.
    report, _ = accuracy_report_and_outputs(
        quantized, quantized, samples, top_k=0, fp32_outputs=stored
    )
    assert report == accuracy_report(ep, quantized, samples, top_k=0)
    assert report["vs_fp32"]["sqnr_db"] != "inf"
    with pytest.raises(ValueError, match="fp32 outputs"):
        accuracy_report_and_outputs(ep, quantized, samples, fp32_outputs=stored[:1])


def test_layers_match_across_qnn_decompositions(tmp_path: Path) -> None:
    # QNN's quantizer decomposes scaled_dot_product_attention, and the re-export renames every
    # later node; layers must still pair with their true counterparts.
    model = load_model(str(save_tiny_llama(tmp_path / "llama")), seq_len=16)
    ep = export_program(model)
    calibration = make_calibration(model, num_samples=2, source=None, seed=1126)
    quantized = quantize_program(
        ep, target=Target(Backend.QNN, lookup_soc("SM8650")), recipe=Recipe.A16W8,
        calibration=calibration, progress=False,
    )
    report = accuracy_report(ep, quantized, calibration, top_k=1000)
    json.dumps(report, allow_nan=False)
    layers = report["worst_layers"]
    assert report["layers_compared"] == len(layers) > 20
    assert all(isinstance(w["sqnr_db"], float) and w["sqnr_db"] > 10.0 for w in layers)
    names = {w["layer"] for w in layers}
    assert "hf.model.layers.0.self_attn.q_proj" in names
    assert "hf.lm_head" in names
    assert "scaled_dot_product_attention" not in {w["op"] for w in layers}
    assert not math.isnan(report["vs_fp32"]["cosine"])
