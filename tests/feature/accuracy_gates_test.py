"""Accuracy gates: a program whose outputs are wrong fails the run, with the numbers, instead of
passing with a low SQNR in the summary.

Real models, real lowering and the real ExecuTorch runtime; the one constructed case is a compile
artifact whose fp32 reference was replaced by a wrong one (and resealed), the stand-in for "a
program that computes something other than the model".
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any, cast

import pytest

from qnn_common.config import InferConfig
from qnn_common.gates import AccuracyGates, default_accuracy_gates
from qnn_common.manifest import MANIFEST_NAME
from qnn_common.recipes import Recipe
from qnn_common.reports import (
    WEIGHT_RECORDS,
    Comparison,
    CompileReport,
    InferReport,
    QuantizeReport,
)
from qnn_common.sealing import load_manifest, write_manifest
from qnn_common.stages import REFERENCE_FP32
from qnn_common.torchio.samples import load_samples, save_samples
from qnn_infer.cli import main as infer_main
from qnn_infer.gate_check import AccuracyGateError, gate_failure, judge_accuracy
from qnn_pipeline.cli import main as pipeline_main
from support.summary import read_summary


def _artifact(summary: dict[str, Any], stage: str) -> Path:
    (path,) = (s["artifact"] for s in summary["stages"] if s["name"] == stage)
    return Path(path)


# --- the verdict, without a model ----------------------------------------------------------------


def _acc(sqnr: float, cos: float) -> dict[str, Any]:
    return {"sqnr_db": sqnr, "cosine": cos, "max_abs_error": 0.0, "per_output": []}


def test_verdict_is_null_without_references_and_false_below_a_gate() -> None:
    gates = default_accuracy_gates(Recipe.A8W8)
    assert judge_accuracy({}, gates).ok is None  # e.g. --inputs: no reference applies
    good = {"vs_fp32": _acc(25.0, 0.99), "vs_fake_quant": _acc(20.0, 0.999)}
    assert judge_accuracy(good, gates, Recipe.A8W8).ok is True
    bad = {"vs_fp32": _acc(3.0, 0.5), "vs_fake_quant": _acc(4.0, 0.6)}
    verdict = judge_accuracy(bad, gates, Recipe.A8W8)
    assert verdict.ok is False and verdict.recipe == "8a8w"
    assert {f["field"] for f in verdict.failures} == {"min_cosine_vs_fp32",
                                                         "min_sqnr_db_vs_fake_quant"}


def test_a_causal_lm_fails_on_its_perplexity_ratio_with_a_suggestion() -> None:
    gates = default_accuracy_gates(Recipe.A16W8, causal_lm=True)
    logits = {"vs_fp32": _acc(14.0, 0.98), "vs_fake_quant": _acc(19.2, 0.994)}
    fine = {**logits, "perplexity": {"fp32": 31.67, "fake_quant": 33.44, "program": 32.91}}
    assert judge_accuracy(fine, gates, Recipe.A16W8).ok is True
    # Without perplexities (a run without eval text) the ratio gate has nothing to judge.
    assert judge_accuracy(logits, gates, Recipe.A16W8).ok is True
    broken = {**logits, "perplexity": {"fp32": 31.67, "fake_quant": 33.44, "program": 250.0}}
    verdict = judge_accuracy(broken, gates, Recipe.A16W8)
    assert verdict.ok is False
    (failure,) = verdict.failures
    assert failure["field"] == "max_perplexity_vs_fake_quant"
    assert failure["value"] == pytest.approx(250.0 / 33.44)
    # The message reads only the failures (the manifest is carried for the orchestrator).
    message = str(AccuracyGateError(Path("out"), cast(Any, None), verdict.failures, "16a8w"))
    assert "7.476 > 1.1 (max_perplexity_vs_fake_quant)" in message
    assert "--max-perplexity-vs-fake-quant 7.48" in message


def _next_token(kl: float, kl_interval: tuple[float, float], top: float,
                top_interval: tuple[float, float]) -> dict[str, Any]:
    return {"kl_divergence": {"mean": kl, "mean_interval": dict(zip(
                ("value", "low", "high"), (kl, *kl_interval), strict=True))},
            "same_top_percent": top, "same_top_percent_interval": dict(zip(
                ("value", "low", "high"), (top, *top_interval), strict=True))}


def test_a_causal_lm_is_judged_on_its_next_token_by_the_interval_and_the_recipe_blamed() -> None:
    gates = default_accuracy_gates(Recipe.A16W8, causal_lm=True)  # KL 0.05, same top 88 %
    logits = {"vs_fp32": _acc(14.0, 0.98), "vs_fake_quant": _acc(19.2, 0.994)}
    # SmolLM2's 16a8w figures pass; a point past the bound whose interval reaches back does too.
    for program in (_next_token(0.0063, (0.005, 0.008), 94.5, (93.7, 95.2)),
                    _next_token(0.06, (0.04, 0.09), 86.0, (83.0, 89.0))):
        accuracy = {**logits, "next_token": {"reference": "fp32", "program": program}}
        assert judge_accuracy(accuracy, gates, Recipe.A16W8).ok is True
    program = _next_token(0.3, (0.25, 0.36), 70.0, (66.0, 74.0))
    fake = _next_token(0.28, (0.23, 0.33), 71.0, (67.0, 75.0))
    lossy = {**logits, "next_token": {"reference": "fp32", "program": program,
                                      "fake_quant": fake}}
    verdict = judge_accuracy(lossy, gates, Recipe.A16W8)
    assert [(f["field"], f["value"]) for f in verdict.failures] == [
        ("max_kl_vs_fp32", 0.25), ("min_same_top_percent_vs_fp32", 74.0)]
    message = str(AccuracyGateError(Path("out"), cast(Any, None), verdict.failures, "16a8w",
                                    lossy))
    assert "KL divergence from fp32 (its interval's low end) of the next token 0.25 > 0.05" \
        in message
    assert "--max-kl-vs-fp32 0.25 --min-same-top-vs-fp32 74" in message
    assert "fake-quantized model is about as far from fp32 (KL 0.28)" in message
    assert "try --recipe 16a16w" in message
    # Every flip on a near tie (a near-flat model's rounding): the decided figure passes.
    ties = {**program, "same_top_decided_percent": {"value": 99.0, "low": 98.0, "high": 100.0}}
    tied = {**logits, "next_token": {"program": {**ties, "kl_divergence": {
        "mean": 0.01, "mean_interval": {"value": 0.01, "low": 0.008, "high": 0.012}}}}}
    assert judge_accuracy(tied, gates, Recipe.A16W8).ok is True
    # The fake-quantized model close to fp32: the compile lost it, no recipe is blamed.
    close = {**lossy, "next_token": {**lossy["next_token"],
                                     "fake_quant": _next_token(0.01, (0.008, 0.012), 95.0,
                                                               (94.0, 96.0))}}
    failures = judge_accuracy(close, gates, Recipe.A16W8).failures
    assert "recipe's" not in str(AccuracyGateError(Path("out"), cast(Any, None), failures,
                                                   "16a8w", close))
    # A record from before the intervals: judged by its point values.
    bare = {"kl_divergence": {"mean": 0.3}, "same_top_percent": 95.0}
    old = {**logits, "next_token": {"program": bare}}
    (failure,) = judge_accuracy(old, gates, Recipe.A16W8).failures
    assert failure["field"] == "max_kl_vs_fp32" and failure["value"] == 0.3


def test_a_program_that_matches_its_fake_quant_model_blames_the_recipe() -> None:
    gates = default_accuracy_gates(Recipe.A8W8)
    # Far from fp32, close to the fake-quantized model: the quantization lost it.
    lossy = {"vs_fp32": _acc(8.0, 0.5), "vs_fake_quant": _acc(35.0, 0.9999)}
    verdict = judge_accuracy(lossy, gates, Recipe.A8W8)
    message = str(AccuracyGateError(Path("out"), cast(Any, None), verdict.failures, "8a8w",
                                    lossy))
    assert "matches its fake-quantized model (35 dB)" in message
    assert "the loss is the recipe's" in message and "try --recipe 16a8w" in message
    # A 16-bit recipe is not told to take 16-bit activations: the next recipe up is named.
    block = str(AccuracyGateError(Path("out"), cast(Any, None), verdict.failures,
                                  "16a4w_block", lossy))
    assert "try --recipe 16a8w" in block and "16-bit activations" not in block
    # Far from both (or no fake-quant comparison): nothing is blamed.
    for accuracy in ({"vs_fp32": _acc(8.0, 0.5), "vs_fake_quant": _acc(12.0, 0.95)},
                     {"vs_fp32": _acc(8.0, 0.5)}):
        failures = judge_accuracy(accuracy, gates, Recipe.A8W8).failures
        assert failures
        blamed = str(AccuracyGateError(Path("out"), cast(Any, None), failures, "8a8w", accuracy))
        assert "recipe's" not in blamed


def test_a_nan_metric_fails_its_gate_and_inf_passes() -> None:
    gates = AccuracyGates(min_sqnr_db_vs_fp32=40.0)
    assert judge_accuracy({"vs_fp32": _acc(math.nan, 1.0)}, gates).ok is False
    assert judge_accuracy({"vs_fp32": _acc(math.inf, 1.0)}, gates).ok is True


def test_gates_off_judge_nothing() -> None:
    gates = InferConfig(accuracy_gates=False).gates_for(Recipe.FP32)
    assert gates == AccuracyGates()
    assert judge_accuracy({"vs_fp32": _acc(-10.0, -1.0)}, gates).ok is None


# --- real programs -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fp32")
    assert pipeline_main(["--model", "tiny-cnn", "--skip", "quantize", "--out", str(out),
                          "--runs", "2"]) == 0
    return out


def test_a_float_program_that_matches_passes(fp32_run: Path) -> None:
    accuracy = read_summary(fp32_run)["accuracy"]
    assert accuracy["ok"] is True and accuracy["failures"] == []
    # The fp32 default, taken from the compile artifact's recipe.
    assert accuracy["gates"]["min_sqnr_db_vs_fp32"] == 40.0
    assert float(accuracy["sqnr_db_vs_fp32"]) >= 40.0


def _with_wrong_reference(compiled: Path, dst: Path) -> Path:
    """A copy of a compile artifact whose fp32 reference is the negated one, resealed."""
    shutil.copytree(compiled, dst)
    (dst / MANIFEST_NAME).unlink()
    wrong = [tuple(-t for t in sample) for sample in load_samples(dst / REFERENCE_FP32)]
    save_samples(dst / REFERENCE_FP32, wrong)
    m = load_manifest(compiled)
    write_manifest(dst, stage=m.stage, package=m.package, package_version=m.package_version,
                   config=m.config, inputs=m.inputs, files=[f.path for f in m.files],
                   cache_key=m.cache_key, timings=m.timings, metrics=m.metrics,
                   program=m.program)
    return dst


def test_a_wrong_float_program_exits_non_zero_with_the_numbers(
    fp32_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = _with_wrong_reference(_artifact(read_summary(fp32_run), "compile"), tmp_path / "c")
    out = tmp_path / "i"
    assert infer_main([str(broken), "-o", str(out), "--runs", "2"]) == 2
    err = capsys.readouterr().err
    # What was measured, the gate it missed, and how to relax it.
    assert "fp32 program" in err and "SQNR vs fp32" in err and "< 40 dB" in err
    assert "min_sqnr_db_vs_fp32" in err and "--min-sqnr-db" in err
    assert "--no-accuracy-gates" in err
    # The outputs are the evidence: the artifact is written and sealed anyway.
    manifest = load_manifest(out, expect_stage="infer")
    run = InferReport.of(manifest)
    assert run.verdict.ok is False and run.verdict.recipe == "fp32"
    assert manifest.metrics["accuracy_gates"] == run.verdict.to_json()  # the field, as sealed
    assert float((run.vs_fp32 or Comparison()).cosine or 0.0) < -0.99
    failure = gate_failure(out, manifest)
    assert failure is not None and "SQNR vs fp32" in str(failure)


def test_no_accuracy_gates_reports_without_failing(
    fp32_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = _with_wrong_reference(_artifact(read_summary(fp32_run), "compile"), tmp_path / "c")
    assert infer_main([str(broken), "-o", str(tmp_path / "i"), "--runs", "2",
                       "--no-accuracy-gates"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["accuracy_ok"] is None and printed["accuracy"]["vs_fp32"]["cosine"] < -0.99


def test_quantized_run_is_ok_then_an_impossible_gate_fails_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--model", "tiny-cnn", "--out", str(tmp_path), "--runs", "2",
            "--calibration-samples", "4"]
    assert pipeline_main(args) == 0
    summary = read_summary(tmp_path)
    assert summary["accuracy"]["ok"] is True
    assert summary["accuracy"]["gates"] == {
        "min_sqnr_db_vs_fp32": None, "min_cosine_vs_fp32": 0.9,
        "min_sqnr_db_vs_fake_quant": 15.0, "min_cosine_vs_fake_quant": None,
        # causal LMs only
        "max_perplexity_vs_fake_quant": None, "max_kl_vs_fp32": None,
        "min_same_top_percent_vs_fp32": None,
    }
    # Each stage sealed its report: every key it wrote is a field of that report, read back
    # whole (no figure spelled by hand beside the report).
    for stage, report in (("quantize", QuantizeReport), ("compile", CompileReport),
                          ("infer", InferReport)):
        sealed = load_manifest(_artifact(summary, stage), expect_stage=stage)
        fields = {f.name for f in dataclasses.fields(report)} | set(WEIGHT_RECORDS)
        assert set(sealed.metrics) <= fields, (stage, set(sealed.metrics) - fields)
        assert report.of(sealed).to_metrics() == sealed.metrics
    capsys.readouterr()

    assert pipeline_main([*args, "--min-sqnr-db", "500"]) == 2
    err = capsys.readouterr().err
    assert "SQNR vs fp32" in err and "< 500 dB" in err and "--min-sqnr-db" in err
    # summary.json is still written, and says why the run failed.
    failed = read_summary(tmp_path)
    assert failed["accuracy"]["ok"] is False
    (failure,) = failed["accuracy"]["failures"]
    assert failure["field"] == "min_sqnr_db_vs_fp32" and failure["gate"] == 500.0
    statuses = {s["name"]: s["status"] for s in failed["stages"]}
    assert statuses == {"prepare": "cached", "quantize": "cached", "compile": "cached",
                        "infer": "ran"}
    assert (_artifact(failed, "infer") / MANIFEST_NAME).is_file()

    # A rerun finds the cached infer artifact, and its failed verdict fails the run again.
    assert pipeline_main([*args, "--min-sqnr-db", "500"]) == 2
    assert {s["status"] for s in read_summary(tmp_path)["stages"]} == {"cached"}


def test_gates_from_the_toml_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "p.toml"
    config.write_text('[pipeline]\nmodel = "tiny-cnn"\nrecipe = "fp32"\n'
                      "[infer]\nruns = 2\nmin_cosine_vs_fp32 = 1.0\nmin_sqnr_db_vs_fp32 = 400\n")
    assert pipeline_main(["--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "min_sqnr_db_vs_fp32" in capsys.readouterr().err
    gates = read_summary(tmp_path / "o")["accuracy"]["gates"]
    assert gates["min_sqnr_db_vs_fp32"] == 400.0 and gates["min_cosine_vs_fp32"] == 1.0
