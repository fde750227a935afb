"""Issue 27, classes 3 and 4: what a run may touch in an output directory it does not own yet.

A lock file's name is ours to create and delete, so whatever else stands there (a symlink to a
user's file, a dangling one, a hard link, a FIFO, a directory) is refused, never written through.
`OUT/summary.json` is replaced only once the run is known to be valid, and only if it is a
summary this pipeline wrote: a user's own file of that name is left alone and named.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qnn_common.errors import ArtifactError
from qnn_common.store.artifact_lock import acquire_artifact_lock, lock_path, release_artifact_lock
from qnn_pipeline.cli import build_parser, context_from_args
from qnn_pipeline.cli import main as pipeline_main
from qnn_prepare.api import prepare_cache_key
from qnn_prepare.cli import main as prepare_main
from support.pipeline_runs import TINY_CNN, leftovers

USER_TEXT = "the user's own file: must survive\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir()
    path.write_text(USER_TEXT)
    return path


def _plant(kind: str, at: Path, victim: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        at.symlink_to(victim)
    elif kind == "dangling":
        at.symlink_to(victim.parent / "created-by-the-lock")
    elif kind == "hardlink":
        os.link(victim, at)
    elif kind == "fifo":
        os.mkfifo(at)
    else:
        at.mkdir()


@pytest.mark.parametrize("kind", ["symlink", "dangling", "hardlink", "fifo", "directory"])
def test_a_planted_lock_file_is_refused_never_written_through(
    tmp_path: Path, victim: Path, kind: str
) -> None:
    target = tmp_path / "out" / "prepare-0123456789ab"
    _plant(kind, lock_path(target), victim)
    with pytest.raises(ArtifactError) as info:
        acquire_artifact_lock(target)
    assert info.value.path == lock_path(target)
    assert "remove" in info.value.reason
    assert victim.read_text() == USER_TEXT
    assert not (victim.parent / "created-by-the-lock").exists()
    assert sorted(p.name for p in victim.parent.iterdir()) == ["precious.txt"]


def test_a_lock_file_of_our_own_still_works(tmp_path: Path) -> None:
    target = tmp_path / "out" / "prepare-0123456789ab"
    acquire_artifact_lock(target)
    assert lock_path(target).read_text() == str(os.getpid())
    release_artifact_lock(target)
    assert not lock_path(target).exists()


def test_pipeline_refuses_a_planted_stage_lock(
    tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's reproduction: OUT/.prepare-<key>.lock -> a user's file."""
    out = tmp_path / "out"
    argv = [*TINY_CNN, "--out", str(out)]
    key = prepare_cache_key(context_from_args(build_parser().parse_args(argv)).prepare)
    planted = out / f".prepare-{key[:12]}.lock"
    _plant("symlink", planted, victim)
    assert pipeline_main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {planted}: is a symbolic link" in err, err
    assert victim.read_text() == USER_TEXT
    assert planted.is_symlink()  # not ours: left as it was, for the user to look at


def test_a_stage_cli_refuses_a_planted_output_lock(
    tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-o DIR` locks `.DIR.lock` beside it: a dangling symlink there must not create its target."""
    out = tmp_path / "prep"
    _plant("dangling", lock_path(out), victim)
    argv = ["--model", "tiny-cnn", "-o", str(out), "--calibration-samples", "2", "-q"]
    assert prepare_main(argv) == 2
    assert f"error: {lock_path(out)}: is a symbolic link" in capsys.readouterr().err
    assert not (victim.parent / "created-by-the-lock").exists()
    assert not out.exists()


# --- 4. OUT/summary.json ----------------------------------------------------------------------


def test_an_invalid_run_touches_nothing_in_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's reproduction: `--model nonexistent --out userproj` deleted userproj's file."""
    out = tmp_path / "userproj"
    out.mkdir()
    (out / "summary.json").write_text(USER_TEXT)
    assert pipeline_main(["--model", "nonexistent", "--out", str(out)]) == 2
    assert "error: " in capsys.readouterr().err
    assert (out / "summary.json").read_text() == USER_TEXT
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


# The last: a user's own file with every key a summary has (issue 49, item 8: it was deleted).
FIVE_KEYS = '{"model": "m", "backend": "b", "recipe": "r", "stages": [], "accuracy": {}}'


@pytest.mark.parametrize("content", [USER_TEXT, '{"stages": "mine"}', "[1, 2]", FIVE_KEYS])
def test_a_summary_json_that_is_not_ours_is_refused_before_any_stage(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid run would overwrite it at the end: refused up front, with the path."""
    out = tmp_path / "userproj"
    out.mkdir()
    (out / "summary.json").write_text(content)
    assert pipeline_main([*TINY_CNN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {out / 'summary.json'}: exists and is not a summary" in err, err
    assert (out / "summary.json").read_text() == content
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    assert leftovers(out) == []


def test_a_summary_json_symlink_is_refused(
    tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "userproj"
    out.mkdir()
    (out / "summary.json").symlink_to(victim)
    assert pipeline_main([*TINY_CNN, "--out", str(out)]) == 2
    assert "is not a summary" in capsys.readouterr().err
    assert victim.read_text() == USER_TEXT
    assert (out / "summary.json").is_symlink()


def test_a_sweep_leaves_a_users_summary_json_in_its_artifact_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep removed `ARTIFACTS/summary.json` unread once its cells were done (issue 49)."""
    from qnn_pipeline.sweep_cli import sweep_main

    artifacts = tmp_path / "userproj"
    artifacts.mkdir()
    (artifacts / "summary.json").write_text(FIVE_KEYS)
    argv = ["--model", "tiny-cnn", "--backend", "portable", "--recipe", "fp32", "--jobs", "1",
            "--no-progress", "-q", "--out", str(tmp_path / "sweep"), "--artifacts", str(artifacts)]
    assert sweep_main(argv) == 2
    assert "is not a summary this pipeline wrote" in capsys.readouterr().err
    assert (artifacts / "summary.json").read_text() == FIVE_KEYS
