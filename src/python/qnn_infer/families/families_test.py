"""The infer family is picked by the program kind the compile artifact records."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common.artifact import Artifact
from qnn_common.config import InferConfig
from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest, ProgramRecord
from qnn_common.stages import InferInput
from qnn_infer.families import FAMILIES, causal_lm, family_for, single


def _compiled(program: ProgramRecord | None) -> Manifest:
    return Manifest(
        stage="compile", package="qnn-compile", package_version="0", config={}, inputs={},
        files=(), tools={}, cache_key="k", program=program,
    )


def _input(tmp_path: Path) -> InferInput:
    pte = tmp_path / "model.pte"  # family_for reads the manifest it is given, not the file
    pte.touch()
    return InferInput(Artifact(pte), InferConfig(), tmp_path / "out")


@pytest.mark.parametrize(
    ("kind", "family"),
    [("causal-lm", causal_lm), ("text-encoder", single), ("vision", single), ("custom", single)],
)
def test_family_by_recorded_kind(tmp_path: Path, kind: str, family: object) -> None:
    record = ProgramRecord(kind, ("forward",))
    assert family_for(_input(tmp_path), _compiled(record)) is family


def test_bare_pte_is_one_method(tmp_path: Path) -> None:
    assert family_for(_input(tmp_path), None) is single
    assert family_for(_input(tmp_path), _compiled(None)) is single


def test_unknown_kind_refused_naming_the_kinds(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as info:
        family_for(_input(tmp_path), _compiled(ProgramRecord("audio", ("forward",))))
    reason = info.value.reason
    assert "'audio'" in reason
    assert ", ".join(sorted(FAMILIES)) in reason
    assert "qnn_quant/families/README.md" in reason
