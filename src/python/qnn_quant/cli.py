"""`qnn-quant`: post-training quantization of a prepared artifact, with an accuracy report."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from qnn_common.artifact import Artifact
from qnn_common.cli.support import (
    add_logging_args,
    check_output_writable,
    check_path_args,
    run_cli,
    setup_logging,
    stage_parser,
)
from qnn_common.config import DEFAULT_LPBQ_BLOCK, QuantizeConfig
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import Backend, Recipe, WeightRounding, parse_enum
from qnn_common.stages import QuantizeInput
from qnn_common.weight_groups import (
    DEFAULT_EMBEDDING_WEIGHTS,
    DEFAULT_GROUP_SIZE,
    DEFAULT_INT8_WEIGHTS,
    EmbeddingWeights,
    GroupMapping,
)


def build_parser() -> argparse.ArgumentParser:
    p = stage_parser(
        "qnn-quant",
        "Quantize a prepared artifact with PT2E (torchao) and report SQNR / cosine per output "
        "and the layers that lose the most accuracy.",
        source_help="a prepared artifact directory (from qnn-prepare)", default_out="out/quantize",
    )
    p.add_argument("--backend", default=Backend.XNNPACK.value,
                   help=f"quantizer to use: {', '.join(b.value for b in Backend)}")
    p.add_argument("--recipe", default=Recipe.A8W8.value,
                   help=f"one of {', '.join(r.value for r in Recipe if r.is_quantized)}")
    p.add_argument("--soc", help="target SoC (qnn backend), e.g. SM8650")
    p.add_argument("--per-tensor", action="store_true",
                   help="per-tensor weights instead of per-channel")
    p.add_argument("--keep-float", action="append", metavar="REGEX",
                   help="leave layers whose module path matches in float (repeatable); default at "
                   "8-bit activations on xnnpack / portable: BERT FFN down-projections and the "
                   "residual stream's adds; none on qnn, whose HTP runs the program whole "
                   "(qnn_quant.layers.default_keep_float)")
    p.add_argument("--quantize-all", action="store_true",
                   help="quantize every layer the quantizer can (no float layers)")
    p.add_argument("--dynamic", action="append", metavar="REGEX", dest="dynamic_layers",
                   help="quantize the activations of linear layers whose module path matches at "
                   "run time, per call (repeatable; xnnpack / portable only). Default at 8-bit "
                   "activations: BERT encoder blocks' linears (qnn_quant.layers)")
    p.add_argument("--static-only", action="store_true",
                   help="no dynamically quantized layers: every activation scale from calibration")
    p.add_argument("--block-size", type=int, default=DEFAULT_LPBQ_BLOCK,
                   help="16a4w_block: input channels per weight scale block (default: %(default)s)")
    p.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE,
                   help="8da4w: input channels per 4-bit weight scale; a multiple of 32 on "
                   "xnnpack (default: %(default)s, as ExecuTorch's LLM export)")
    p.add_argument("--group-mapping", choices=[m.value for m in GroupMapping],
                   help="8da4w and 16a4w_block: a 4-bit group's (LPBQ block's) levels from its "
                   "minimum to its maximum (asymmetric: GGUF Q4_1's and GPTQ checkpoints' "
                   "form, run as a symmetric GEMM plus each group's offset times its inputs' "
                   "sum) or symmetric around 0 (upstream's: 8da4w's HQQ scales, LPBQ's "
                   "block maxima; one GEMM). Default: asymmetric for 8da4w, symmetric "
                   "for 16a4w_block")
    p.add_argument("--int8-weights", action="append", metavar="REGEX",
                   help="8da4w and 16a4w_block: give linear layers whose module path matches "
                   "8-bit weights, one scale per output channel, instead of 4-bit groups or "
                   "LPBQ blocks (repeatable). Default: a causal LM's output head "
                   f"({', '.join(DEFAULT_INT8_WEIGHTS)}); --int8-weights '' for none")
    p.add_argument("--embedding-weights", choices=[e.value for e in EmbeddingWeights],
                   default=DEFAULT_EMBEDDING_WEIGHTS.value,
                   help="8da4w: embedding tables as int8 (8w) or 4-bit asymmetric (4w) "
                   "groups of --group-size channels, or float; looked up by ExecuTorch's "
                   "quantized embedding kernels (upstream's --qembedding). Default: %(default)s")
    p.add_argument("--no-smooth-blocks", action="store_true",
                   help="8da4w, causal LMs: keep the blocks of large activations as they are "
                   "(upstream's plain 8da4w). By default, a few calibration texts choose a "
                   "power of two to divide the largest block of each linear input by where it "
                   "is made (a norm's weight, a gated MLP's up rows), multiplied back into the "
                   "weights that read it: the same float model, a finer per-token int8 "
                   "rounding of the other channels")
    p.add_argument("--weight-rounding", choices=[r.value for r in WeightRounding],
                   help="how weights are rounded onto their grid: nearest, or gptq (error "
                   "feedback from calibration inputs, linear layers). Default: gptq for 4-bit "
                   "weights (16a4w, 8a4w; 16a4w_block onto its block scales), nearest otherwise")
    p.add_argument("--layer-recipe", action="append", metavar="PATTERN=RECIPE",
                   dest="layer_recipes", default=[],
                   help="give layers whose module path matches PATTERN (a regex) RECIPE instead "
                   "of --recipe (repeatable; the first match wins): fp32 (float) anywhere, or on "
                   "qnn a recipe with the same activation bits, e.g. "
                   "'layers\\.[0-3]\\.mlp\\.down_proj$=16a8w' in a 16a4w_block program "
                   "(qnn_common.layer_recipes)")
    p.add_argument("--report-layers", type=int, default=10,
                   help="how many worst layers to report (default: %(default)s)")
    add_logging_args(p)
    return p


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    check_path_args(args)
    check_output_writable(args.out, "--out")
    config = QuantizeConfig(
        backend=parse_enum(Backend, args.backend, "--backend"),
        recipe=parse_enum(Recipe, args.recipe, "--recipe"),
        soc=args.soc,
        per_channel=not args.per_tensor,
        block_size=args.block_size,
        group_size=args.group_size,
        group_mapping=None if args.group_mapping is None else parse_enum(
            GroupMapping, args.group_mapping, "--group-mapping"),
        embedding_weights=parse_enum(
            EmbeddingWeights, args.embedding_weights, "--embedding-weights"),
        int8_weights=None if args.int8_weights is None else tuple(
            p for p in args.int8_weights if p
        ),
        smooth_blocks=not args.no_smooth_blocks,
        report_layers=args.report_layers,
        weight_rounding=None if args.weight_rounding is None else WeightRounding(
            args.weight_rounding),
        keep_float=() if args.quantize_all else (
            None if args.keep_float is None else tuple(args.keep_float)
        ),
        dynamic_layers=() if args.static_only else (
            None if args.dynamic_layers is None else tuple(args.dynamic_layers)
        ),
        layer_recipes=tuple(LayerRecipe.parse(text) for text in args.layer_recipes),
    )
    from qnn_quant.api import run_quantize  # torch is imported only past argument checks

    source = Artifact.open(args.source)
    result = run_quantize(QuantizeInput(source=source, config=config, out_dir=args.out))
    print(json.dumps(result.metrics("accuracy"), indent=2))
    print(f"quantized -> {result.path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
