"""`qnn-pipeline`: prepare -> quantize -> compile -> infer in one command, cached and resumable."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qnn_common.cli.support import (
    add_logging_args,
    check_output_writable,
    check_path_args,
    check_utf8_path,
    command_parser,
    run_cli,
    setup_logging,
)
from qnn_common.config import DEFAULT_LPBQ_BLOCK, Stage
from qnn_common.errors import ConfigValidationError
from qnn_common.gates import default_eval_gates
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.manifest import MANIFEST_NAME
from qnn_common.recipes import Backend, Recipe
from qnn_common.sealing import load_manifest
from qnn_common.soc import soc_names
from qnn_common.weight_groups import EmbeddingWeights, GroupMapping
from qnn_compile.cli import (
    add_htp_performance_mode_arg,
    add_num_shards_arg,
    add_weight_sharing_arg,
)
from qnn_infer.cli import (
    accuracy_gate_values,
    add_accuracy_gate_args,
    add_device_args,
    add_generation_args,
    add_inputs_arg,
    add_profile_arg,
    add_run_timeout_arg,
    add_threads_arg,
    generation_values,
)
from qnn_infer.deadline import set_run_timeout
from qnn_pipeline.context import PipelineContext, load_pipeline_toml, pipeline_from_mapping
from qnn_pipeline.summary import format_summary

if TYPE_CHECKING:
    from qnn_pipeline.evaluation import EvalRequest

EPILOG = """examples:
  qnn-pipeline --model minilm                      # XNNPACK 8a8w, the default
  qnn-pipeline --model tiny-cnn --skip quantize    # the fp32 path
  qnn-pipeline --model path/to/hf_dir --stop-after compile
  qnn-pipeline --from out/quantize-1a2b3c4d5e6f --backend xnnpack
  qnn-pipeline --from model.pte --inputs inputs.pt  # a bare program: bring its inputs
  qnn-pipeline --config pipeline.toml --force
  qnn-pipeline --model tiny-llama --prompt "Once upon a time"   # KV-cache LLM, generates
  qnn-pipeline sweep --model tiny-cnn,minilm --backend xnnpack,portable --recipe fp32,8a8w
                                                   # a matrix on Ray: qnn-pipeline sweep --help
  qnn-pipeline eval out --eval-file mine.jsonl      # a run's artifacts evaluated again
  qnn-pipeline tune --model tiny-llama --max-kl 0.05  # per-layer recipes searched to a budget

"""

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "qnn-pipeline",
        "Take a model to a running ExecuTorch program: prepare, quantize, compile, infer. Each "
        "stage writes OUT/<stage>-<key>/ with a manifest; a rerun with the same inputs reuses "
        "up-to-date stages.",
        EPILOG,
    )
    p.add_argument("--model", help="built-in name, Hugging Face directory, or module:function")
    p.add_argument("--list-models", action="store_true", help="list built-in models and exit")
    p.add_argument("--list-socs", action="store_true", help="list known SoCs and exit")
    p.add_argument("--config", type=Path, help="a pipeline TOML file; flags override it")
    p.add_argument("--backend", choices=[b.value for b in Backend],
                   help="default: xnnpack")
    p.add_argument("--recipe", choices=[r.value for r in Recipe],
                   help="default: 8a8w (fp32 / fp16 with --skip quantize)")
    p.add_argument("--soc", help="target SoC for the qnn backend, e.g. SM8650 (see --list-socs)")
    p.add_argument("--out", type=Path, help="output directory (default: out)")
    p.add_argument("--skip", action="append", choices=[Stage.QUANTIZE.value, Stage.INFER.value],
                   help="skip a stage (repeatable)")
    p.add_argument("--stop-after", choices=[s.value for s in Stage],
                   help="stop after this stage (compile = compile-only)")
    p.add_argument("--from", dest="from_artifact", type=Path,
                   help="start midway from an artifact directory, a .pt2 or a .pte")
    p.add_argument("--force", action="store_true", help="rerun stages even if up to date")
    p.add_argument("--group-size", type=int,
                   help="8da4w: input channels per 4-bit weight scale (default: 32)")
    p.add_argument("--block-size", type=int,
                   help=f"16a4w_block: input channels per LPBQ weight-scale block (default: "
                   f"{DEFAULT_LPBQ_BLOCK}; 32 for a GGUF Q4_1 model such as smollm2-135m, "
                   "whose weights sit in blocks of 32)")
    p.add_argument("--group-mapping", choices=[m.value for m in GroupMapping],
                   help="8da4w and 16a4w_block: 4-bit groups (LPBQ blocks) from their minimum "
                   "to their maximum (asymmetric, 8da4w's default) or symmetric around 0 "
                   "(upstream's, 16a4w_block's default); qnn-quant --help says more")
    p.add_argument("--embedding-weights", choices=[e.value for e in EmbeddingWeights],
                   help="8da4w: embedding tables as int8 groups (8w, the default), 4-bit groups "
                   "(4w) or float")
    p.add_argument("--no-smooth-blocks", action="store_true",
                   help="8da4w, causal LMs: upstream's plain 8da4w, without dividing each "
                   "linear input's block of large activations by a power of two; qnn-quant "
                   "--help says more")
    p.add_argument("--layer-recipe", action="append", metavar="PATTERN=RECIPE",
                   dest="layer_recipes", default=[],
                   help="give layers whose module path matches PATTERN (a regex) RECIPE instead "
                   "of --recipe (repeatable; the first match wins): fp32 anywhere, or on qnn a "
                   "recipe with the same activation bits; qnn-quant --help says more")
    p.add_argument("--seq-len", type=int, help="token length for text models (default: 128)")
    p.add_argument("--calibration-samples", type=int, help="default: 16")
    p.add_argument("--calibration-file", type=Path,
                   help="your own calibration data: a .txt file (one sample per line; a causal "
                   "LM's text) or a .pt file of inputs; qnn-prepare --help says more")
    p.add_argument("--runs", type=int, help="timed inference runs (default: 20)")
    add_threads_arg(p)
    add_profile_arg(p)
    add_run_timeout_arg(p)
    p.add_argument("--max-seq-len", type=int,
                   help="causal LMs with --prompt: context length of the KV cache "
                   "(default: min(512, max_position_embeddings))")
    p.add_argument("--prefill-len", type=int,
                   help="causal LMs with --prompt: tokens per prefill call (default: 32)")
    p.add_argument("--custom-ops", action=argparse.BooleanOptionalAction, default=None,
                   help="causal LMs with --prompt: the KV cache written and read by ExecuTorch's "
                   "LLM custom ops (update_cache, custom_sdpa; the runtime must link them) "
                   "instead of plain ATen ops (default: on for xnnpack, off for portable; qnn "
                   "keeps its cache on the host)")
    p.add_argument("--no-attention-sink", action="store_true",
                   help="qnn causal LMs: the program computes the first token too, instead "
                   "of the host holding the tokenizer's BOS in the cache's first slot, "
                   "computed in float; qnn-prepare --help says more")
    add_inputs_arg(p)
    p.add_argument("--eval", dest="eval_suite", choices=("quick", "full"),
                   help="causal LMs with --prompt: after infer, score the float model, the "
                   "fake-quantized model and the program on the same tokens (KL divergence, "
                   "same top token, perplexity with its interval over a held-out corpus; a "
                   "prompt suite; multiple-choice tasks) into OUT/eval.md and eval.json, and "
                   "judge the evaluation gates; quick reads 2,048 corpus tokens, 10 prompts and "
                   "40 items, full all of them (docs/eval.md)")
    p.add_argument("--eval-file", type=Path,
                   help="with --eval: your own data instead of the shipped one's matching part: "
                   "a text file (the corpus) or JSONL rows of {\"prompt\", \"answers\"}, "
                   "{\"context\", \"choices\", \"answer\"} or {\"text\"}")
    add_htp_performance_mode_arg(p, default=None)
    add_weight_sharing_arg(p)
    add_num_shards_arg(p)
    add_device_args(p)
    add_accuracy_gate_args(p)
    add_generation_args(p)
    add_logging_args(p)
    return p


def _upstream_recipe(from_artifact: Path | None) -> str | None:
    if from_artifact is None or not (from_artifact / MANIFEST_NAME).is_file():
        return None
    manifest = load_manifest(from_artifact, verify=False)
    recipe = manifest.config.get("recipe")
    return str(recipe) if recipe is not None else None


def context_from_args(args: argparse.Namespace) -> PipelineContext:
    """Merge the TOML file (if any) and the flags into one validated context."""
    model = args.model
    recipe = args.recipe or _upstream_recipe(args.from_artifact)
    if model is None and args.from_artifact is not None:
        model = str(args.from_artifact)
    skip = list(args.skip or [])
    if args.from_artifact is not None and recipe in (None, Recipe.FP32.value, Recipe.FP16.value):
        skip.append(Stage.QUANTIZE.value)
        if recipe is None:
            log.warning("--from %s names no recipe and records none: the float model is "
                        "compiled and quantize is skipped; pass --recipe (e.g. 8a8w) to "
                        "quantize it", args.from_artifact)
    generation = generation_values(args)
    overrides: dict[str, dict[str, Any]] = {
        "pipeline": {
            "model": model, "backend": args.backend, "recipe": recipe, "soc": args.soc,
            "out": args.out, "skip": skip or None, "stop_after": args.stop_after,
            "force": args.force or None,
        },
        "prepare": {"seq_len": args.seq_len, "calibration_samples": args.calibration_samples,
                    "calibration_file": args.calibration_file,
                    # A prompt asks for generation: the causal LM is exported with a KV cache.
                    "kv_cache": True if generation is not None else None,
                    "max_seq_len": args.max_seq_len, "prefill_len": args.prefill_len,
                    "custom_ops": args.custom_ops,
                    "attention_sink": False if args.no_attention_sink else None},
        "quantize": {"group_size": args.group_size, "block_size": args.block_size,
                     "group_mapping": args.group_mapping,
                     "embedding_weights": args.embedding_weights,
                     "smooth_blocks": False if args.no_smooth_blocks else None,
                     "layer_recipes": tuple(
                         LayerRecipe.parse(text) for text in args.layer_recipes) or None},
        "compile": {"htp_performance_mode": args.htp_performance_mode,
                    "weight_sharing": args.weight_sharing, "num_shards": args.num_shards},
        "infer": {"runs": args.runs, "threads": args.threads, "device": args.device,
                  "profile": args.profile,
                  "inputs_file": args.inputs,
                  "device_runner": None if args.device_runner is None else str(args.device_runner),
                  "generation": generation, **accuracy_gate_values(args)},
    }
    if args.config is not None:
        return load_pipeline_toml(args.config, overrides)
    return pipeline_from_mapping({}, overrides)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    set_run_timeout(args.run_timeout)
    if args.list_socs:
        from qnn_common.soc import SOCS

        for name in soc_names():
            s = SOCS[name]
            lpai = f", LPAI {s.lpai}" if s.lpai else ""
            print(f"{name:10s} id {s.chipset_id:3d}  HTP {s.htp_arch}  VTCM {s.vtcm_mb} MB{lpai}")
        return 0
    if args.list_models:
        from qnn_prepare.models import BUILTIN_MODELS

        for name, description in BUILTIN_MODELS.items():
            print(f"{name:12s} {description}")
        return 0
    if args.model is None and args.config is None and args.from_artifact is None:
        parser.error("pass --model, --config or --from (see --list-models)")
    check_path_args(args)
    if args.model is not None:
        check_utf8_path(Path(args.model), "--model")  # it may name a directory
    ctx = context_from_args(args)
    check_output_writable(ctx.out_dir, "--out" if args.out is not None else "pipeline.out")
    from qnn_pipeline.orchestrator import run_pipeline  # imports torch

    result = run_pipeline(ctx, from_artifact=args.from_artifact,
                          evaluation=_eval_request(args, ctx))
    print(format_summary(result.summary))
    print(f"summary: {result.summary_path}")
    if result.gate_failure is not None:
        raise result.gate_failure  # exit 2, the numbers and how to relax the gate (run_cli)
    if result.eval_failure is not None:
        raise result.eval_failure
    return 0


def _eval_request(args: argparse.Namespace, ctx: PipelineContext) -> EvalRequest | None:
    """--eval's request, checked before any stage runs."""
    if args.eval_suite is None:
        if args.eval_file is not None:
            raise ConfigValidationError("--eval-file", str(args.eval_file),
                                        "is read by the evaluation: add --eval quick or full")
        return None
    if not ctx.prepare.kv_cache:
        raise ConfigValidationError(
            "--eval", args.eval_suite,
            "evaluates a causal LM exported with its KV cache: add --prompt")
    if ctx.stop_after is not None or Stage.INFER in ctx.skip:
        raise ConfigValidationError("--eval", args.eval_suite,
                                    "runs after infer: drop --stop-after / --skip infer")
    from qnn_infer.evaluation.data import shipped, with_eval_file
    from qnn_infer.evaluation.harness import suite_named
    from qnn_pipeline.evaluation import EvalRequest

    if args.eval_file is not None:
        with_eval_file(shipped(), args.eval_file)  # a bad file fails now, not after compile
    return EvalRequest(suite_named(args.eval_suite), args.eval_file,
                       default_eval_gates(ctx.recipe) if ctx.infer.accuracy_gates else None)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["sweep"]:
        from qnn_pipeline.sweep_cli import sweep_main

        return run_cli(sweep_main, args[1:])
    if args[:1] == ["eval"]:
        from qnn_pipeline.eval_cli import eval_main

        return run_cli(eval_main, args[1:])
    if args[:1] == ["tune"]:
        from qnn_pipeline.tune_cli import tune_main

        return run_cli(tune_main, args[1:])
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
