"""`qnn-prepare`: load a model and write a prepared artifact (exported program + samples)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from qnn_common.cli.support import (
    add_logging_args,
    check_output_writable,
    check_path_args,
    check_utf8_path,
    command_parser,
    run_cli,
    setup_logging,
)
from qnn_common.config import DEFAULT_SEED, PrepareConfig
from qnn_common.stages import PrepareInput


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "qnn-prepare",
        "Load a model, export it with torch.export, and write calibration and evaluation samples "
        "plus fp32 reference outputs into an artifact directory.",
    )
    p.add_argument(
        "--model",
        help="built-in name (see --list-models), a local Hugging Face directory, "
        "or package.module:function returning (module, args) or (module, args, kwargs)",
    )
    p.add_argument("--list-models", action="store_true", help="list built-in models and exit")
    p.add_argument("-o", "--out", type=Path, default=Path("out/prepare"),
                   help="artifact directory to write (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=128, help="token length for text models")
    p.add_argument("--calibration-samples", type=int, default=16)
    p.add_argument("--eval-samples", type=int, default=4,
                   help="held-out samples for accuracy checks (the first is the example input)")
    p.add_argument("--calibration-file", type=Path,
                   help="a .txt file (one sample per line, text models) or a .pt file of inputs")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    llm = p.add_argument_group("causal LMs")
    llm.add_argument("--kv-cache", action="store_true",
                     help="export prefill + decode methods over a static KV cache (generation)")
    llm.add_argument("--kv-io", action="store_true",
                     help="with --kv-cache: the cache as the methods' inputs and outputs, kept "
                     "by the host (what the qnn backend needs: QNN has no mutable buffers; "
                     "qnn-pipeline sets it for --backend qnn)")
    llm.add_argument("--custom-ops", action="store_true",
                     help="with --kv-cache: write and read the cache with ExecuTorch's LLM "
                     "custom ops (update_cache, custom_sdpa), as its Llama export does for "
                     "XNNPACK; the runtime must link them (qnn-pipeline sets it for --backend "
                     "xnnpack)")
    llm.add_argument("--max-seq-len", type=int,
                     help="context length of the cache (default: min(512, "
                     "max_position_embeddings))")
    llm.add_argument("--prefill-len", type=int, help="tokens per prefill call (default: 32)")
    llm.add_argument("--no-attention-sink", action="store_true",
                     help="with --kv-io: compute every token in the program, the first one "
                     "too; by default the cache's first slot holds the tokenizer's BOS token, "
                     "computed here in float, and every text follows it, so the program never "
                     "computes the first token's outsized activations and 16-bit activations "
                     "get a finer grid")
    add_logging_args(p)
    return p


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    check_path_args(args)
    # Imported here so that --help answers without importing torch.
    from qnn_prepare.api import run_prepare
    from qnn_prepare.models import BUILTIN_MODELS

    if args.list_models:
        for name, description in BUILTIN_MODELS.items():
            print(f"{name:12s} {description}")
        return 0
    if not args.model:
        build_parser().error("--model is required (or --list-models)")
    check_utf8_path(Path(args.model), "--model")  # it may name a directory
    check_output_writable(args.out, "--out")
    config = PrepareConfig(
        model=args.model,
        seq_len=args.seq_len,
        calibration_samples=args.calibration_samples,
        eval_samples=args.eval_samples,
        calibration_file=args.calibration_file,
        seed=args.seed,
        kv_cache=args.kv_cache,
        kv_io=args.kv_io,
        custom_ops=args.custom_ops,
        max_seq_len=args.max_seq_len,
        prefill_len=args.prefill_len,
        attention_sink=not args.no_attention_sink,
    )
    result = run_prepare(PrepareInput(config=config, out_dir=args.out))
    print(f"prepared {args.model} -> {result.path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
