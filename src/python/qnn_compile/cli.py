"""`qnn-compile`: lower an exported program (.pt2 or artifact directory) to an ExecuTorch .pte."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from qnn_common.artifact import Artifact
from qnn_common.cli.support import (
    add_logging_args,
    check_output_writable,
    check_path_args,
    run_cli,
    setup_logging,
    stage_parser,
)
from qnn_common.config import (
    DEFAULT_HTP_PERFORMANCE_MODE,
    HTP_PERFORMANCE_MODES,
    CompileConfig,
    Stage,
)
from qnn_common.manifest import MANIFEST_NAME
from qnn_common.recipes import BACKENDS, Backend, Recipe, parse_enum
from qnn_common.stages import PTE, CompileInput


def add_htp_performance_mode_arg(parser: argparse.ArgumentParser, default: str | None) -> None:
    """--htp-performance-mode, shared with qnn-pipeline (there None: the TOML file's or burst)."""
    parser.add_argument("--htp-performance-mode", default=default, choices=HTP_PERFORMANCE_MODES,
                        metavar="MODE",
                        help="qnn: the HTP power / clock vote built into the program "
                        f"({', '.join(HTP_PERFORMANCE_MODES)}; default: "
                        f"{DEFAULT_HTP_PERFORMANCE_MODE})")


def add_weight_sharing_arg(parser: argparse.ArgumentParser) -> None:
    """--weight-sharing, shared with qnn-pipeline."""
    parser.add_argument("--weight-sharing", action="store_true", default=None,
                        help="qnn, causal LMs: prefill and decode share one copy of the weights "
                        "in the context binary (about half the .pte; HTP >= V73). For a device "
                        "only: the x86 HTP emulator cannot load such a program")


def add_num_shards_arg(parser: argparse.ArgumentParser) -> None:
    """--num-shards, shared with qnn-pipeline."""
    parser.add_argument("--num-shards", type=_shards, default=None, metavar="N|auto",
                        help="qnn, causal LMs: split the decoder's layers into N HTP contexts per "
                        "method (near-equal layer counts; embedding with the first, output head "
                        "with the last), chained in the one .pte: what keeps each context under "
                        "a device's limit (about 4 GB). auto: the fewest whose estimated sizes "
                        "fit, printed before compiling. Default: 1")


def _shards(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of shards or 'auto'") from None


def build_parser() -> argparse.ArgumentParser:
    p = stage_parser(
        "qnn-compile",
        "Lower an exported program to an ExecuTorch .pte. SOURCE is a prepare or quantize "
        "artifact directory, or any .pt2 written by torch.export.save.",
        source_help="artifact directory or .pt2 file", default_out="out/compile",
    )
    p.add_argument("--backend", default=Backend.XNNPACK.value,
                   help=f"{', '.join(b.value for b in Backend)} (default: %(default)s)")
    p.add_argument("--recipe", help="precision the program carries (default: the quantize "
                   "artifact's recipe, else fp32; fp16 on qnn)")
    p.add_argument("--soc", help="target SoC (qnn backend), e.g. SM8650; the HTP arch and VTCM "
                   "size come from the SoC table")
    add_htp_performance_mode_arg(p, default=DEFAULT_HTP_PERFORMANCE_MODE)
    add_weight_sharing_arg(p)
    add_num_shards_arg(p)
    p.add_argument("--context-cache", type=Path, metavar="DIR",
                   help="qnn: keep each HTP context built in DIR, as soon as it is built, and "
                   "reuse those built before: a compile killed at shard k resumes there, and a "
                   "program changed in some layers rebuilds only the contexts that changed "
                   "(least recently used evicted beyond 8 GiB). qnn-pipeline keeps one under "
                   "its output directory. Default: none")
    p.add_argument("--etrecord", action="store_true", help="also write an ETRecord for devtools")
    add_logging_args(p)
    return p


def _default_recipe(source: Path, backend: Backend) -> Recipe:
    manifest = source / MANIFEST_NAME
    if source.is_dir() and manifest.is_file():
        from qnn_common.sealing import load_manifest

        upstream = load_manifest(source, verify=False)
        if upstream.stage == Stage.QUANTIZE:
            return Recipe(upstream.config["recipe"])
    return BACKENDS[backend].float_recipe


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    check_path_args(args)
    check_output_writable(args.out, "--out")
    backend = parse_enum(Backend, args.backend, "--backend")
    recipe = (
        parse_enum(Recipe, args.recipe, "--recipe")
        if args.recipe is not None
        else _default_recipe(args.source, backend)
    )
    config = CompileConfig(backend=backend, recipe=recipe, soc=args.soc, etrecord=args.etrecord,
                           htp_performance_mode=args.htp_performance_mode,
                           weight_sharing=bool(args.weight_sharing),
                           num_shards=args.num_shards if args.num_shards is not None else 1)
    from qnn_compile.api import run_compile  # torch is imported only past argument checks

    source = Artifact.open(args.source)
    result = run_compile(CompileInput(source=source, config=config, out_dir=args.out,
                                      context_cache=args.context_cache))
    m = result.sealed.metrics
    print(
        f"compiled -> {result.path / PTE} ({m['pte_bytes']} bytes, "
        f"{m['delegated_ops']} ops delegated, {m['non_delegated_ops']} not)"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
