"""Stage inputs refuse a missing source; outputs expose their files and metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common import stages
from qnn_common.artifact import Artifact
from qnn_common.config import CompileConfig, InferConfig, PrepareConfig, QuantizeConfig
from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.stages import (
    CompileInput,
    InferInput,
    PrepareInput,
    QuantizeInput,
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
        QuantizeInput(source=Artifact(missing), config=QuantizeConfig(), out_dir=tmp_path / "q")
    assert info.value.path == missing
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)


def test_compile_input_refuses_missing_source(tmp_path: Path) -> None:
    missing = tmp_path / "program.pt2"
    with pytest.raises(ArtifactError) as info:
        CompileInput(source=Artifact(missing), config=CompileConfig(), out_dir=tmp_path / "c")
    assert info.value.path == missing
    assert "the program to compile does not exist" in str(info.value)


def test_infer_input_refuses_missing_source(tmp_path: Path) -> None:
    missing = tmp_path / "model.pte"
    with pytest.raises(ArtifactError) as info:
        InferInput(source=Artifact(missing), config=InferConfig(), out_dir=tmp_path / "i")
    assert info.value.path == missing
    assert "the program to run does not exist" in str(info.value)


def test_inputs_accept_existing_directory_or_file(tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"pte")
    source = Artifact(artifact, _manifest())
    assert QuantizeInput(source, QuantizeConfig(), tmp_path / "q").source.path == artifact
    assert CompileInput(source, CompileConfig(), tmp_path / "c").source.path == artifact
    assert InferInput(Artifact(pte), InferConfig(), tmp_path / "i").source.path == pte


def test_prepare_input_needs_no_source(tmp_path: Path) -> None:
    inp = PrepareInput(config=PrepareConfig(model="m"), out_dir=tmp_path / "absent")
    assert inp.out_dir == tmp_path / "absent"


def test_an_artifact_reads_its_metrics_as_copies(tmp_path: Path) -> None:
    m = _manifest({"accuracy": {"cosine": 0.99}, "latency_ms": {"p50": 1.5}})
    out = Artifact(tmp_path, m)
    assert out.metrics("accuracy") == {"cosine": 0.99}
    assert out.metrics("latency_ms") == {"p50": 1.5}
    out.metrics("latency_ms")["p50"] = 99.0
    assert out.metrics("latency_ms") == {"p50": 1.5}
    assert Artifact(tmp_path, _manifest()).metrics("accuracy") == {}
    assert out.sealed is m


def test_a_bare_file_is_an_artifact_without_a_manifest(tmp_path: Path) -> None:
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"pte")
    bare = Artifact.open(pte)
    assert bare == Artifact(pte) and bare.metrics("accuracy") == {}
    with pytest.raises(ArtifactError, match="is a bare file"):
        _ = bare.sealed
    with pytest.raises(ArtifactError, match="does not exist"):
        Artifact.open(tmp_path / "absent.pte")
    with pytest.raises(ArtifactError, match="open it with Artifact.open"):
        Artifact(tmp_path)  # a directory is never a bare file


def test_file_names_are_distinct() -> None:
    names = [
        stages.PROGRAM, stages.PTE, stages.CALIBRATION, stages.EVAL_INPUTS,
        stages.REFERENCE_FP32, stages.REFERENCE_FAKE_QUANT, stages.OUTPUTS,
        stages.TOKENIZER_DIR, stages.ETRECORD, stages.ETDUMP,
    ]
    assert len(set(names)) == len(names)
    assert "manifest.json" not in names
