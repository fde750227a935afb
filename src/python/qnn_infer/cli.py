"""`qnn-infer`: run a .pte through the ExecuTorch runtime, compare and time it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from qnn_common.cli_support import add_logging_args, run_cli, setup_logging
from qnn_common.config import InferConfig
from qnn_common.stages import InferInput


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qnn-infer",
        description="Run an ExecuTorch program on the host runtime (QNN programs on the x86 HTP "
        "emulator) or an Android device. SOURCE is a compile "
        "artifact directory (its eval inputs and fp32 / fake-quant references come along) or "
        "any .pte file (then pass --inputs).",
    )
    p.add_argument("source", type=Path, help="compile artifact directory or .pte file")
    p.add_argument("-o", "--out", type=Path, default=Path("out/infer"),
                   help="artifact directory to write (default: %(default)s)")
    p.add_argument("--inputs", type=Path,
                   help="a .pt file of inputs: a tensor, a tuple of tensors, or a list of those")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default: 3)")
    p.add_argument("--runs", type=int, default=20, help="timed runs (default: 20)")
    p.add_argument("--etdump", action="store_true", help="write an ETDump profile")
    p.add_argument("--device", metavar="SERIAL",
                   help="run on an Android device over adb (its serial, or 'auto' for the only "
                   "one) instead of the host; QNN programs also need QNN_SDK_ROOT")
    p.add_argument("--device-runner", type=Path, metavar="BINARY",
                   help="the executor runner built for Android arm64 (e.g. qnn_executor_runner)")
    add_logging_args(p)
    return p


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    config = InferConfig(warmup=args.warmup, runs=args.runs, inputs_file=args.inputs,
                         etdump=args.etdump, device=args.device,
                         device_runner=args.device_runner)
    from qnn_infer.api import run_infer  # torch is imported only past argument checks

    result = run_infer(InferInput(source=args.source, config=config, out_dir=args.out))
    print(json.dumps({"latency_ms": result.latency_ms, "accuracy": result.accuracy}, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
