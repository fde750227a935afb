"""--eval for real: tiny-llama's float methods, the .pte in the ExecuTorch runtime and the shipped
(or the user's) data through the evaluation harness (qnn_infer.evaluation), nothing mocked; a
damaged program fails the gates with a message naming the figures."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qnn_common.causal_lm.steps import StepLm
from qnn_common.config import Stage
from qnn_common.gates import EvalGates
from qnn_common.llm_spec import GenerationConfig
from qnn_common.numerics.lm_metrics import log_softmax, score_window
from qnn_common.recipes import Backend, Recipe
from qnn_infer.evaluation.blocks import block_errors
from qnn_infer.evaluation.data import shipped, with_eval_file
from qnn_infer.evaluation.harness import Suite, evaluate
from qnn_infer.evaluation.lm import continued, greedy, logits
from qnn_infer.evaluation.program import artifact_text, program_lm
from qnn_infer.evaluation.report import BLOCKS_SVG, gate_failures
from qnn_infer.evaluation.tasks import continuation
from qnn_infer.families.causal_lm import run_generation
from qnn_pipeline.cli import main as pipeline_main
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.evaluation import EVAL_JSON, EVAL_MD, EvalRequest
from qnn_pipeline.orchestrator import run_pipeline
from qnn_quant.block_taps import BlockTap
from qnn_quant.lm_steps import artifact_lm

SUITE = Suite("test", corpus_tokens=192, prompts=4, tasks=6, new_tokens=6)


def _evaluated(out: Path, recipe: str, gates: EvalGates | None) -> dict[str, Any]:
    """tiny-llama through the pipeline with `recipe` and --eval (SUITE)."""
    ctx = PipelineContext.create(
        "tiny-llama", recipe=recipe, out_dir=out,
        prepare={"kv_cache": True, "calibration_samples": 4, "eval_samples": 2,
                 "max_seq_len": 48, "prefill_len": 8, "seed": 1126},
        infer={"generation": {"prompt": "Once upon a time", "max_new_tokens": 4}},
    )
    result = run_pipeline(ctx, evaluation=EvalRequest(SUITE, gates=gates)).checked()
    return {"out": out, "summary": result.summary}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _evaluated(tmp_path_factory.mktemp("eval"), "fp32", EvalGates())


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # Gates off: 8a8w costs tiny-llama much, and this run is read for its block trace.
    return _evaluated(tmp_path_factory.mktemp("eval-8a8w"), "8a8w", None)


def _artifact(summary: dict[str, Any], stage: Stage) -> Path:
    (entry,) = (s for s in summary["stages"] if s["name"] == stage.value)
    return Path(entry["artifact"])


def test_an_fp32_program_evaluates_as_its_float_model(run: dict[str, Any]) -> None:
    evaluation = json.loads((run["out"] / EVAL_JSON).read_text())
    assert evaluation["models"] == ["fp32", "program"]  # fp32: no quantize stage, no fake quant
    corpus = evaluation["corpus"]
    assert corpus["window"] == 48  # the whole context: tiny-llama has no attention sink
    assert 150 <= corpus["tokens"] <= SUITE.corpus_tokens
    program = corpus["candidates"]["program"]
    assert program["tokens"] == corpus["tokens"]
    assert program["kl_divergence"]["mean"] < 1e-5
    assert program["same_top_percent"] > 99.0
    assert abs(program["perplexity_ratio"]["value"] - 1) < 1e-3
    assert corpus["candidates"]["fp32"]["perplexity"] > 1
    prompts = evaluation["prompts"]["models"]
    # Prompts a 48-token context cannot hold with a reply are skipped, and counted.
    answered = SUITE.prompts - evaluation["prompts"]["skipped_too_long"]
    assert answered >= 1 and prompts["program"]["prompts"] == answered
    assert prompts["program"]["identical"] == answered
    assert all(r["margin"] is None for r in prompts["program"]["rows"])
    tasks = evaluation["tasks"]["models"]["program"]
    assert tasks["items"] == SUITE.tasks and tasks["same_pick_as_reference"] == 100.0
    assert evaluation["gates"]["ok"] is True
    headline = run["summary"]["evaluation"]
    assert headline["kl_mean"] == program["kl_divergence"]["mean"]
    assert headline["report"] == str(run["out"] / EVAL_MD)
    text = (run["out"] / EVAL_MD).read_text()
    assert "Gates: ok" in text and "| program |" in text


def test_a_choice_continued_from_its_fed_context_scores_as_the_whole_sequence(
    run: dict[str, Any]
) -> None:
    """Tasks feed an item's context once and continue each choice from it, over the cache the
    previous choice wrote past the context: each choice must score as if fed whole."""
    summary = run["summary"]
    program, pte = program_lm(_artifact(summary, Stage.COMPILE))
    try:
        _check_continuations(artifact_lm(_artifact(summary, Stage.PREPARE), "fp32"), summary)
        _check_continuations(program, summary)
    finally:
        pte.close()


def _check_continuations(lm: StepLm, summary: dict[str, Any]) -> None:
    text = artifact_text(_artifact(summary, Stage.COMPILE), lm)
    context = "Alice was"  # bytes: tiny-llama has no tokenizer, and a 48-token context
    # Long, short, long: the short one reads past a longer one's cache, the last rewrites it.
    choices = (" tired of sitting", " x", " tired of sitting")
    ctx = text.encode(context)
    expected = []
    for choice in choices:
        _, cont = continuation(text.encode, context, choice)
        whole = log_softmax(logits(lm, [*ctx, *cont]))
        expected.append(sum(whole[len(ctx) - 1 + i, t] for i, t in enumerate(cont)))
    last = log_softmax(logits(lm, ctx))[-1]
    for choice, want in zip(choices, expected, strict=True):
        _, cont = continuation(text.encode, context, choice)
        fed = last[cont[0]] + sum(
            log_softmax(continued(lm, cont[:-1], len(ctx)))[i, t]
            for i, t in enumerate(cont[1:]))
        assert abs(fed - want) < 1e-3, (lm.name, choice, fed, want)


def _damaged(lm: StepLm) -> StepLm:
    """The program with its logits shifted by one vocabulary slot: a mis-wired output."""

    def shift(step: Any) -> Any:
        return lambda ids, pos: torch.roll(step(ids, pos), 1, dims=-1)

    return StepLm("program", shift(lm.prefill), shift(lm.decode), lm.spec)


def test_a_damaged_program_fails_the_gates_naming_each_figure(run: dict[str, Any]) -> None:
    summary = run["summary"]
    fp32 = artifact_lm(_artifact(summary, Stage.PREPARE), "fp32")
    program, pte = program_lm(_artifact(summary, Stage.COMPILE))
    try:
        text = artifact_text(_artifact(summary, Stage.COMPILE), program)
        evaluation = evaluate([fp32, _damaged(program)], shipped(), SUITE, text)
    finally:
        pte.close()
    failures = gate_failures(evaluation, EvalGates(), "program", Recipe.A8W8)
    assert any(f.startswith("KL divergence from fp32") for f in failures)
    assert any(f.startswith("same top token as fp32") for f in failures)
    assert any("perplexity" in f for f in failures)
    assert failures[-1].startswith("try --recipe 16a8w")
    replies = evaluation["prompts"]["models"]["program"]["rows"]
    assert all(r["same_tokens"] == 0 and r["margin"] > 0 for r in replies)


def test_the_users_eval_file_replaces_what_it_holds(run: dict[str, Any], tmp_path: Path) -> None:
    rows = tmp_path / "mine.jsonl"
    rows.write_text(
        json.dumps({"prompt": "Alice was", "answers": ["Alice"]}) + "\n"
        + json.dumps({"context": "Down, down,", "choices": [" down", " up"], "answer": 0}) + "\n"
    )
    data = with_eval_file(shipped(), rows)
    assert len(data.prompts) == 1 and len(data.tasks) == 1
    assert data.sources["corpus"].startswith("shipped")
    summary = run["summary"]
    fp32 = artifact_lm(_artifact(summary, Stage.PREPARE), "fp32")
    program, pte = program_lm(_artifact(summary, Stage.COMPILE))
    try:
        text = artifact_text(_artifact(summary, Stage.COMPILE), program)
        evaluation = evaluate([fp32, program], data, SUITE, text)
    finally:
        pte.close()
    assert evaluation["sources"]["prompts"] == f"--eval-file {rows}"
    assert evaluation["prompts"]["models"]["program"]["prompts"] == 1
    assert evaluation["tasks"]["models"]["program"]["items"] == 1
    # The fp32 reference's pick is the program's: same weights, same arithmetic.
    assert evaluation["tasks"]["models"]["program"]["same_pick_as_reference"] == 100.0
    assert np.isfinite(evaluation["corpus"]["candidates"]["program"]["kl_divergence"]["mean"])


def test_the_fake_quant_models_error_is_traced_block_by_block(quantized: dict[str, Any]) -> None:
    evaluation = json.loads((quantized["out"] / EVAL_JSON).read_text())
    assert evaluation["models"] == ["fp32", "fake_quant", "program"]
    traced = evaluation["blocks"]
    assert (traced["reference"], traced["model"]) == ("fp32", "fake_quant")
    assert traced["tokens"] == evaluation["corpus"]["tokens"]  # fewer than block_tokens
    rows = traced["blocks"]
    assert [r["block"] for r in rows] == list(range(len(rows))) and len(rows) >= 2
    # Rounded, so not exact (200 dB, the ceiling); and still the signal, not noise (8a8w costs
    # tiny-llama much: 1.6 nats of KL divergence at the logits).
    assert all(0 < r["sqnr_db"] < 100 for r in rows), rows
    svg = ElementTree.parse(quantized["out"] / BLOCKS_SVG).getroot()
    assert sum(e.tag.endswith("circle") for e in svg.iter()) == len(rows)
    assert "## Where the error enters" in (quantized["out"] / EVAL_MD).read_text()


def test_the_float_model_traced_against_itself_is_exact(run: dict[str, Any]) -> None:
    prepared = _artifact(run["summary"], Stage.PREPARE)
    taps = (BlockTap(), BlockTap())
    one, other = (artifact_lm(prepared, name, tap=tap)
                  for name, tap in zip(("fp32", "again"), taps, strict=True))
    text = artifact_text(_artifact(run["summary"], Stage.COMPILE), one)
    ids = text.encode("Alice was beginning to get very tired of sitting by her sister")[:40]
    traced = block_errors(one, taps[0], other, taps[1], [ids])
    assert traced["blocks"] and all(r["sqnr_db"] == 200.0 for r in traced["blocks"])


def test_weights_only_is_what_the_weights_alone_cost(quantized: dict[str, Any]) -> None:
    """The fake-quant model with its activations in float sits between fp32 and the fake
    quant: the weights' rounding is in it, the activations' is not."""
    summary = quantized["summary"]
    fp32 = artifact_lm(_artifact(summary, Stage.PREPARE), "fp32")
    fake = artifact_lm(_artifact(summary, Stage.QUANTIZE), "fake_quant")
    weights = artifact_lm(_artifact(summary, Stage.QUANTIZE), "weights", weights_only=True)
    text = artifact_text(_artifact(summary, Stage.COMPILE), fp32)
    ids = text.encode("Alice was beginning to get very tired of sitting by her sister")[:40]
    ref = logits(fp32, ids)

    def kl(lm: StepLm) -> float:
        return float(score_window(ref, logits(lm, ids), ids).kl.mean())

    assert 0 < kl(weights) < kl(fake)


def test_the_prompt_suite_replies_as_generation_does(quantized: dict[str, Any]) -> None:
    """A prompt's rest past its whole prefill windows is fed as infer's generation feeds it (on
    XNNPACK, up to 4 tokens through decode): the reply the report shows is the one a user gets,
    not one a padded window rounds differently."""
    compiled = _artifact(quantized["summary"], Stage.COMPILE)
    prompt = "Once upon a time, th"  # 20 bytes: 2 windows of 8 and a rest of 4
    calls: dict[str, list[str]] = {"evaluation": [], "generation": []}

    def counted(path: str, name: str, step: Any) -> Any:
        def run(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            calls[path].append(name)
            out: torch.Tensor = step(ids, pos)
            return out
        return run

    program, pte = program_lm(compiled)
    try:
        assert program.prompt_decode_up_to == 4
        stepped = StepLm("program", counted("evaluation", "prefill", program.prefill),
                         counted("evaluation", "decode", program.decode), program.spec,
                         prompt_decode_up_to=program.prompt_decode_up_to)
        ids = artifact_text(compiled, program).prompt(prompt)
        assert len(ids) == 20
        reply = greedy(stepped, ids, 4)
        pte.prefill = counted("generation", "prefill", pte.prefill)
        pte.decode = counted("generation", "decode", pte.decode)
        generated = run_generation(pte, compiled, program.spec,
                                   GenerationConfig(prompt=prompt, max_new_tokens=4),
                                   Backend.XNNPACK)
    finally:
        pte.close()
    assert reply.tokens == generated.tokens
    assert calls["evaluation"] == calls["generation"]
    assert calls["evaluation"][:6] == ["prefill"] * 2 + ["decode"] * 4


def test_qnn_pipeline_eval_scores_existing_artifacts_and_judges_the_recipe(
    run: dict[str, Any], quantized: dict[str, Any], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`qnn-pipeline eval`: a run's artifacts evaluated again, with the recipe's own gates: the
    fp32 program passes fp32's; tiny-llama 8a8w reads the shipped corpus as foreign text and
    fails 8a8w's, naming the figures and the recipe to try; the user's data replaces the
    shipped prompts; artifacts of two runs are refused."""
    fp32_out = tmp_path / "fp32"
    assert pipeline_main(["eval", str(run["out"]), "--out", str(fp32_out)]) == 0
    done = json.loads((fp32_out / EVAL_JSON).read_text())
    assert done["models"] == ["fp32", "program"] and done["gates"]["ok"] is True
    assert done["gates"]["thresholds"]["max_kl_mean"] == 0.01  # fp32's bound
    assert "evaluation (quick) of fp32 on xnnpack" in capsys.readouterr().out

    q = quantized["summary"]
    args = ["eval", "--prepare", str(_artifact(q, Stage.PREPARE)), "--quantize",
            str(_artifact(q, Stage.QUANTIZE)), "--compile", str(_artifact(q, Stage.COMPILE))]
    assert pipeline_main([*args, "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err
    assert "KL divergence from fp32" in err and "try --recipe 16a8w" in err
    judged = json.loads((tmp_path / "q" / EVAL_JSON).read_text())
    assert judged["models"] == ["fp32", "fake_quant", "program"]
    assert (tmp_path / "q" / EVAL_MD).is_file() and (tmp_path / "q" / BLOCKS_SVG).is_file()

    rows = tmp_path / "mine.jsonl"
    rows.write_text(json.dumps({"prompt": "Alice was", "answers": ["Alice"]}) + "\n")
    assert pipeline_main([*args, "--out", str(tmp_path / "mine"), "--eval-file", str(rows),
                          "--no-accuracy-gates"]) == 0
    mine = json.loads((tmp_path / "mine" / EVAL_JSON).read_text())
    assert mine["sources"]["prompts"] == f"--eval-file {rows}" and mine["gates"] is None

    # The fp32 run's prepare is this one's (the same float model: its identity is equal), but
    # its compile artifact was not made from this quantize artifact.
    mixed = [*args[:5], "--compile", str(_artifact(run["summary"], Stage.COMPILE)),
             "--out", str(tmp_path / "x")]
    assert pipeline_main(mixed) == 2
    assert "was not made from the quantize artifact" in capsys.readouterr().err
    assert pipeline_main([*args[:3], *args[5:], "--out", str(tmp_path / "x")]) == 2
    assert "pass its quantize artifact too (--quantize)" in capsys.readouterr().err
    assert not (tmp_path / "x" / EVAL_JSON).exists()
