"""Skipped stages, compile-only, and resuming midway from an artifact or a bare file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qnn_pipeline.cli import main as pipeline_main
from support.summary import read_summary, stage_statuses


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stop")
    assert pipeline_main(["--model", "tiny-cnn", "--out", str(out), "--stop-after", "compile",
                          "--calibration-samples", "4"]) == 0
    return out


def test_stop_after_compile_is_compile_only(compiled: Path) -> None:
    summary = read_summary(compiled)
    assert stage_statuses(summary) == {"prepare": "ran", "quantize": "ran", "compile": "ran",
                                "infer": "skipped"}
    assert summary["pte_bytes"] and summary["latency_ms"] == {"p50": None, "p90": None}


def test_resume_from_the_quantize_artifact(compiled: Path, tmp_path: Path) -> None:
    stages = read_summary(compiled)["stages"]
    quantized = next(s["artifact"] for s in stages if s["name"] == "quantize")
    assert pipeline_main(["--from", quantized, "--out", str(tmp_path), "--runs", "3"]) == 0
    summary = read_summary(tmp_path)
    assert summary["recipe"] == "8a8w"
    assert stage_statuses(summary) == {
        "prepare": "skipped", "quantize": "skipped", "compile": "ran", "infer": "ran"
    }
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
    summary = read_summary(out)
    assert summary["recipe"] == "fp32"
    assert stage_statuses(summary)["compile"] == "ran"


def test_stage_clis_on_files_from_anywhere(tmp_path: Path) -> None:
    """compile takes any .pt2, infer any .pte (with --inputs): no upstream artifact needed."""
    from qnn_compile.cli import main as compile_main
    from qnn_infer.cli import main as infer_main

    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    pt2 = tmp_path / "conv.pt2"
    torch.export.save(torch.export.export(conv, (x,)), pt2)
    assert compile_main([str(pt2), "--backend", "xnnpack", "-o", str(tmp_path / "c")]) == 0
    inputs = tmp_path / "x.pt"
    torch.save(x, inputs)
    pte = tmp_path / "c" / "model.pte"
    assert infer_main([str(pte), "--inputs", str(inputs), "-o", str(tmp_path / "i"),
                       "--runs", "3"]) == 0
    (out,) = torch.load(tmp_path / "i" / "outputs.pt", weights_only=True)[0]
    with torch.no_grad():
        torch.testing.assert_close(out, conv(x), rtol=1e-4, atol=1e-5)


def test_each_stage_runs_alone_in_a_fresh_process(tmp_path: Path) -> None:
    """A stage CLI in its own process, on another process's artifact (nothing shared in memory:
    e.g. the quantized program's op libraries must be registered by the loader itself)."""
    import os
    import subprocess
    import sys

    # Imported here only so that the CLIs (and what they import) are this test's dependencies.
    from qnn_compile import cli as compile_cli
    from qnn_infer import cli as infer_cli
    from qnn_prepare import cli as prepare_cli
    from qnn_quant import cli as quant_cli

    paths = (os.path.abspath(p) for p in sys.path if p)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}

    def stage(module: str, *args: str) -> None:
        done = subprocess.run([sys.executable, "-m", module, *args], env=env, text=True,
                              capture_output=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]

    stage(prepare_cli.__name__, "--model", "tiny-cnn", "-o", str(tmp_path / "p"),
          "--calibration-samples", "2", "--eval-samples", "2")
    stage(quant_cli.__name__, str(tmp_path / "p"), "-o", str(tmp_path / "q"),
          "--report-layers", "0")
    stage(compile_cli.__name__, str(tmp_path / "q"), "-o", str(tmp_path / "c"))
    stage(infer_cli.__name__, str(tmp_path / "c"), "-o", str(tmp_path / "i"), "--runs", "2")
    infer = json.loads((tmp_path / "i" / "manifest.json").read_text())
    assert float(infer["metrics"]["accuracy"]["vs_fake_quant"]["sqnr_db"]) > 30
