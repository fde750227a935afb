"""Orchestrator logic that needs no model: where to resume, and the summary contract."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qnn_common.artifact import Artifact
from qnn_common.cache_keys import cache_key
from qnn_common.config import Stage
from qnn_common.errors import ArtifactError, ConfigValidationError, PipelineError
from qnn_common.recipes import Backend, Recipe
from qnn_common.sealing import write_manifest
from qnn_pipeline import orchestrator
from qnn_pipeline import summary as summary_module
from qnn_pipeline.cli import main
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import StageRunner, run_pipeline, start_of
from qnn_pipeline.summary import StageRecord, build_summary, format_summary


def _artifact(path: Path, stage: Stage) -> Path:
    path.mkdir()
    (path / "x.bin").write_bytes(b"x")
    write_manifest(path, stage=stage, package="t", package_version="0", config={}, inputs={},
                   files=["x.bin"], cache_key="k")
    return path


@pytest.mark.parametrize(
    ("produced", "resume"),
    [(Stage.PREPARE, Stage.QUANTIZE), (Stage.QUANTIZE, Stage.COMPILE),
     (Stage.COMPILE, Stage.INFER)],
)
def test_resume_starts_after_the_artifacts_stage(
    tmp_path: Path, produced: Stage, resume: Stage
) -> None:
    assert start_of(_artifact(tmp_path / "a", produced)) is resume


def test_resume_from_files_and_refusals(tmp_path: Path) -> None:
    assert start_of(tmp_path / "m.pt2") is Stage.COMPILE
    assert start_of(tmp_path / "m.pte") is Stage.INFER
    with pytest.raises(ArtifactError, match="cannot tell where to resume"):
        start_of(tmp_path / "m.onnx")
    with pytest.raises(ArtifactError, match="nothing is left to run"):
        start_of(_artifact(tmp_path / "i", Stage.INFER))
    with pytest.raises(ArtifactError, match="manifest.json"):
        start_of(tmp_path)  # a directory, but not an artifact


def test_summary_has_the_documented_keys_even_when_stages_were_skipped() -> None:
    ctx = PipelineContext.create("tiny-cnn", stop_after=Stage.PREPARE)
    records = [StageRecord(Stage.PREPARE, "ran", 1.5, Path("out/prepare-x"))] + [
        StageRecord(s, "skipped") for s in (Stage.QUANTIZE, Stage.COMPILE, Stage.INFER)
    ]
    summary = build_summary(ctx, records, {})
    assert summary["model"] == "tiny-cnn" and summary["soc"] is None
    assert summary["stages"][0] == {"name": "prepare", "status": "ran", "seconds": 1.5,
                                    "artifact": "out/prepare-x"}
    assert set(summary["accuracy"]) >= {"sqnr_db_vs_fp32", "cosine_vs_fp32",
                                        "sqnr_db_vs_fake_quant", "ok"}
    assert summary["accuracy"]["ok"] is None  # nothing was judged: infer did not run
    assert summary["latency_ms"] == {"p50": None, "p90": None}
    assert summary["pte_bytes"] is None
    table = format_summary(summary)
    assert "prepare    ran" in table and "latency p50 - ms" in table and "gates: -" in table


def test_summary_carries_the_infer_gate_verdict(tmp_path: Path) -> None:
    ctx = PipelineContext.create("tiny-cnn")
    infer = tmp_path / "i"
    infer.mkdir()
    (infer / "outputs.pt").write_bytes(b"x")
    failure = {"field": "min_sqnr_db_vs_fp32", "comparison": "vs_fp32", "metric": "sqnr_db",
               "value": 12.0, "gate": 15.0}
    manifest = write_manifest(
        infer, stage=Stage.INFER, package="t", package_version="0", config={}, inputs={},
        files=["outputs.pt"], cache_key="k",
        metrics={"accuracy_gates": {"ok": False, "recipe": "8a8w", "gates": {},
                                    "failures": [failure]}},
    )
    records = [StageRecord(s, "cached", 0.0, infer) for s in Stage]
    summary = build_summary(ctx, records, {Stage.INFER: manifest})
    assert summary["accuracy"]["ok"] is False and summary["accuracy"]["failures"] == [failure]
    assert "gates: FAILED" in format_summary(summary)


def test_errors_out_of_a_stage_name_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = PipelineContext.create("no_such_module_for_this_test:make", out_dir=tmp_path)
    with pytest.raises(PipelineError) as info:
        run_pipeline(ctx)
    assert info.value.stage == "prepare"
    assert main(["--model", "no_such_module_for_this_test:make", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: [prepare] ")


def test_context_takes_backend_and_recipe_by_name() -> None:
    ctx = PipelineContext.create("tiny-cnn", backend="xnnpack", recipe="8a8w")
    assert (ctx.backend, ctx.recipe) == (Backend.XNNPACK, Recipe.A8W8)
    with pytest.raises(ConfigValidationError, match="unknown recipe"):
        PipelineContext.create("tiny-cnn", recipe="9a9w")


def test_a_summary_removed_by_another_run_meanwhile_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's cells share one --out: two may find the previous summary and one removes it
    while the other is reading it; that is not someone else's file."""
    summary = tmp_path / "summary.json"
    summary.write_text("{}")

    def read_as_another_run_removes_it(path: Path) -> bool:
        path.unlink()  # the other cell's removal, between our lexists and our read
        return False

    monkeypatch.setattr(summary_module, "is_our_summary", read_as_another_run_removes_it)
    summary_module.remove_previous_summary(summary)
    assert not summary.exists()
    summary.write_text("{}")  # still there, and not ours: refused
    monkeypatch.setattr(summary_module, "is_our_summary", lambda path: False)
    with pytest.raises(ArtifactError, match="not a summary this pipeline wrote"):
        summary_module.remove_previous_summary(summary)


def test_a_summary_write_killed_midway_is_swept_by_the_next_run(tmp_path: Path) -> None:
    """kill -9 between the summary's temp file and its rename leaves the temp file; the next run
    into that --out removes it (its writer is gone) and leaves a live writer's alone."""
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    killed.wait()
    orphan = tmp_path / f".summary.{killed.pid}.abcd1234.tmp.json"
    in_progress = tmp_path / f".summary.{os.getpid()}.efgh5678.tmp.json"
    orphan.write_text('{"model": ')
    in_progress.write_text('{"model": ')
    summary_module.remove_previous_summary(tmp_path / "summary.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == [in_progress.name]


def _stand_in(stage: Stage, ran: list[tuple[Stage, str | None]]) -> StageRunner[Any]:
    """A stage that seals a one-file artifact keyed by its upstream's directory name."""

    def make_input(ctx: PipelineContext, source: Artifact | None, out: Path) -> Any:
        return (None if source is None else source.path.name, out)

    def key_of(upstream: str | None) -> str:
        return cache_key(stage, {"upstream": upstream}, {}, "0")

    def key(ctx: PipelineContext, source: Artifact | None) -> str:
        return key_of(None if source is None else source.path.name)

    def run(inp: Any) -> Artifact:
        upstream, out = inp
        ran.append((stage, upstream))
        out.mkdir(parents=True)
        (out / "x.bin").write_bytes(stage.value.encode())
        return Artifact(out, write_manifest(
            out, stage=stage, package="t", package_version="0", config={"upstream": upstream},
            inputs={}, files=["x.bin"], cache_key=key_of(upstream)))

    return StageRunner(key, make_input, run)


def test_run_pipeline_drives_stand_in_stages_in_order_and_caches_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orchestration alone, with stand-in stages: each gets the previous one's artifact,
    the summary lists them, and a rerun finds every one cached."""
    ran: list[tuple[Stage, str | None]] = []
    monkeypatch.setattr(orchestrator, "_RUNNERS", {s: _stand_in(s, ran) for s in Stage})
    # (Compile's cache check also reads the target from the manifest: stop before it.)
    ctx = PipelineContext.create("tiny-cnn", out_dir=tmp_path, stop_after=Stage.QUANTIZE)
    first = run_pipeline(ctx)
    prepared = first.records[0].artifact
    assert prepared is not None
    assert ran == [(Stage.PREPARE, None), (Stage.QUANTIZE, prepared.name)]  # prepare's output
    assert [r.status for r in first.records] == ["ran", "ran", "skipped", "skipped"]
    assert first.gate_failure is None and first.summary["stages"][1]["status"] == "ran"
    ran.clear()
    again = run_pipeline(ctx)
    assert ran == [] and [r.status for r in again.records][:2] == ["cached"] * 2
