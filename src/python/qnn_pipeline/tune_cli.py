"""`qnn-pipeline tune`: search per-layer recipes to a budget (`qnn_pipeline.tune`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qnn_common.cli.support import (
    add_logging_args,
    check_output_writable,
    check_path_args,
    command_parser,
    setup_logging,
)
from qnn_common.config.toml_file import read_toml
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import soc_names

EPILOG = """examples:
  qnn-pipeline tune --model smollm2-135m --backend qnn --soc SM8650 --recipe 16a4w_block \\
      --max-kl 0.01 --max-seq-len 256
  qnn-pipeline tune --model tiny-llama --max-kl 0.05          # XNNPACK 8a8w, layers to fp32
  qnn-pipeline tune --config base.toml --max-weight-mb 40      # the most accurate that fits

Each layer group (a decoder block's attention projections, its MLP, the head) starts at
--recipe and is promoted to --promote-to in the order of what it buys per byte (a sensitivity
pass on the fake-quantized model); every candidate the search stops at is quantized for real and
scored on the same corpus tokens (KL divergence from fp32). OUT/tune/ gets front.md (the
verified candidates, the Pareto front, the winner), front.json, front.svg and recipe.toml, which
`qnn-pipeline --config OUT/tune/recipe.toml` rebuilds. Run again, it reuses every artifact and
score it made (docs/tune.md).

"""


def build_tune_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "qnn-pipeline tune",
        "Find the per-layer recipe that meets a budget (KL divergence from the float model, "
        "weight bytes), verified by quantizing and scoring every candidate it settles on.",
        EPILOG,
    )
    p.add_argument("--model", help="a causal LM: built-in name or Hugging Face directory")
    p.add_argument("--config", type=Path,
                   help="a pipeline TOML every candidate starts from (its settings kept; the "
                   "flags below win)")
    p.add_argument("--backend", choices=[b.value for b in Backend],
                   help="default: the config's, else xnnpack")
    p.add_argument("--soc", help=f"for qnn: one of {', '.join(soc_names())}")
    p.add_argument("--recipe", choices=[r.value for r in Recipe],
                   help="the cheap recipe every group starts at (default: the config's, else "
                   "8a8w; on the HTP 16a4w_block is the usual start)")
    p.add_argument("--promote-to", choices=[r.value for r in Recipe],
                   help="the recipe a promoted group takes (default: the next one up that mixes "
                   "with --recipe: 16a8w for 16a4w_block, fp32 for 8a8w)")
    p.add_argument("--max-kl", type=float,
                   help="mean KL divergence from fp32 the winner may have (nats per token)")
    p.add_argument("--max-weight-mb", type=float,
                   help="the searched layers' weights may take at most this many MB (10^6 bytes)")
    p.add_argument("--tokens", type=int, default=1024,
                   help="corpus tokens every candidate is scored on (default: 1024)")
    p.add_argument("--eval-file", type=Path,
                   help="your own text to score on instead of the shipped held-out corpus")
    p.add_argument("--max-seq-len", type=int, help="the exported context (tokens)")
    p.add_argument("--calibration-samples", type=int, help="calibration windows per candidate")
    p.add_argument("--no-compile", action="store_true",
                   help="stop at the verified winner's quantize artifact (no program)")
    p.add_argument("--out", type=Path, default=Path("out-tune"),
                   help="where the candidates' artifacts (OUT/runs) and the report (OUT/tune) go")
    p.add_argument("--force", action="store_true", help="score every candidate again")
    add_logging_args(p)
    return p


def tune_main(argv: Sequence[str] | None = None) -> int:
    args = build_tune_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    check_path_args(args)
    check_output_writable(args.out, "--out")
    base: dict[str, Any] = {} if args.config is None else read_toml(args.config)
    sections: dict[str, dict[str, Any]] = {k: dict(v) for k, v in base.items()}
    top = sections.setdefault("pipeline", {})
    for key, value in (("model", args.model), ("backend", args.backend), ("soc", args.soc),
                       ("recipe", args.recipe)):
        if value is not None:
            top[key] = value
    prepare = sections.setdefault("prepare", {})
    if args.max_seq_len is not None:
        prepare["max_seq_len"] = args.max_seq_len
    if args.calibration_samples is not None:
        prepare["calibration_samples"] = args.calibration_samples

    from qnn_common.errors import ConfigValidationError
    from qnn_pipeline.tune.run import TuneRequest, tune
    from qnn_pipeline.tune.search import Budget

    if "model" not in top:
        raise ConfigValidationError("--model", None, "required (or pipeline.model in --config)")
    budget = Budget(args.max_kl, None if args.max_weight_mb is None
                    else int(args.max_weight_mb * 1e6))
    found = tune(TuneRequest(
        sections, args.out, budget,
        promote_to=None if args.promote_to is None else Recipe(args.promote_to),
        tokens=args.tokens, eval_file=args.eval_file, compile_winner=not args.no_compile,
        force=args.force))
    report = args.out / "tune"
    if found.winner is None:
        print(f"no candidate meets the budget; the front: {report / 'front.md'}")
        return 1
    w = found.winner
    print(f"winner: {w.promoted} of {len(found.plan.order)} groups at "
          f"{found.plan.rich.value}, KL {w.score.kl:.5f} [{w.score.kl_low:.5f}, "
          f"{w.score.kl_high:.5f}] on {w.score.tokens} tokens, searched weights "
          f"{w.weight_bytes / 1e6:.2f} MB; {len(found.verified)} candidates verified")
    print(f"report: {report / 'front.md'}; rebuild: qnn-pipeline --config "
          f"{report / 'recipe.toml'}")
    return 0
