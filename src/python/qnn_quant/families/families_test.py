"""The quantize family is picked by the program kind prepare recorded, not by guessing."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common.errors import ArtifactError
from qnn_common.llm_spec import LlmSpec
from qnn_common.manifest import Manifest, ProgramRecord
from qnn_quant.families import FAMILIES, causal_lm, family_for, single

LLM = LlmSpec(max_seq_len=16, prefill_len=4, vocab_size=32).to_json()


def _prepared(program: ProgramRecord | None) -> Manifest:
    return Manifest(
        stage="prepare", package="qnn-prepare", package_version="0", config={}, inputs={},
        files=(), tools={}, cache_key="k", program=program,
    )


@pytest.mark.parametrize(
    ("record", "family"),
    [
        (ProgramRecord("causal-lm", ("prefill", "decode"), LLM), causal_lm),
        # Prepared without a KV cache: one logits method, which the causal-LM family hands on.
        (ProgramRecord("causal-lm", ("forward",)), causal_lm),
        (ProgramRecord("text-encoder", ("forward",)), single),
        (ProgramRecord("vision", ("forward",)), single),
        (ProgramRecord("custom", ("forward",)), single),
    ],
)
def test_family_by_recorded_kind(tmp_path: Path, record: ProgramRecord, family: object) -> None:
    assert family_for(tmp_path, _prepared(record)) is family


def test_unknown_kind_refused_naming_the_kinds(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as info:
        family_for(tmp_path, _prepared(ProgramRecord("audio", ("forward",))))
    reason = info.value.reason
    assert "'audio'" in reason
    assert ", ".join(sorted(FAMILIES)) in reason
    assert "qnn_quant/families/README.md" in reason


@pytest.mark.parametrize("kind", ["vision", "causal-lm"])
def test_methods_without_llm_record_refused(tmp_path: Path, kind: str) -> None:
    with pytest.raises(ArtifactError, match="holds the methods a, b and no causal-LM record"):
        family_for(tmp_path, _prepared(ProgramRecord(kind, ("a", "b"))))


def test_no_program_record_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="records no program"):
        family_for(tmp_path, _prepared(None))
