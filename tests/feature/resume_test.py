"""Skipped stages, compile-only, and resuming midway from an artifact or a bare file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_pipeline.cli import main as pipeline_main


def _summary(out: Path) -> dict[str, Any]:
    data = json.loads((out / "summary.json").read_text())
    assert isinstance(data, dict)
    return data


def _status(summary: dict[str, Any]) -> dict[str, str]:
    return {s["name"]: s["status"] for s in summary["stages"]}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stop")
    assert pipeline_main(["--model", "tiny-cnn", "--out", str(out), "--stop-after", "compile",
                          "--calibration-samples", "4"]) == 0
    return out


def test_stop_after_compile_is_compile_only(compiled: Path) -> None:
    summary = _summary(compiled)
    assert _status(summary) == {"prepare": "ran", "quantize": "ran", "compile": "ran",
                                "infer": "skipped"}
    assert summary["pte_bytes"] and summary["latency_ms"] == {"p50": None, "p90": None}


def test_resume_from_the_quantize_artifact(compiled: Path, tmp_path: Path) -> None:
    stages = _summary(compiled)["stages"]
    quantized = next(s["artifact"] for s in stages if s["name"] == "quantize")
    assert pipeline_main(["--from", quantized, "--out", str(tmp_path), "--runs", "3"]) == 0
    summary = _summary(tmp_path)
    assert summary["recipe"] == "8a8w"
    assert _status(summary) == {"prepare": "skipped", "quantize": "skipped", "compile": "ran",
                                "infer": "ran"}
    assert float(summary["accuracy"]["sqnr_db_vs_fake_quant"]) > 30


def test_resume_from_a_bare_pt2(tmp_path: Path) -> None:
    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))

    torch.manual_seed(0)
    pt2 = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(Mlp(), (torch.randn(2, 8),)), pt2)
    inputs = tmp_path / "x.pt"
    torch.save(torch.randn(2, 8), inputs)
    out = tmp_path / "out"
    assert pipeline_main(["--from", str(pt2), "--out", str(out), "--stop-after", "compile"]) == 0
    summary = _summary(out)
    assert summary["recipe"] == "fp32"
    assert _status(summary)["compile"] == "ran"
