"""Issue 9, classes 1, 2, 3, 4 and 6: trust nothing we did not make.

Each test reproduces what a hostile or careless user did (a crafted .pt2, -o onto the input, an
edited manifest, two runs into one --out, a killed run's leftovers) and checks it is refused or
harmless, with the path and the reason, and that nothing else was touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.errors import ArtifactError
from qnn_common.manifest import MANIFEST_NAME
from qnn_common.sealing import load_manifest, manifest_digest, write_manifest
from qnn_common.stages import PROGRAM
from qnn_common.store.artifact_dir import begin_artifact, check_output_dir
from qnn_common.store.artifact_lock import acquire_artifact_lock, lock_path, release_artifact_lock
from qnn_common.torchio.programs import load_program
from qnn_compile.cli import main as compile_main
from qnn_infer.cli import main as infer_main
from qnn_pipeline.cli import main as pipeline_main
from qnn_pipeline.summary import SUMMARY_FORMAT
from qnn_prepare.cli import main as prepare_main
from qnn_quant.cli import main as quant_main
from support.crafted_pt2 import VARIANTS, craft, save_plain_program
from support.pipeline_runs import (
    TINY_CNN,
    child_env,
    file_digests,
    leftovers,
    pipeline_command,
    sealed_artifacts,
)
from support.summary import read_summary, stage_statuses


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted tiny-cnn pipeline run; tests copy its artifacts before abusing them."""
    out = tmp_path_factory.mktemp("run")
    assert pipeline_main([*TINY_CNN, "--out", str(out)]) == 0
    return out


def _stage_dir(out: Path, stage: str) -> Path:
    stages = read_summary(out)["stages"]
    return Path(next(s["artifact"] for s in stages if s["name"] == stage))


def _copy(run: Path, stage: str, dst: Path) -> Path:
    shutil.copytree(_stage_dir(run, stage), dst)
    return dst


def _edit_manifest(artifact: Path, **changes: object) -> None:
    raw = json.loads((artifact / MANIFEST_NAME).read_text())
    raw.update(changes)
    (artifact / MANIFEST_NAME).write_text(json.dumps(raw, indent=2))


# --- 1. untrusted .pt2 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "plain.pt2"
    save_plain_program(path)
    return path


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_crafted_archive_is_a_real_exploit(
    plain_pt2: Path, tmp_path: Path, variant: str
) -> None:
    """The reproduction: torch.export.load itself runs each planted payload."""
    marker = tmp_path / "marker"
    evil = craft(plain_pt2, tmp_path / "evil.pt2", variant, marker)
    # Some variants fail after the payload ran; that it ran is the point.
    with contextlib.suppress(Exception):
        torch.export.load(evil)
    assert marker.exists(), "the crafted archive no longer exploits torch.export.load"


@pytest.mark.parametrize("variant", VARIANTS)
def test_load_program_refuses_a_payload_without_running_it(
    plain_pt2: Path, tmp_path: Path, variant: str
) -> None:
    marker = tmp_path / "marker"
    evil = craft(plain_pt2, tmp_path / "evil.pt2", variant, marker)
    with pytest.raises(ArtifactError) as info:
        load_program(evil)
    assert info.value.path == evil and "could run code" in info.value.reason
    assert not marker.exists()
    assert isinstance(load_program(plain_pt2), torch.export.ExportedProgram)  # honest: loads


def test_compile_and_pipeline_refuse_a_crafted_pt2(
    plain_pt2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The variant that compiled normally with exit 0: now an error, no payload, no artifact."""
    marker = tmp_path / "marker"
    evil = craft(plain_pt2, tmp_path / "evil.pt2", "sample_inputs", marker)
    assert compile_main([str(evil), "--backend", "xnnpack", "-o", str(tmp_path / "c")]) != 0
    assert pipeline_main(["--from", str(evil), "--out", str(tmp_path / "p")]) != 0
    err = capsys.readouterr().err
    assert err.count(f"error: {evil}") + err.count(f"{evil}: data/sample_inputs") >= 2, err
    assert not marker.exists()
    assert not (tmp_path / "c").exists()
    assert not list((tmp_path / "p").glob("compile-*"))


# --- 2. output directories --------------------------------------------------------------------


def test_compile_and_infer_onto_their_input_are_refused(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quant = _copy(run, "quantize", tmp_path / "q")
    comp = _copy(run, "compile", tmp_path / "c")
    before = {d: manifest_digest(d) for d in (quant, comp)}
    assert compile_main([str(quant), "-o", str(quant)]) != 0
    assert infer_main([str(comp), "-o", str(comp), "--runs", "1"]) != 0
    err = capsys.readouterr().err
    assert f"{quant}: is the input" in err and f"{comp}: is the input" in err
    for d, digest in before.items():  # intact, every hash verified
        load_manifest(d)
        assert manifest_digest(d) == digest


def test_output_around_or_inside_the_input_is_refused(run: Path, tmp_path: Path) -> None:
    quant = _copy(run, "quantize", tmp_path / "work" / "q")
    with pytest.raises(ArtifactError, match="contains the input"):
        check_output_dir(tmp_path / "work", [quant])
    with pytest.raises(ArtifactError, match="lies inside the input"):
        check_output_dir(quant / "sub", [quant])
    with pytest.raises(ArtifactError, match="is the input"):
        check_output_dir(quant / PROGRAM, [quant / PROGRAM])


def test_prepare_into_a_user_directory_leaves_it_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = tmp_path / "userdir"
    (user / "tokenizer").mkdir(parents=True)
    files = {
        "manifest.json": '{"my": "own file"}',
        "notes.txt": "mine",
        "tokenizer/vocab.txt": "also mine",
    }
    for name, text in files.items():
        (user / name).write_text(text)
    assert prepare_main(["--model", "tiny-cnn", "-o", str(user)]) != 0
    assert "not an artifact of this pipeline" in capsys.readouterr().err
    assert {
        str(p.relative_to(user)): p.read_text() for p in user.rglob("*") if p.is_file()
    } == files


def test_an_artifact_of_ours_is_replaced_whole(run: Path, tmp_path: Path) -> None:
    """-o naming an older artifact of ours: replaced by the new one, nothing of the old kept."""
    quant = _copy(run, "quantize", tmp_path / "q")
    target = _copy(run, "prepare", tmp_path / "target")  # another stage's artifact
    assert compile_main([str(quant), "-o", str(target)]) == 0
    assert load_manifest(target).stage == "compile"
    assert not (target / PROGRAM).exists()
    assert leftovers(tmp_path) == []


# --- 3. the manifest vouches only for what it checks ------------------------------------------


def test_a_file_the_manifest_does_not_list_is_never_read(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported case: a program present in a quantize artifact but not listed."""
    quant = _copy(run, "quantize", tmp_path / "q")
    m = load_manifest(quant)
    forged = dataclasses.replace(m, files=tuple(f for f in m.files if f.path != PROGRAM)).sealed()
    (quant / MANIFEST_NAME).write_text(forged.to_json())  # a well-formed, self-consistent seal
    assert compile_main([str(quant), "-o", str(tmp_path / "c")]) != 0
    assert f"{quant / PROGRAM}: is not listed" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    (quant / "extra.pt2").write_bytes(b"dropped in")
    with pytest.raises(ArtifactError, match="extra.pt2: is not listed"):
        load_manifest(quant)


def test_an_edited_manifest_is_refused(run: Path, tmp_path: Path) -> None:
    quant = _copy(run, "quantize", tmp_path / "q")
    raw = json.loads((quant / MANIFEST_NAME).read_text())
    raw["metrics"]["accuracy"]["vs_fp32"]["sqnr_db"] = 120.0
    _edit_manifest(quant, metrics=raw["metrics"])
    with pytest.raises(ArtifactError, match="edited after the stage sealed it"):
        load_manifest(quant)


def test_a_cached_artifact_must_reproduce_its_cache_key(run: Path, tmp_path: Path) -> None:
    """Even resealed consistently, a changed config no longer reproduces the key it claims."""
    quant = _copy(run, "quantize", tmp_path / "q")
    m = load_manifest(quant)
    assert load_manifest(quant, expect_cache_key=m.cache_key) == m
    forged = dataclasses.replace(m, config={**m.config, "recipe": "16a8w"}).sealed()
    (quant / MANIFEST_NAME).write_text(forged.to_json())
    with pytest.raises(ArtifactError, match="do not reproduce its cache key"):
        load_manifest(quant, expect_cache_key=m.cache_key)


def test_the_pipeline_reruns_a_stage_whose_manifest_was_edited(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(run, out)
    quant = out / _stage_dir(run, "quantize").name
    true_sqnr = read_summary(run)["accuracy"]["fake_quant_sqnr_db_vs_fp32"]
    raw = json.loads((quant / MANIFEST_NAME).read_text())
    raw["metrics"]["accuracy"]["vs_fp32"]["sqnr_db"] = 120.0
    _edit_manifest(quant, metrics=raw["metrics"])
    assert pipeline_main([*TINY_CNN, "--out", str(out)]) == 0
    summary = read_summary(out)
    # Rerun, same bytes, same identity: compile and infer stay cached.
    assert stage_statuses(summary) == {
        "prepare": "cached",
        "quantize": "ran",
        "compile": "cached",
        "infer": "cached",
    }
    assert summary["accuracy"]["fake_quant_sqnr_db_vs_fp32"] == true_sqnr != 120.0


# --- 4. reproducible bytes and one writer per directory ---------------------------------------


def test_same_inputs_give_the_same_bytes(run: Path, tmp_path: Path) -> None:
    """Quantizing again (new graph objects, so other memory addresses) gives identical files."""
    prep, quant = _stage_dir(run, "prepare"), _stage_dir(run, "quantize")
    assert quant_main([str(prep), "-o", str(tmp_path / "q")]) == 0
    assert file_digests(tmp_path / "q") == file_digests(quant)
    assert manifest_digest(tmp_path / "q") == manifest_digest(quant)


def test_compiling_alone_gives_the_chained_runs_bytes(run: Path, tmp_path: Path) -> None:
    """The chained run handed the quantized program to compile in memory (programs.SavedProgram);
    compiling its sealed file alone, a fresh load, gives the same .pte. (Quantize alone: the
    test above.)"""
    quant, comp = _stage_dir(run, "quantize"), _stage_dir(run, "compile")
    assert compile_main([str(quant), "-o", str(tmp_path / "c")]) == 0
    assert file_digests(tmp_path / "c") == file_digests(comp)


def test_a_chained_run_loads_no_program_it_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.export.pt2_archive import _package  # what load_program deserializes with

    loads: list[object] = []
    real_load = _package.load_pt2

    def counting_load(*args: Any, **kwargs: Any) -> _package.PT2ArchiveContents:
        loads.append(args)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(_package, "load_pt2", counting_load)
    assert pipeline_main([*TINY_CNN, "--out", str(tmp_path / "out")]) == 0
    assert loads == []
    # Resumed from the quantized artifact, compile has nothing in memory: it reads the file.
    assert pipeline_main(["--from", str(_stage_dir(tmp_path / "out", "quantize")),
                          "--out", str(tmp_path / "resumed"), "--runs", "3"]) == 0
    assert len(loads) == 1


def test_concurrent_runs_into_one_out_wait_and_reuse(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = pipeline_command(out, "--stop-after", "quantize")
    children = [
        subprocess.Popen(
            cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [child.communicate(timeout=600) for child in children]
    for child, (_, err) in zip(children, results, strict=True):
        assert child.returncode == 0, err[-3000:]
        assert "modified" not in err
    artifacts = sealed_artifacts(out)
    assert sorted(n.split("-")[0] for n in artifacts) == ["prepare", "quantize"]
    assert leftovers(out) == []
    # Each child's stage table: every stage ran in one child and was reused by the other.
    tables = [dict(re.findall(r"(?m)^(prepare|quantize)\s+(ran|cached)\b", o)) for o, _ in results]
    for stage in ("prepare", "quantize"):
        assert sorted(t.get(stage, "?") for t in tables) == ["cached", "ran"], results


def test_a_lock_dies_with_its_holder(tmp_path: Path) -> None:
    """kill -9 never leaves a directory locked: the kernel drops the flock with the process."""
    target = tmp_path / "prepare-abc"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from qnn_common.store.artifact_lock import acquire_artifact_lock\n"
            f"acquire_artifact_lock(__import__('pathlib').Path({str(target)!r}))\n"
            "print('locked', flush=True)\ntime.sleep(600)",
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert lock_path(target).read_text() == str(holder.pid)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    acquire_artifact_lock(target)
    release_artifact_lock(target)
    assert not lock_path(target).exists()


# --- 6. leftovers -----------------------------------------------------------------------------


def _seal(directory: Path, files: list[str]) -> None:
    write_manifest(
        directory,
        stage="prepare",
        package="qnn-prepare",
        package_version="0",
        config={},
        inputs={},
        files=files,
        cache_key="k" * 64,
    )


def test_sealing_sweeps_temp_files_and_refuses_unlisted_ones(tmp_path: Path) -> None:
    staging = begin_artifact(tmp_path / "art")
    (staging / "a.pt").write_bytes(b"a")
    (staging / ".a.k3j4h5g6.tmp.pt").write_bytes(b"half a write, orphaned by kill -9")
    (staging / "stray.bin").write_bytes(b"not listed")
    with pytest.raises(ArtifactError, match="stray.bin: is in the artifact directory but not"):
        _seal(staging, ["a.pt"])
    (staging / "stray.bin").unlink()
    _seal(staging, ["a.pt"])
    assert sorted(p.name for p in (tmp_path / "art").iterdir()) == ["a.pt", MANIFEST_NAME]
    assert leftovers(tmp_path) == []


def test_leftovers_of_a_killed_writer_are_swept(tmp_path: Path) -> None:
    final = tmp_path / "prepare-abc"
    for name in (".prepare-abc.staging-x1y2z3", ".prepare-abc.replaced-q9w8e7"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "program.pt2").write_bytes(b"partial")
    staging = begin_artifact(final)
    assert leftovers(tmp_path) == [".prepare-abc.lock", staging.name]
    (staging / "x").write_bytes(b"x")
    _seal(staging, ["x"])
    assert leftovers(tmp_path) == []
    assert load_manifest(final).file("x") is not None


def test_a_failed_run_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No empty stage directory, no staging or lock file, and no previous run's summary."""
    (tmp_path / "broken_model.py").write_text(
        "def make():\n    raise ValueError('this model cannot be built')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    # A previous run's summary (one of ours: a user's own file of that name is refused instead).
    previous = {"format": SUMMARY_FORMAT, "model": "m", "backend": "xnnpack", "recipe": "8a8w",
                "stages": [], "accuracy": {}}
    (out / "summary.json").write_text(json.dumps(previous))
    assert pipeline_main(["--model", "broken_model:make", "--out", str(out)]) != 0
    assert sorted(p.name for p in out.iterdir()) == []
