"""The error hierarchy: one base to catch, messages that say what and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common.errors import (
    ArtifactError,
    BackendNotAvailableError,
    ConfigValidationError,
    PipelineError,
    StageError,
)


def test_one_except_catches_every_error_and_bad_config_is_a_value_error() -> None:
    raised = [ConfigValidationError("a.b", 1, "bad"), BackendNotAvailableError("qnn", "no SDK"),
              ArtifactError("out", "no manifest"), StageError("compile", "failed")]
    for err in raised:
        with pytest.raises(PipelineError):
            raise err
    with pytest.raises(ValueError):  # what argparse-style callers catch
        raise raised[0]


def test_config_validation_error_fields_and_message() -> None:
    err = ConfigValidationError("quantize.recipe", "9a9w", "unknown recipe", ("8a8w", "16a4w"))
    assert err.field == "quantize.recipe"
    assert err.value == "9a9w"
    assert err.reason == "unknown recipe"
    assert err.allowed == ("8a8w", "16a4w")
    assert str(err) == "quantize.recipe: '9a9w' is invalid: unknown recipe (allowed: 8a8w, 16a4w)"


def test_config_validation_error_without_allowed() -> None:
    err = ConfigValidationError("infer.runs", 0, "must be an integer >= 1")
    assert err.allowed is None
    assert str(err) == "infer.runs: 0 is invalid: must be an integer >= 1"
    assert "allowed" not in str(err)


def test_config_validation_error_empty_allowed_is_not_listed() -> None:
    assert "allowed" not in str(ConfigValidationError("x", 1, "bad", ()))


def test_artifact_error_carries_path_and_reason() -> None:
    err = ArtifactError("out/prepare", "no manifest.json")
    assert err.path == Path("out/prepare")
    assert isinstance(err.path, Path)
    assert err.reason == "no manifest.json"
    assert str(err) == "out/prepare: no manifest.json"


def test_stage_error_carries_stage_and_chains_cause() -> None:
    cause = RuntimeError("kernel missing")
    err = StageError("compile", "lowering failed", cause)
    assert err.stage == "compile"
    assert err.message == "lowering failed"
    assert str(err) == "[compile] lowering failed"
    assert err.__cause__ is cause


def test_stage_error_without_cause() -> None:
    err = StageError("infer", "no device")
    assert err.__cause__ is None


def test_stage_error_cause_survives_raise() -> None:
    def fail() -> None:
        try:
            raise KeyError("k")
        except KeyError as inner:
            raise StageError("quantize", "calibration failed", inner)  # noqa: B904

    with pytest.raises(StageError) as info:
        fail()
    assert isinstance(info.value.__cause__, KeyError)
    assert info.value.stage == "quantize"


def test_stage_error_cause_is_kept_when_raised_outside_except() -> None:
    cause = OSError("disk full")
    with pytest.raises(StageError) as info:
        raise StageError("compile", "could not write model.pte", cause)
    assert info.value.__cause__ is cause


def test_catching_pipeline_error_catches_all() -> None:
    errors: list[PipelineError] = [
        ConfigValidationError("f", 1, "r"),
        BackendNotAvailableError("qnn sdk missing"),
        ArtifactError(Path("x"), "gone"),
        StageError("prepare", "boom"),
    ]
    for e in errors:
        with pytest.raises(PipelineError):
            raise e
