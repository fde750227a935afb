"""Stage inputs refuse a missing source; outputs expose their files and metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common import stages
from qnn_common.config import CompileConfig, InferConfig, PrepareConfig, QuantizeConfig
from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.stages import (
    CompileInput,
    CompileOutput,
    InferInput,
    InferOutput,
    PrepareInput,
    PrepareOutput,
    QuantizeInput,
    QuantizeOutput,
)


def _manifest(metrics: dict[str, object] | None = None) -> Manifest:
    return Manifest(
        stage="s",
        package="p",
        package_version="0",
        config={},
        inputs={},
        files=(),
        tools={},
        cache_key="k",
        metrics=metrics or {},
    )


def test_quantize_input_refuses_missing_source(tmp_path: Path) -> None:
    missing = tmp_path / "prepare"
    with pytest.raises(ArtifactError) as info:
        QuantizeInput(source=missing, config=QuantizeConfig(), out_dir=tmp_path / "q")
    assert info.value.path == missing
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)


def test_compile_input_refuses_missing_source(tmp_path: Path) -> None:
    missing = tmp_path / "program.pt2"
    with pytest.raises(ArtifactError) as info:
        CompileInput(source=missing, config=CompileConfig(), out_dir=tmp_path / "c")
    assert info.value.path == missing
    assert "the program to compile does not exist" in str(info.value)


def test_infer_input_refuses_missing_source(tmp_path: Path) -> None:
    missing = tmp_path / "model.pte"
    with pytest.raises(ArtifactError) as info:
        InferInput(source=missing, config=InferConfig(), out_dir=tmp_path / "i")
    assert info.value.path == missing
    assert "the program to run does not exist" in str(info.value)


def test_inputs_accept_existing_directory_or_file(tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"pte")
    assert QuantizeInput(artifact, QuantizeConfig(), tmp_path / "q").source == artifact
    assert CompileInput(artifact, CompileConfig(), tmp_path / "c").source == artifact
    assert InferInput(pte, InferConfig(), tmp_path / "i").source == pte


def test_prepare_input_needs_no_source(tmp_path: Path) -> None:
    inp = PrepareInput(config=PrepareConfig(model="m"), out_dir=tmp_path / "absent")
    assert inp.out_dir == tmp_path / "absent"


def test_outputs_point_at_their_files(tmp_path: Path) -> None:
    m = _manifest()
    assert PrepareOutput(tmp_path, m).program == tmp_path / stages.PROGRAM
    assert QuantizeOutput(tmp_path, m).program == tmp_path / "methods" / "forward.pt2"
    assert CompileOutput(tmp_path, m).pte == tmp_path / stages.PTE == tmp_path / "model.pte"


def test_outputs_read_metrics(tmp_path: Path) -> None:
    m = _manifest({"accuracy": {"cosine": 0.99}, "latency_ms": {"p50": 1.5}})
    assert QuantizeOutput(tmp_path, m).accuracy == {"cosine": 0.99}
    out = InferOutput(tmp_path, m)
    assert out.latency_ms == {"p50": 1.5}
    assert out.accuracy == {"cosine": 0.99}
    empty = InferOutput(tmp_path, _manifest())
    assert empty.latency_ms == {}
    assert empty.accuracy == {}
    assert QuantizeOutput(tmp_path, _manifest()).accuracy == {}


def test_output_metrics_are_copies(tmp_path: Path) -> None:
    m = _manifest({"latency_ms": {"p50": 1.5}})
    out = InferOutput(tmp_path, m)
    out.latency_ms["p50"] = 99.0
    assert out.latency_ms == {"p50": 1.5}


def test_file_names_are_distinct() -> None:
    names = [
        stages.PROGRAM, stages.PTE, stages.CALIBRATION, stages.EVAL_INPUTS,
        stages.REFERENCE_FP32, stages.REFERENCE_FAKE_QUANT, stages.OUTPUTS,
        stages.TOKENIZER_DIR, stages.ETRECORD, stages.ETDUMP,
    ]
    assert len(set(names)) == len(names)
    assert "manifest.json" not in names
