"""`qnn-prepare`: load a model and write a prepared artifact (exported program + samples)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from qnn_common.cli_support import add_logging_args, run_cli, setup_logging
from qnn_common.config import DEFAULT_SEED, PrepareConfig
from qnn_common.stages import PrepareInput


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qnn-prepare",
        description="Load a model, export it with torch.export, and write calibration and "
        "evaluation samples plus fp32 reference outputs into an artifact directory.",
    )
    p.add_argument(
        "--model",
        help="built-in name (see --list-models), a local Hugging Face directory, "
        "or package.module:function returning (module, example_inputs)",
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
    add_logging_args(p)
    return p


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    # Imported here so that --help answers without importing torch.
    from qnn_prepare.api import run_prepare
    from qnn_prepare.models import BUILTIN_MODELS

    if args.list_models:
        for name, description in BUILTIN_MODELS.items():
            print(f"{name:12s} {description}")
        return 0
    if not args.model:
        build_parser().error("--model is required (or --list-models)")
    config = PrepareConfig(
        model=args.model,
        seq_len=args.seq_len,
        calibration_samples=args.calibration_samples,
        eval_samples=args.eval_samples,
        calibration_file=args.calibration_file,
        seed=args.seed,
    )
    result = run_prepare(PrepareInput(config=config, out_dir=args.out))
    print(f"prepared {args.model} -> {result.artifact_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
