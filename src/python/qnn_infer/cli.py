"""`qnn-infer`: run a .pte through the ExecuTorch runtime, compare and time it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qnn_common.cli_support import add_logging_args, run_cli, setup_logging
from qnn_common.config import InferConfig
from qnn_common.gates import AccuracyGates, default_accuracy_gates
from qnn_common.recipes import Recipe
from qnn_common.stages import InferInput
from qnn_infer.gates import GATES, LABELS


def _default_gates_text() -> str:
    def gates(recipe: Recipe) -> str:
        values = dataclasses.asdict(default_accuracy_gates(recipe)).items()
        return ", ".join(f"{name.removeprefix('min_')} >= {v:g}" for name, v in values
                         if v is not None)

    return "; ".join(f"{recipe.value}: {gates(recipe)}" for recipe in Recipe)


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """The Android device flags, shared with qnn-pipeline."""
    parser.add_argument("--device", metavar="SERIAL",
                        help="run on an Android device over adb (its serial, or 'auto' for the "
                        "only one) instead of the host, where QNN programs run on the x86 HTP "
                        "emulator; QNN programs on a device also need QNN_SDK_ROOT")
    parser.add_argument("--device-runner", type=Path, metavar="BINARY",
                        help="the executor runner built for Android arm64 (e.g. "
                        "qnn_executor_runner), for --device")


def add_accuracy_gate_args(parser: argparse.ArgumentParser) -> None:
    """The accuracy-gate flags, shared with qnn-pipeline (its TOML keys are the dest names)."""
    g = parser.add_argument_group(
        "accuracy gates",
        "a run below a gate keeps its outputs but exits with code 2; unset gates take the "
        f"default for the program's recipe ({_default_gates_text()})",
    )
    for name, comparison, metric, flag in GATES:
        reference = comparison.removeprefix("vs_").replace("_", "-")
        g.add_argument(flag, dest=name, type=float, metavar="DB" if metric == "sqnr_db" else "C",
                       help=f"minimum {LABELS[metric]} vs the {reference} reference")
    g.add_argument("--no-accuracy-gates", dest="accuracy_gates", action="store_false",
                   default=None, help="report accuracy without checking any gate")


def accuracy_gate_values(args: argparse.Namespace) -> dict[str, Any]:
    """The gate flags as InferConfig fields; None = not given on the command line."""
    names = [f.name for f in dataclasses.fields(AccuracyGates)] + ["accuracy_gates"]
    return {name: getattr(args, name) for name in names}


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
    add_device_args(p)
    add_accuracy_gate_args(p)
    add_logging_args(p)
    return p


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    gates = {k: v for k, v in accuracy_gate_values(args).items() if v is not None}
    config = InferConfig(warmup=args.warmup, runs=args.runs, inputs_file=args.inputs,
                         etdump=args.etdump, device=args.device,
                         device_runner=args.device_runner, **gates)
    from qnn_infer.api import run_infer  # torch is imported only past argument checks

    result = run_infer(InferInput(source=args.source, config=config, out_dir=args.out))
    print(json.dumps({"latency_ms": result.latency_ms, "accuracy": result.accuracy,
                      "accuracy_ok": result.manifest.metrics["accuracy_gates"]["ok"]}, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
