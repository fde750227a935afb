"""Benchmark: our pipeline vs. the same plain ExecuTorch calls, and the .pte vs. eager PyTorch.

Run: `./pants run bench/pipeline_bench.py -- --models tiny-cnn minilm`

For each model, in one process (the machines are noisy, so only ratios measured side by side are
reported):
- the pipeline's per-stage seconds (fresh output directory, so every stage runs);
- the plain script: the same export -> PT2E quantize -> lower -> to_executorch -> execute calls
  with nothing around them (no manifests, hashing, references, reports);
- the .pte's latency p50 vs. eager fp32 PyTorch on the same input and run count.

What the pipeline does on top of the plain calls, and the plain script does not: save and reload
the program between stages, fp32 and fake-quant reference outputs, the accuracy report (its
per-layer part is the "accuracy report s" column), hashing and manifests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from qnn_common.cli_support import add_logging_args, setup_logging
from qnn_common.config import CompileConfig, PipelineContext, Stage
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_infer.measure import measure_latency
from qnn_infer.runner import HostRunner
from qnn_pipeline.orchestrator import run_pipeline
from qnn_prepare.calibration import make_calibration
from qnn_prepare.models import load_model
from qnn_quant.pt2e import quantize_program


def _plain(model_name: str, seq_len: int, samples: int, runs: int, workdir: Path) -> dict[str, Any]:
    """The bare calls, timed the same way; quantize_program wraps prepare/convert_pt2e only."""
    t0 = time.perf_counter()
    model = load_model(model_name, seq_len=seq_len)
    program = torch.export.export(model.module, model.example_inputs, strict=False)
    calibration = make_calibration(model, num_samples=samples, source=None, seed=1126)
    quantized = quantize_program(program, target=Target(Backend.XNNPACK), recipe=Recipe.A8W8,
                                 calibration=calibration, progress=False)
    pte = workdir / "plain.pte"
    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.A8W8))
    pte.write_bytes(lower_program(quantized, lowering).pte)
    runner = HostRunner(pte)
    runner.run(tuple(model.example_inputs))
    # The pipeline's infer stage times `runs` executions too; so does the plain script.
    latency = measure_latency(runner, tuple(model.example_inputs), warmup=3, runs=runs)
    total = time.perf_counter() - t0
    return {"total_s": total, "pte_p50_ms": latency["p50_ms"], "model": model}


def _eager_p50_ms(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], runs: int) -> float:
    times = []
    with torch.no_grad():
        for _ in range(3):
            module(*inputs)
        for _ in range(runs):
            t = time.perf_counter()
            module(*inputs)
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bench(model_name: str, seq_len: int, samples: int, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ctx = PipelineContext.create(
            model_name, out_dir=Path(tmp) / "out", force=True,
            prepare={"seq_len": seq_len, "calibration_samples": samples},
            infer={"runs": runs},
        )
        t0 = time.perf_counter()
        result = run_pipeline(ctx)
        ours = time.perf_counter() - t0
        report_s = _quantize_timing(result, "report_s")
        plain = _plain(model_name, seq_len, samples, runs, Path(tmp))
    model = plain["model"]
    eager = _eager_p50_ms(model.module, tuple(model.example_inputs), runs)
    stages = {r.stage.value: r.seconds for r in result.records}
    pte_p50 = result.summary["latency_ms"]["p50"]
    return {
        "model": model_name,
        "stages_s": stages,
        "pipeline_total_s": round(ours, 2),
        "plain_total_s": round(plain["total_s"], 2),
        "pipeline_vs_plain": round(ours / plain["total_s"], 3),
        # The per-layer accuracy report is work the plain script does not do at all.
        "accuracy_report_s": report_s,
        "pte_p50_ms": pte_p50,
        "eager_fp32_p50_ms": round(eager, 3),
        "pte_vs_eager_fp32": round(pte_p50 / eager, 3),
        "accuracy": result.summary["accuracy"],
    }


def _quantize_timing(result: Any, key: str) -> float | None:
    from qnn_common.manifest import load_manifest

    record = next(r for r in result.records if r.stage is Stage.QUANTIZE)
    return load_manifest(record.artifact, verify=False).timings.get(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny-cnn", "minilm"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--calibration-samples", type=int, default=16)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", type=Path, help="also write the results here")
    add_logging_args(parser)
    args = parser.parse_args()
    # The table is the output: stage logs and third-party noise (library FutureWarnings by the
    # dozen, see qnn_common.noise) only with -v.
    setup_logging(args.verbose, quiet=not args.verbose)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    # One untimed pass first: imports, kernel registration and the first lowering's one-time
    # setup would otherwise be charged to whichever side runs first.
    with tempfile.TemporaryDirectory() as tmp:
        _plain("tiny-cnn", args.seq_len, 2, 1, Path(tmp))
    for model in args.models:
        load_model(model, seq_len=args.seq_len)  # warm the page cache and lazy imports
    rows = [bench(m, args.seq_len, args.calibration_samples, args.runs) for m in args.models]
    print("| model | prepare s | quantize s | compile s | infer s | pipeline s | plain s | "
          "pipeline/plain | of which accuracy report s | .pte p50 ms | eager fp32 p50 ms | "
          ".pte/eager |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["stages_s"]
        print(f"| {r['model']} | {s['prepare']:.1f} | {s['quantize']:.1f} | {s['compile']:.1f} | "
              f"{s['infer']:.1f} | {r['pipeline_total_s']:.1f} | {r['plain_total_s']:.1f} | "
              f"{r['pipeline_vs_plain']:.2f}x | {r['accuracy_report_s']} | {r['pte_p50_ms']:.2f} | "
              f"{r['eager_fp32_p50_ms']:.2f} | {r['pte_vs_eager_fp32']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
