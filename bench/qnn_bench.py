"""Benchmark: the QNN HTP backend per model x recipe x SoC, on the x86 HTP emulator.

Run: `./pants run bench/qnn_bench.py -- --models tiny-cnn tiny-llama --recipes fp16 16a8w
--socs SM8650 SM8550 SM8850`

Per cell, in one process: the compile stage's seconds (HTP context build included), the .pte size,
the emulator's latency p50 and the accuracy against fp32 (and against fake quant for quantized
recipes). Prepare and quantize run once per model (and recipe) and are shared across SoCs, as the
pipeline's cache shares them. The emulator is an x86 simulation of the HTP: its latency says
nothing about a phone's, only about relative cost between recipes on this host; the XNNPACK row
for the same model is printed beside it for scale.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from qnn_common.cli.support import add_logging_args, setup_logging
from qnn_common.config import Stage
from qnn_common.qnn_sdk import find_qnn_sdk
from qnn_common.recipes import Backend, Recipe
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline


def cell(out: Path, model: str, backend: Backend, recipe: Recipe, soc: str | None,
         seq_len: int, runs: int) -> dict[str, Any]:
    ctx = PipelineContext.create(
        model, backend=backend, recipe=recipe, soc=soc, out_dir=out,
        prepare={"seq_len": seq_len, "calibration_samples": 8, "eval_samples": 2},
        quantize={"report_layers": 0} if recipe.is_quantized else None,
        # A bench reports numbers; the gates belong to the tests and to users' runs.
        infer={"runs": runs, "warmup": 1, "accuracy_gates": False},
    )
    result = run_pipeline(ctx).checked()
    seconds = {r.stage.value: r.seconds for r in result.records}
    s = result.summary
    return {
        "model": model, "backend": backend.value, "recipe": recipe.value, "soc": soc,
        "compile_s": seconds[Stage.COMPILE.value],
        "pte_bytes": s["pte_bytes"],
        "p50_ms": s["latency_ms"]["p50"],
        "sqnr_db_vs_fp32": s["accuracy"]["sqnr_db_vs_fp32"],
        "cosine_vs_fp32": s["accuracy"]["cosine_vs_fp32"],
        "sqnr_db_vs_fake_quant": s["accuracy"]["sqnr_db_vs_fake_quant"],
        "delegated_ops": s["delegated_ops"],
        "non_delegated_ops": s["non_delegated_ops"],
    }


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else value if isinstance(value, str) else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny-cnn", "tiny-llama"])
    parser.add_argument("--recipes", nargs="+", default=["fp16", "8a8w", "16a8w", "16a4w"])
    parser.add_argument("--socs", nargs="+", default=["SM8650", "SM8550", "SM8850"])
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the results here")
    add_logging_args(parser)
    args = parser.parse_args()
    # The table is the output: stage logs and third-party noise (library FutureWarnings by the
    # dozen, see qnn_common.cli.noise) only with -v.
    setup_logging(args.verbose, quiet=not args.verbose)
    sdk = find_qnn_sdk()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        for model in args.models:
            rows.append(cell(out, model, Backend.XNNPACK, Recipe.FP32, None, args.seq_len,
                             args.runs))
            for recipe in (Recipe(r) for r in args.recipes):
                for soc in args.socs:
                    rows.append(cell(out, model, Backend.QNN, recipe, soc, args.seq_len,
                                     args.runs))
    print(f"QNN {sdk.qnn_version} ({sdk.source}); x86 HTP emulator; seq_len {args.seq_len}")
    print("| model | target | recipe | compile s | .pte KiB | p50 ms | SQNR vs fp32 dB | "
          "cosine vs fp32 | SQNR vs fake-quant dB | ops delegated / not |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        target = r["backend"] + (f"/{r['soc']}" if r["soc"] else "")
        print(f"| {r['model']} | {target} | {r['recipe']} | {r['compile_s']:.1f} | "
              f"{r['pte_bytes'] / 1024:,.0f} | {_fmt(r['p50_ms'], '.2f')} | "
              f"{_fmt(r['sqnr_db_vs_fp32'], '.1f')} | {_fmt(r['cosine_vs_fp32'], '.4f')} | "
              f"{_fmt(r['sqnr_db_vs_fake_quant'], '.1f')} | "
              f"{r['delegated_ops']} / {r['non_delegated_ops']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
