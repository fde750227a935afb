"""Bad input gets one clear error naming the file, a non-zero exit, and no sealed artifact.

Each case runs the real CLI in-process on real artifacts of the tiny CNN.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from qnn_common.manifest import MANIFEST_NAME
from qnn_compile.cli import main as compile_main
from qnn_infer.cli import main as infer_main
from qnn_pipeline.cli import main as pipeline_main
from qnn_prepare.cli import main as prepare_main
from qnn_quant.cli import main as quant_main


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cnn")
    paths = {s: root / s for s in ("prepare", "quantize", "compile")}
    assert prepare_main(["--model", "tiny-cnn", "-o", str(paths["prepare"]),
                         "--calibration-samples", "4"]) == 0
    assert quant_main([str(paths["prepare"]), "-o", str(paths["quantize"])]) == 0
    assert compile_main([str(paths["quantize"]), "-o", str(paths["compile"])]) == 0
    return paths


def _sealed(path: Path) -> bool:
    return (path / MANIFEST_NAME).exists()


def test_missing_model_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no_such_model"
    out = tmp_path / "out"
    assert prepare_main(["--model", str(missing), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and str(missing) in err
    assert not _sealed(out)


def test_pt2_that_is_not_an_exported_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "model.pt2"
    torch.save({"weights": torch.ones(3)}, bogus)
    out = tmp_path / "out"
    assert compile_main([str(bogus), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(bogus) in err and "not an exported program" in err
    assert not _sealed(out)


def test_truncated_pte(
    artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pte = (artifacts["compile"] / "model.pte").read_bytes()
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(pte[: len(pte) // 2])
    inputs = tmp_path / "inputs.pt"
    torch.save(torch.randn(1, 3, 32, 32), inputs)
    out = tmp_path / "out"
    assert infer_main([str(truncated), "--inputs", str(inputs), "-o", str(out)]) == 2
    assert str(truncated) in capsys.readouterr().err
    assert not _sealed(out)


def test_manifest_hash_mismatch_is_refused(
    artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tampered = tmp_path / "prepare"
    shutil.copytree(artifacts["prepare"], tampered)
    data = bytearray((tampered / "calibration.pt").read_bytes())
    data[-10] ^= 0xFF  # same size, different content
    (tampered / "calibration.pt").write_bytes(bytes(data))
    out = tmp_path / "out"
    assert quant_main([str(tampered), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "calibration.pt" in err and "sha256" in err
    assert not _sealed(out)


def test_recipe_the_backend_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = pipeline_main(["--model", "tiny-cnn", "--recipe", "16a4w", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "xnnpack cannot run it" in err and "8a8w" in err
    assert not any(tmp_path.iterdir())  # rejected before any work


def test_inputs_file_of_the_wrong_shape(
    artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "inputs.pt"
    torch.save(torch.randn(1, 3, 16, 16), inputs)
    out = tmp_path / "out"
    assert infer_main([str(artifacts["compile"]), "--inputs", str(inputs), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(inputs) in err and "[1, 3, 32, 32]" in err
    assert not _sealed(out)


def test_foreign_directory_is_not_an_artifact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / MANIFEST_NAME).write_text(json.dumps({"hello": "world"}))
    assert compile_main([str(foreign), "-o", str(tmp_path / "out")]) == 2
    assert "not a qnn-pipeline-artifact manifest" in capsys.readouterr().err


def test_compile_refuses_a_recipe_other_than_the_quantized_one(
    artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = compile_main([str(artifacts["quantize"]), "--recipe", "fp32", "-o", str(tmp_path)])
    assert code == 2
    assert "--recipe 8a8w" in capsys.readouterr().err
