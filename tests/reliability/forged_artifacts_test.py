"""Issue 27, class 7: silent wrong results from a re-sealed artifact or a dropped setting.

A manifest's digest is integrity against accidents, not authenticity: anyone can re-seal a
compile artifact around another program. What the program itself can tell (its size, its
delegates) is checked against what the manifest claims. A generation prompt given to a run that
cannot generate is an error, not silently dropped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qnn_common.stages import PTE
from qnn_infer.cli import main as infer_main
from qnn_pipeline.cli import main as pipeline_main
from support.pipeline_runs import TINY_CNN, leftovers
from support.pte_variants import reseal
from support.summary import read_summary


def _stage_dir(out: Path, stage: str) -> Path:
    return Path(next(s["artifact"] for s in read_summary(out)["stages"] if s["name"] == stage))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tiny-cnn 8a8w (the default) and fp32 (--skip quantize), each a full pipeline run."""
    root = tmp_path_factory.mktemp("runs")
    assert pipeline_main([*TINY_CNN, "--out", str(root / "a8w8"), "-q"]) == 0
    assert pipeline_main([*TINY_CNN, "--out", str(root / "fp32"), "--skip", "quantize", "-q"]) == 0
    return root / "a8w8", root / "fp32"


def _forge(compile_dir: Path, program: Path) -> None:
    """The issue's forgery: another program in the artifact, the manifest re-sealed."""
    shutil.copyfile(program, compile_dir / PTE)
    reseal(compile_dir, PTE)


def test_qnn_infer_refuses_a_compile_artifact_resealed_around_another_program(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a8w8, fp32 = runs
    forged = tmp_path / "compile"
    shutil.copytree(_stage_dir(a8w8, "compile"), forged)
    fp32_pte = _stage_dir(fp32, "compile") / PTE
    _forge(forged, fp32_pte)
    assert infer_main([str(forged), "-o", str(tmp_path / "infer"), "-q"]) == 2
    err = capsys.readouterr().err
    recorded = (_stage_dir(a8w8, "compile") / PTE).stat().st_size
    assert f"error: {forged / PTE}: is not the program its manifest describes (it is " \
           f"{fp32_pte.stat().st_size:,} bytes, the manifest records {recorded:,})" in err, err
    assert "guards against accidents, not forgery" in err
    assert not (tmp_path / "infer").exists() and leftovers(tmp_path) == []


def test_the_pipeline_recompiles_a_forged_compile_artifact_instead_of_reporting_it_cached(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    a8w8, fp32 = runs
    out = tmp_path / "out"
    shutil.copytree(a8w8, out)
    compile_dir = out / _stage_dir(a8w8, "compile").name
    _forge(compile_dir, _stage_dir(fp32, "compile") / PTE)
    assert pipeline_main([*TINY_CNN, "--out", str(out), "-q"]) == 0
    summary = read_summary(out)
    statuses = {s["name"]: s["status"] for s in summary["stages"]}
    # Recompiled, the program is the original again, so the infer artifact made from it is
    # reused: the numbers it reports are the 8a8w program's.
    assert statuses["compile"] == "ran" and statuses["infer"] == "cached", statuses
    assert summary["recipe"] == "8a8w"
    assert summary["pte_bytes"] == (compile_dir / PTE).stat().st_size
    assert (compile_dir / PTE).read_bytes() == (_stage_dir(a8w8, "compile") / PTE).read_bytes()


def test_a_toml_prompt_for_a_model_that_is_no_causal_lm_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue ran a 1 MB prompt as a plain forward and exited 0. A generation section implies
    the KV-cache export (as --prompt does), which a CNN cannot have."""
    config = tmp_path / "pipeline.toml"
    config.write_text('[pipeline]\nmodel = "tiny-cnn"\n\n[infer.generation]\nprompt = "Hi"\n')
    out = tmp_path / "out"
    assert pipeline_main(["--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'tiny-cnn' is invalid: a KV-cache export (--prompt, kv_cache) needs a causal LM" \
        in err, err
    assert not out.exists()


def test_a_prompt_for_a_program_that_cannot_generate_is_an_error(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    compile_dir = _stage_dir(runs[0], "compile")
    assert infer_main([str(compile_dir), "-o", str(tmp_path / "infer"), "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "is not a causal-LM program with a KV cache" in err, err
    assert not (tmp_path / "infer").exists()
