"""Issue 27, class 9: misleading messages, and a cache key that followed a setting that did nothing.

Each test reproduces what the issue saw with the real CLIs or library calls: a sweep printing
another sweep's table, a seed refused deep inside infer instead of at its flag, `-o` onto a
symlink called "not a directory", symlinks inside an artifact judged by what they point to, a
full disk reported without a path, and greedy decoding keyed on the sampler's seed.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qnn_common.artifact import Artifact
from qnn_common.config import InferConfig
from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.llm_spec import GenerationConfig
from qnn_common.sealing import load_manifest, write_manifest
from qnn_common.store.artifact_dir import check_output_dir
from qnn_infer import cli as infer_cli
from qnn_infer.api import infer_cache_key
from qnn_pipeline import sweep_report
from qnn_pipeline.cli import main as pipeline_main
from qnn_prepare.cli import main as prepare_main

# --- two sweeps into one --out ---------------------------------------------------------------


def test_a_sweep_prints_its_own_table_not_the_last_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The race, made deterministic: a second sweep writes sweep.md right after this one."""
    real = sweep_report.write_reports

    def then_another_sweep_writes(*args: Any) -> Any:
        written = real(*args)
        (tmp_path / "out" / sweep_report.MARKDOWN_NAME).write_text("| another sweep's table |\n")
        return written

    monkeypatch.setattr(sweep_report, "write_reports", then_another_sweep_writes)
    code = pipeline_main(["sweep", "--model", "tiny-cnn", "--backend", "portable", "--recipe",
                          "fp32", "--runs", "1", "--calibration-samples", "2", "--jobs", "1",
                          "--no-progress", "--out", str(tmp_path / "out")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| tiny-cnn | portable | fp32 | ok |" in printed and "another sweep" not in printed


# --- --sample-seed ----------------------------------------------------------------------------


def test_an_out_of_range_seed_fails_at_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        infer_cli.main(["x.pte", "--prompt", "Hi", "--sample-seed", str(10**23)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --sample-seed: '100000000000000000000000' is not a whole number in " \
           "[0, 2**64)" in err, err


@pytest.mark.parametrize("seed", [-1, 2**64, 10**23, True])
def test_an_out_of_range_seed_in_a_config_names_its_field(seed: object) -> None:
    with pytest.raises(ConfigValidationError) as info:
        GenerationConfig(temperature=0.7, seed=seed)  # type: ignore[arg-type]  # a TOML value
    assert info.value.field == "generation.seed"


# --- greedy decoding and the infer cache ------------------------------------------------------


def test_greedy_decoding_is_not_keyed_on_the_sampler(tmp_path: Path) -> None:
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"a program's bytes: only their digest is keyed")

    def key(**generation: Any) -> str:
        config = InferConfig(generation=GenerationConfig(**generation))
        return infer_cache_key(config, Artifact.open(pte))

    assert key(seed=1) == key(seed=2) == key(seed=2, top_k=5, top_p=0.5) == key()
    assert key(temperature=0.8, seed=1) != key(temperature=0.8, seed=2)
    assert GenerationConfig(seed=7).seed == 0  # what a greedy run records: the seed was unused


# --- -o onto a symlink ------------------------------------------------------------------------


def test_an_output_symlink_to_a_directory_is_called_a_symlink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert prepare_main(["--model", "tiny-cnn", "-o", str(link), "--calibration-samples", "2",
                         "-q"]) == 2
    err = capsys.readouterr().err
    assert f"error: {link}: is a symbolic link (to a directory)" in err, err
    assert f"-o {real}" in err and "not a directory" not in err
    assert list(real.iterdir()) == []


# --- symlinks inside an artifact --------------------------------------------------------------


def _seal(directory: Path, files: list[str]) -> None:
    write_manifest(directory, stage="prepare", package="qnn-prepare", package_version="0",
                   config={}, inputs={}, files=files, cache_key="k" * 64)


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    art = tmp_path / "art"
    (art / "tokenizer").mkdir(parents=True)
    (art / "a.pt").write_bytes(b"a")
    (art / "tokenizer" / "vocab.json").write_text("{}")
    _seal(art, ["a.pt", "tokenizer/vocab.json"])
    load_manifest(art)
    return art


@pytest.mark.parametrize("to", ["file", "directory"])
def test_a_symlink_inside_an_artifact_is_refused_whatever_it_points_to(
    artifact: Path, tmp_path: Path, to: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.bin").write_bytes(b"x")
    link = artifact / "extra"
    link.symlink_to(outside if to == "directory" else outside / "x.bin")
    with pytest.raises(ArtifactError, match="is a symbolic link") as info:
        load_manifest(artifact)
    assert info.value.path == link


def test_a_listed_file_reached_through_a_symlink_is_refused(
    artifact: Path, tmp_path: Path
) -> None:
    """Same bytes, so every hash matches: the manifest still vouches only for its own files."""
    shutil.move(artifact / "tokenizer", tmp_path / "tokenizer")
    (artifact / "tokenizer").symlink_to(tmp_path / "tokenizer")
    with pytest.raises(ArtifactError, match="is a symbolic link") as info:
        load_manifest(artifact)
    assert info.value.path == artifact / "tokenizer"
    with pytest.raises(ArtifactError, match="is a symbolic link"):
        _seal(artifact, ["a.pt", "tokenizer/vocab.json"])


def test_check_output_dir_names_a_dangling_symlink(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ArtifactError, match=r"is a symbolic link \(to nothing\)"):
        check_output_dir(tmp_path / "link")


# --- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a real ENOSPC. Needs the right to mount (root); skipped otherwise."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        # Lazy: a file the code under test still holds open (a lock) must not keep it mounted.
        with contextlib.suppress(OSError):
            subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_names_the_file_being_written(
    full_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = full_disk / "prepare"
    assert prepare_main(["--model", "tiny-cnn", "-o", str(out), "--calibration-samples", "2",
                         "-q"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "No space left on device" in errors[0] and f"{full_disk}/" in errors[0], errors[0]
    assert "the disk is full" in errors[0]
    assert [p.name for p in full_disk.iterdir()] == []  # nothing half-written left
