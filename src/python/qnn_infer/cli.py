"""`qnn-infer`: run a .pte through the ExecuTorch runtime, compare and time it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qnn_common.artifact import Artifact
from qnn_common.cli.support import (
    add_logging_args,
    check_output_writable,
    check_path_args,
    run_cli,
    setup_logging,
    stage_parser,
)
from qnn_common.config import InferConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.gates import AccuracyGates, default_accuracy_gates, next_token_bounds
from qnn_common.llm_spec import GenerationConfig, check_seed
from qnn_common.recipes import Recipe
from qnn_common.reports import InferReport
from qnn_common.stages import InferInput
from qnn_infer.deadline import set_run_timeout
from qnn_infer.gate_check import GATES, LABELS, gate_failure


def _default_gates_text() -> str:
    def gates(recipe: Recipe) -> str:
        values = dataclasses.asdict(default_accuracy_gates(recipe)).items()
        return ", ".join(f"{name.removeprefix('min_')} >= {v:g}" for name, v in values
                         if v is not None and name.startswith("min_"))

    lm = default_accuracy_gates(Recipe.A16W8, causal_lm=True)
    return "; ".join(f"{recipe.value}: {gates(recipe)}" for recipe in Recipe) + (
        f"; causal LMs, quantized: sqnr_db_vs_fake_quant >= "
        f"{lm.min_sqnr_db_vs_fake_quant:g} at most, perplexity_vs_fake_quant <= "
        f"{lm.max_perplexity_vs_fake_quant:g}; causal LMs, KL / same top % vs fp32: "
        + ", ".join(f"{r.value} {b.max_kl_mean:g} / {b.min_same_top_percent:g}"
                    for r in Recipe if (b := next_token_bounds(r)) is not None)
    )


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """The Android device flags, shared with qnn-pipeline."""
    parser.add_argument("--device", metavar="SERIAL",
                        help="run on an Android device over adb (its serial, or 'auto' for the "
                        "only one) instead of the host, where QNN programs run on the x86 HTP "
                        "emulator; QNN programs on a device also need QNN_SDK_ROOT")
    parser.add_argument("--device-runner", type=Path, metavar="BINARY",
                        help="the executor runner built for Android arm64 (e.g. "
                        "qnn_executor_runner), for --device")


def add_threads_arg(parser: argparse.ArgumentParser) -> None:
    """--threads, shared with qnn-pipeline (its TOML key: infer.threads)."""
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads of the runtime on the host (XNNPACK's threadpool; "
                        "default: every core this process may use)")


def add_run_timeout_arg(parser: argparse.ArgumentParser) -> None:
    """--run-timeout, shared with qnn-pipeline: the bound on one run of a method."""
    parser.add_argument("--run-timeout", type=float, metavar="SECONDS",
                        help="end with an error when one run of the program does not return "
                        "within this (default: 600, or $QNN_RUN_TIMEOUT_S; 0 = no bound); the "
                        "QNN emulator can take far longer on some quantized programs")


def add_inputs_arg(parser: argparse.ArgumentParser) -> None:
    """--inputs, shared with qnn-pipeline (there for `--from X.pte`, which brings none)."""
    parser.add_argument("--inputs", type=Path, metavar="FILE.pt",
                        help="a .pt file of inputs (a tensor, a tuple of tensors, or a list of "
                        "those, saved with torch.save) to run instead of the eval inputs; "
                        "needed for a bare .pte")


def add_accuracy_gate_args(parser: argparse.ArgumentParser) -> None:
    """The accuracy-gate flags, shared with qnn-pipeline (its TOML keys are the dest names)."""
    g = parser.add_argument_group(
        "accuracy gates",
        "a run below a gate keeps its outputs but exits with code 2; unset gates take the "
        f"default for the program's recipe ({_default_gates_text()})",
    )
    special = {
        "max_perplexity_vs_fake_quant": ("R", "causal LMs: the highest ratio of the program's "
                                         "perplexity of the held-out text to the fake-quant "
                                         "model's (1.1: 10 %% higher)"),
        "max_kl_vs_fp32": ("NATS", "causal LMs: the highest mean KL divergence of the "
                           "program's next-token distributions from fp32's on the held-out text, "
                           "judged by its interval's low end"),
        "min_same_top_percent_vs_fp32": ("PCT", "causal LMs: the lowest %% of positions where "
                                         "the program's top next token is fp32's, judged by its "
                                         "interval's high end"),
    }
    for name, comparison, metric, flag in GATES:
        if name in special:
            metavar, text = special[name]
            g.add_argument(flag, dest=name, type=float, metavar=metavar, help=text)
            continue
        reference = comparison.removeprefix("vs_").replace("_", "-")
        g.add_argument(flag, dest=name, type=float, metavar="DB" if metric == "sqnr_db" else "C",
                       help=f"minimum {LABELS[metric]} vs the {reference} reference")
    g.add_argument("--no-accuracy-gates", dest="accuracy_gates", action="store_false",
                   default=None, help="report accuracy without checking any gate")


def accuracy_gate_values(args: argparse.Namespace) -> dict[str, Any]:
    """The gate flags as InferConfig fields; None = not given on the command line."""
    names = [f.name for f in dataclasses.fields(AccuracyGates)] + ["accuracy_gates"]
    return {name: getattr(args, name) for name in names}


def add_generation_args(parser: argparse.ArgumentParser) -> None:
    """Flags of text generation over a causal-LM program (prefill + decode)."""
    g = parser.add_argument_group("generation (causal-LM programs)")
    g.add_argument("--prompt", help=f"text to continue (default: {GenerationConfig.prompt!r})")
    g.add_argument("--max-new-tokens", type=int,
                   help=f"default: {GenerationConfig.max_new_tokens}")
    g.add_argument("--temperature", type=float, help="0 = greedy (default); > 0 samples")
    g.add_argument("--top-k", type=int, help="sample among the k most likely (0: all)")
    g.add_argument("--top-p", type=float, help="nucleus sampling mass (default 1.0)")
    g.add_argument("--sample-seed", type=_seed, metavar="N",
                   help="seed of the sampler, in [0, 2**64) (default 0; unused when greedy)")
    g.add_argument("--prompt-decode-up-to", type=int, metavar="N",
                   help="feed a prompt's rest after its whole prefill windows through decode "
                   "when it holds at most N tokens (default: the backend's rule, 4 on xnnpack, 1 "
                   "on qnn and portable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--no-stream", action="store_true",
                   help="do not print tokens as they are generated")


def _seed(text: str) -> int:
    """--sample-seed: refused at the flag (argparse names it), not deep inside generation."""
    try:
        seed = int(text)
        check_seed(seed, "--sample-seed")
    except (ValueError, ConfigValidationError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number in [0, 2**64) (the sampler's generator takes an "
            "unsigned 64-bit seed)"
        ) from None
    return seed


def generation_values(args: argparse.Namespace) -> dict[str, Any] | None:
    """The generation table from the flags (None when none was given)."""
    values = {
        "prompt": args.prompt, "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
        "seed": args.sample_seed, "chat": args.chat or None,
        "prompt_decode_up_to": args.prompt_decode_up_to,
    }
    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return None
    return {**given, "stream": not args.no_stream and not getattr(args, "quiet", False)}


def _generation_config(args: argparse.Namespace) -> GenerationConfig | None:
    values = generation_values(args)
    return None if values is None else GenerationConfig(**values)


def add_profile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="store_true", default=None,
                   help="write profile.md / profile.json beside the run: each op's time per "
                   "run and what runs outside the delegates, from the ETDump (written too) "
                   "read by ExecuTorch's Inspector; a causal LM: a decode step and a prefill "
                   "window, each method traced alone in a table of its own")


def build_parser() -> argparse.ArgumentParser:
    p = stage_parser(
        "qnn-infer",
        "Run an ExecuTorch program on the host runtime (QNN programs on the x86 HTP emulator) or "
        "an Android device. SOURCE is a compile artifact directory (its eval inputs and fp32 / "
        "fake-quant references come along) or any .pte file (then pass --inputs).",
        source_help="compile artifact directory or .pte file", default_out="out/infer",
    )
    add_inputs_arg(p)
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default: 3)")
    p.add_argument("--runs", type=int, default=20, help="timed runs (default: 20)")
    add_threads_arg(p)
    add_run_timeout_arg(p)
    p.add_argument("--etdump", action="store_true", help="write an ETDump profile")
    add_profile_arg(p)
    add_device_args(p)
    add_accuracy_gate_args(p)
    add_generation_args(p)
    add_logging_args(p)
    return p


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    set_run_timeout(args.run_timeout)
    check_path_args(args)
    check_output_writable(args.out, "--out")
    gates = {k: v for k, v in accuracy_gate_values(args).items() if v is not None}
    config = InferConfig(warmup=args.warmup, runs=args.runs, inputs_file=args.inputs,
                         etdump=args.etdump, profile=bool(args.profile), threads=args.threads,
                         device=args.device,
                         device_runner=args.device_runner, **gates,
                         generation=_generation_config(args))
    from qnn_infer.api import run_infer  # torch is imported only past argument checks

    source = Artifact.open(args.source)
    result = run_infer(InferInput(source=source, config=config, out_dir=args.out))
    ran = InferReport.of(result.sealed)
    report: dict[str, Any] = {"latency_ms": dict(ran.latency_ms), "accuracy": ran.accuracy,
                              "accuracy_ok": ran.verdict.ok}
    if ran.generation is not None:
        report["generation"] = ran.generation
    print(json.dumps(report, indent=2))
    failure = gate_failure(result.path, result.sealed)
    if failure is not None:
        raise failure  # exit 2, the numbers and how to relax the gate (run_cli)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())

