"""`qnn-pipeline eval`: `--eval` over artifacts that already exist: a pipeline run's output
directory, or the prepare / quantize / compile artifacts the stage CLIs wrote, scored with the
shipped data or the user's own (`--eval-file`), without building anything again."""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from qnn_common.cli.support import (
    add_logging_args,
    check_output_writable,
    command_parser,
    setup_logging,
)
from qnn_common.config import Stage
from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.gates import default_eval_gates
from qnn_common.sealing import load_manifest
from qnn_common.stages import compiled_for
from qnn_pipeline.summary import SUMMARY_NAME, is_our_summary

EPILOG = """examples:
  qnn-pipeline eval out                        # the artifacts of a run: qnn-pipeline --out out
  qnn-pipeline eval out --suite full --eval-file mine.jsonl
  qnn-pipeline eval --prepare art/prepare --quantize art/quantize --compile art/compile \\
      --out report

The float model (prepare), the fake-quantized model (quantize, where there is one) and the
program (compile) are scored on the same tokens as `qnn-pipeline --eval` scores them
(docs/eval.md); OUT gets eval.md, eval.json and eval-blocks.svg. The artifacts must be one
lineage: the compile artifact made from that quantize artifact, made from that prepare one.

"""


def build_eval_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "qnn-pipeline eval",
        "Evaluate a causal LM's artifacts: KL divergence and same top token against the float "
        "model over a held-out corpus, a prompt suite and multiple-choice tasks, judged by the "
        "recipe's gates.",
        EPILOG,
    )
    p.add_argument("run", nargs="?", type=Path,
                   help="a pipeline run's --out directory (its summary.json names the artifacts)")
    p.add_argument("--prepare", type=Path, help="the prepare artifact (the float model)")
    p.add_argument("--quantize", type=Path, help="the quantize artifact (fake quant), if any")
    p.add_argument("--compile", type=Path, help="the compile artifact (the program)")
    p.add_argument("--suite", choices=("quick", "full"), default="quick",
                   help="quick: 2,048 corpus tokens, 10 prompts, 40 items; full: all of them")
    p.add_argument("--eval-file", type=Path,
                   help="your own data instead of the shipped one's matching part: a text file "
                   "(the corpus) or JSONL of prompts / tasks (docs/eval.md)")
    p.add_argument("--out", type=Path,
                   help="where eval.md and eval.json go (default: RUN, else beside --compile)")
    p.add_argument("--no-accuracy-gates", action="store_true",
                   help="report without judging the recipe's gates")
    add_logging_args(p)
    return p


def run_artifacts(run: Path) -> dict[Stage, Path]:
    """The artifact per stage of the pipeline run whose --out is `run`, from its summary.json."""
    summary = run / SUMMARY_NAME
    if not is_our_summary(summary):
        raise ArtifactError(
            run, f"holds no {SUMMARY_NAME} this pipeline wrote; pass the run's --out directory, "
            "or the artifacts themselves (--prepare, --quantize, --compile)",
        )
    stages = json.loads(summary.read_text(encoding="utf-8"))["stages"]
    known = {s.value for s in Stage}
    return {Stage(s["name"]): Path(s["artifact"]) for s in stages
            if s.get("artifact") and s.get("name") in known}


def check_lineage(dirs: Mapping[Stage, Path]) -> None:
    """Refuse artifacts that are not one lineage: each made from the one before it."""
    order = [s for s in (Stage.PREPARE, Stage.QUANTIZE, Stage.COMPILE) if s in dirs]
    manifests = {s: load_manifest(dirs[s], expect_stage=s.value) for s in order}
    for upstream, downstream in itertools.pairwise(order):
        # What a stage records of its input: the upstream's identity (equal for a rerun of the
        # same stage on the same inputs, so an identical rebuild counts as the same model).
        if manifests[downstream].inputs.get(upstream.value) != (
                manifests[upstream].identity_digest()):
            raise ArtifactError(
                dirs[downstream],
                f"was not made from the {upstream.value} artifact {dirs[upstream]} (its inputs "
                f"name another); pass the artifacts of one run",
            )


def eval_main(argv: Sequence[str] | None = None) -> int:
    args = build_eval_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    if args.run is not None:
        if any(getattr(args, s) is not None for s in ("prepare", "quantize", "compile")):
            raise ConfigValidationError(
                "eval", str(args.run), "give a run directory or the artifacts, not both")
        dirs = run_artifacts(args.run)
    else:
        dirs = {stage: path for stage, path in ((Stage.PREPARE, args.prepare),
                                                (Stage.QUANTIZE, args.quantize),
                                                (Stage.COMPILE, args.compile)) if path}
    missing = [s.value for s in (Stage.PREPARE, Stage.COMPILE) if s not in dirs]
    if missing:
        raise ConfigValidationError(
            "eval", ", ".join(missing),
            "the evaluation needs the float model (the prepare artifact) and the program (the "
            "compile artifact); pass --prepare and --compile, or a run directory that has both",
        )
    target, recipe = compiled_for(dirs[Stage.COMPILE], load_manifest(dirs[Stage.COMPILE]))
    if recipe.is_quantized and Stage.QUANTIZE not in dirs:
        raise ConfigValidationError(
            "eval", recipe.value,
            "a quantized program is evaluated beside its fake-quantized model, which tells the "
            "recipe's loss from the compile's: pass its quantize artifact too (--quantize)",
        )
    check_lineage(dirs)
    out = args.out or args.run or dirs[Stage.COMPILE].parent
    check_output_writable(out, "--out")

    from qnn_infer.evaluation.data import shipped, with_eval_file
    from qnn_infer.evaluation.harness import suite_named
    from qnn_pipeline.evaluation import EVAL_MD, EvalRequest, run_evaluation

    if args.eval_file is not None:
        with_eval_file(shipped(), args.eval_file)  # a bad file fails before any model loads
    gates = None if args.no_accuracy_gates else default_eval_gates(recipe)
    request = EvalRequest(suite_named(args.suite), args.eval_file, gates)
    headline, failure = run_evaluation(request, dirs, backend=target.backend, recipe=recipe,
                                       out_dir=out)
    print(f"evaluation ({request.suite.name}) of {recipe.value} on {target.backend.value}: "
          f"KL {headline['kl_mean']:.4f}, same top {headline['same_top_percent']:.1f} % over "
          f"{headline['corpus_tokens']} tokens -> {out / EVAL_MD}")
    if failure is not None:
        raise failure
    return 0
