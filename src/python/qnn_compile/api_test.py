"""The compile stage's cache key: from the upstream manifest's digest, without re-hashing."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common.artifact import Artifact
from qnn_common.config import CompileConfig, Stage
from qnn_common.errors import ArtifactError
from qnn_common.manifest import ProgramRecord
from qnn_common.sealing import write_manifest
from qnn_common.stages import PROGRAM
from qnn_common.store.hashing import clear_digest_memo, hashed_count
from qnn_compile.api import compile_cache_key


def _prepared(path: Path, content: bytes, stage: str = Stage.PREPARE) -> Path:
    (path / PROGRAM).parent.mkdir(parents=True)
    (path / PROGRAM).write_bytes(content)
    write_manifest(path, stage=stage, package="qnn-prepare", package_version="0",
                   config={"model": "x"}, inputs={}, files=[PROGRAM], cache_key="k",
                   program=ProgramRecord(kind="custom", methods=("forward",)))
    return path


def test_key_reads_the_manifest_not_the_files(tmp_path: Path) -> None:
    source = Artifact.open(_prepared(tmp_path / "prep", b"p" * (1 << 20)))  # verified once
    clear_digest_memo()
    before = hashed_count()
    key = compile_cache_key(CompileConfig(), source)
    assert hashed_count() == before  # keyed from the manifest it holds: no file read again
    other = _prepared(tmp_path / "prep2", b"q" * (1 << 20))
    assert compile_cache_key(CompileConfig(), Artifact.open(other)) != key


def test_key_still_checks_the_upstream_stage(tmp_path: Path) -> None:
    source = _prepared(tmp_path / "inf", b"p", stage=Stage.INFER)
    with pytest.raises(ArtifactError, match="expected prepare or quantize"):
        compile_cache_key(CompileConfig(), Artifact.open(source))
