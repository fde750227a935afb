"""Issue 27, classes 6 and 8 for our own file formats: a manifest or TOML file from outside.

A deeply nested manifest.json raised RecursionError (a traceback, and a cached directory holding
one failed every later run the same way); a 300 MB manifest was read whole; a deeply nested
TOML config raised RecursionError too. Each must be one clean error saying what to do.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.manifest import MANIFEST_NAME
from qnn_common.sealing import load_manifest
from qnn_pipeline.cli import main as pipeline_main
from support.pipeline_runs import TINY_CNN
from support.summary import read_summary, stage_statuses

DEPTH = 100_000


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    assert pipeline_main([*TINY_CNN, "--out", str(out), "--stop-after", "prepare"]) == 0
    return out


def _prepare_dir(out: Path) -> Path:
    return next(out.glob("prepare-*"))


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("[" * DEPTH + "]" * DEPTH, "nested"),
        ('{"format": "' + "x" * (64 * 2**20) + '"}', "MiB"),
    ],
    ids=["nested", "huge"],
)
def test_a_hostile_manifest_is_refused_in_one_message(
    prepared: Path, tmp_path: Path, content: str, reason: str
) -> None:
    artifact = shutil.copytree(_prepare_dir(prepared), tmp_path / "a")
    (artifact / MANIFEST_NAME).write_text(content, encoding="utf-8")
    with pytest.raises(ArtifactError) as info:
        load_manifest(artifact)
    assert info.value.path == artifact / MANIFEST_NAME and reason in info.value.reason


def test_a_cached_stage_with_a_nested_manifest_is_one_error_line(
    prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No traceback on this run or the next: a manifest that cannot be parsed does not prove the
    directory ours (as with any invalid JSON), so it is not replaced, and the error says what to
    do; once it is removed, the run is clean."""
    out = shutil.copytree(prepared, tmp_path / "out")
    stage = _prepare_dir(out)
    (stage / MANIFEST_NAME).write_text("[" * DEPTH + "]" * DEPTH, encoding="utf-8")
    assert pipeline_main([*TINY_CNN, "--out", str(out), "--stop-after", "prepare"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(stage) in lines[0] and "remove" in lines[0], err
    shutil.rmtree(stage)
    assert pipeline_main([*TINY_CNN, "--out", str(out), "--stop-after", "prepare"]) == 0
    assert stage_statuses(read_summary(out))["prepare"] == "ran"
    load_manifest(_prepare_dir(out))


def test_a_deeply_nested_toml_config_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "p.toml"
    config.write_text(
        '[pipeline]\nmodel = "tiny-cnn"\nx = ' + "[" * DEPTH + "]" * DEPTH + "\n",
        encoding="utf-8",
    )
    assert pipeline_main(["--config", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "nested" in lines[0] and str(config) in lines[0], err


def test_load_pipeline_toml_names_the_nesting(tmp_path: Path) -> None:
    from qnn_pipeline.context import load_pipeline_toml

    config = tmp_path / "p.toml"
    config.write_text("x = " + "[" * DEPTH + "]" * DEPTH + "\n", encoding="utf-8")
    with pytest.raises(ConfigValidationError, match="nested"):
        load_pipeline_toml(config)
