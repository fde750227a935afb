"""`qnn-pipeline --eval`: after infer, the float model, the fake-quantized model and the program
of this run scored on the same tokens (`qnn_infer.evaluation`), written as OUT/eval.json and
OUT/eval.md, headlined in summary.json and judged by the evaluation gates. The only place that
sees every stage's artifact, so the only place that can put the three side by side."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from qnn_common.cli.noise import native_noise_filtered
from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError
from qnn_common.gates import EvalGates
from qnn_common.llm_spec import GenerationConfig
from qnn_common.recipes import BACKENDS, Backend, Recipe
from qnn_common.store.atomic import atomic_write_text
from qnn_infer.evaluation.data import shipped, with_eval_file
from qnn_infer.evaluation.harness import SLOW_PROGRAM, Suite, evaluate
from qnn_infer.evaluation.program import artifact_text, program_lm
from qnn_infer.evaluation.report import (
    BLOCKS_SVG,
    EvalGateError,
    answer_drop,
    blocks_svg,
    gate_failures,
    markdown,
)
from qnn_quant.block_taps import BlockTap
from qnn_quant.lm_steps import artifact_lm

log = logging.getLogger(__name__)

EVAL_JSON = "eval.json"
EVAL_MD = "eval.md"


@dataclass(frozen=True)
class EvalRequest:
    """What --eval asks: the suite, the user's own data, the gates (None: report only)."""

    suite: Suite
    eval_file: Path | None = None
    gates: EvalGates | None = field(default_factory=EvalGates)


def run_evaluation(
    request: EvalRequest, dirs: Mapping[Stage, Path], *, backend: Backend, recipe: Recipe,
    out_dir: Path, generation: GenerationConfig | None = None,
) -> tuple[dict[str, Any], EvalGateError | None]:
    """Evaluate the models of one run's artifacts (`dirs`: prepare and compile, and quantize
    where there is one); (the summary's "evaluation" entry, the gate failure). The prompt suite
    feeds each prompt as this run's `generation` fed its prompt."""
    if Stage.PREPARE not in dirs or Stage.COMPILE not in dirs:
        raise ConfigValidationError(
            "eval", request.suite.name,
            "needs this run's prepare and compile artifacts (a run from --from a later stage "
            "has no float model to compare with); run the pipeline from the model",
        )
    data = shipped()
    if request.eval_file is not None:
        data = with_eval_file(data, request.eval_file)
    handles = []
    try:
        taps = {"fp32": BlockTap()}
        models = [artifact_lm(dirs[Stage.PREPARE], "fp32", tap=taps["fp32"])]
        if Stage.QUANTIZE in dirs:
            taps["fake_quant"] = BlockTap()
            models.append(artifact_lm(dirs[Stage.QUANTIZE], "fake_quant",
                                      tap=taps["fake_quant"]))
        program, pte = program_lm(dirs[Stage.COMPILE], generation=generation)
        handles.append(pte)
        # Every model fed alike, so that a reply differs by the model and not by its feeding.
        models = [replace(m, prompt_decode_up_to=program.prompt_decode_up_to) for m in models]
        models.append(program)
        text = artifact_text(dirs[Stage.COMPILE], program)
        # An emulated program (the HTP emulator) runs orders slower than the CPU references.
        slow = {"program": SLOW_PROGRAM} if BACKENDS[backend].emulated_on_host else {}
        log.info("evaluation (%s): %s", request.suite.name, ", ".join(m.name for m in models))
        with native_noise_filtered():
            evaluation = evaluate(models, data, request.suite, text, slow, taps)
    finally:
        for handle in handles:
            handle.close()
    failures = (None if request.gates is None
                else gate_failures(evaluation, request.gates, "program", recipe))
    evaluation["gates"] = (
        None if request.gates is None
        else {"ok": not failures, "failures": failures, "thresholds": asdict(request.gates)}
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / EVAL_JSON, json.dumps(evaluation, indent=1) + "\n")
    title = f"Evaluation: {recipe.value} on {backend.value}"
    if evaluation.get("blocks", {}).get("blocks"):
        atomic_write_text(out_dir / BLOCKS_SVG, blocks_svg(evaluation["blocks"]))
    atomic_write_text(out_dir / EVAL_MD, markdown(evaluation, title, failures))
    error = EvalGateError(out_dir / EVAL_MD, failures) if failures else None
    return headline(evaluation, out_dir / EVAL_MD), error


def headline(evaluation: dict[str, Any], report: Path) -> dict[str, Any]:
    """The program's figures for summary.json (eval.json holds them all)."""
    corpus = evaluation["corpus"]["candidates"].get("program", {})
    prompts = evaluation["prompts"]["models"].get("program", {})
    tasks = evaluation["tasks"]["models"].get("program", {})
    drop = answer_drop(evaluation, "program")
    return {
        "suite": evaluation["suite"]["name"], "report": str(report),
        "corpus_tokens": corpus.get("tokens"),
        "kl_mean": corpus.get("kl_divergence", {}).get("mean"),
        "same_top_percent": corpus.get("same_top_percent"),
        "perplexity_ratio": corpus.get("perplexity_ratio"),
        "prompts": prompts.get("prompts"),
        "answers_found": prompts.get("answers_found"),
        "answers_known": prompts.get("answers_known"),
        "fp32_answer_percent": prompts.get("reference_answer_percent"),
        "answer_drop_points": None if drop is None else round(drop[0], 2),
        "task_items": tasks.get("items"), "task_acc": tasks.get("acc"),
        "fp32_task_acc": tasks.get("reference_acc"),
        "gates": evaluation["gates"],
    }
