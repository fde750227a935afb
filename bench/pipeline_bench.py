"""Benchmark: our pipeline vs. the same plain ExecuTorch calls, and the .pte vs. eager PyTorch.

Run: `./pants run bench/pipeline_bench.py -- --models tiny-cnn minilm --json bench.json`
(`--backend qnn --soc SM8650`: the HTP on the x86 emulator, against upstream's own QNN calls).

For each model and recipe (XNNPACK: 8a8w and fp32 by default; QNN: fp16, 8a8w and 16a8w), in
one process (the machines are noisy, so only ratios measured side by side are reported):
- the pipeline's per-stage seconds (fresh output directory, so every stage runs);
- the plain script (QNN: qnn_plain_calls.py, upstream's QNN calls with their defaults; both
  programs' first output on the example input is scored against eager fp32): the same export ->
  PT2E quantize -> lower -> to_executorch -> execute calls with nothing around them (no
  manifests, hashing, references, reports), lowering as stock torch does it
  (`share_provenance=False`: every pass deep-copies every node's provenance, which the compile
  stage skips, see qnn_compile.node_sources; `materialize_cia_once=False`: torch walks its CIA
  ops once per op namespace per decomposition, see qnn_compile.cia_ops);
- the .pte's latency p50 / p90 vs. eager fp32 PyTorch on the same input, threads and run count;
- with `--rss` (default: minilm), each stage again as its own CLI process, for its peak RSS
  (`stage_process.run_stage`);
- then, per model, every recipe's .pte and eager fp32 timed side by side in `--latency-rounds`
  interleaved rounds (`latency_rounds.py`): each ratio (.pte / eager, 8a8w / fp32 .pte) is taken
  within a round, and reported as the median with its smallest and largest, so that a
  regression is told from the host's noise;
- on the CPU backends, each .pte's roofline (`roofline.py`): its MACs and weight bytes per
  inference against this host's measured bandwidth and GEMM peaks (probed once, at the bench's
  thread count), and the fraction of that limit its median p50 over the rounds reaches.

What the pipeline does on top of the plain calls, and the plain script does not: save each
stage's program (a chained run hands it to the next stage in memory: programs.SavedProgram),
the fake-quant reference, the accuracy report (its per-layer part is in the "report s" column),
hashing and manifests. The "overhead s" column is that work in seconds, lowering left out of
both sides: (pipeline - its lowering) - (plain - its lowering). Prints one Markdown table;
`--json` also writes the rows, the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from latency_rounds import summary, timed_rounds
from qnn_plain_calls import plain_qnn
from roofline import Cost, HostPeaks, inference_cost, probe_host, roofline
from stage_process import run_stage
from tables import STAGES, render

from qnn_common.cli.support import add_logging_args, setup_logging
from qnn_common.config import CompileConfig, Stage
from qnn_common.numerics.metrics import sqnr_db
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_infer.measure import measure_latency
from qnn_infer.runner import HostRunner
from qnn_infer.runtimes import set_cpu_threads
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from qnn_prepare.calibration import make_calibration
from qnn_prepare.models import load_model
from qnn_quant.engine import quantize_program


def _plain(model_name: str, recipe: Recipe, args: argparse.Namespace, workdir: Path,
           samples: int | None = None, runs: int | None = None) -> dict[str, Any]:
    """The bare calls, timed the same way: on XNNPACK our own quantize_program (which wraps
    prepare/convert_pt2e only) and lower_program with the stock settings; on QNN upstream's own
    QNN calls (qnn_plain_calls)."""
    samples = args.calibration_samples if samples is None else samples
    runs = args.runs if runs is None else runs
    steps: dict[str, float] = {}
    t0 = t = time.perf_counter()
    model = load_model(model_name, seq_len=args.seq_len)
    if args.backend is Backend.QNN:
        # Making the samples is part of the quantize step on both sides (ours: in prepare).
        t_data = time.perf_counter()
        calibration = (make_calibration(model, num_samples=samples, source=None, seed=1126)
                       if recipe.is_quantized else [])
        data_s = time.perf_counter() - t_data
        result = plain_qnn(model.module, tuple(model.example_inputs), calibration, recipe,
                           lookup_soc(args.soc), runs, workdir)
        result["steps_s"]["export"] += t_data - t0
        if recipe.is_quantized:
            result["steps_s"]["quantize"] += data_s
        result["total_s"] = sum(result["steps_s"].values())
        return {**result, "model": model}
    program = torch.export.export(model.module, model.example_inputs, strict=False)
    steps["export"], t = time.perf_counter() - t, time.perf_counter()
    if recipe.is_quantized:
        calibration = make_calibration(model, num_samples=samples, source=None, seed=1126)
        program = quantize_program(program, target=Target(Backend.XNNPACK), recipe=recipe,
                                   calibration=calibration, progress=False)
        steps["quantize"], t = time.perf_counter() - t, time.perf_counter()
    pte = workdir / "plain.pte"
    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=recipe))
    t_lower = time.perf_counter()
    lowered = lower_program(program, lowering, share_provenance=False, materialize_cia_once=False)
    lower_s = time.perf_counter() - t_lower  # what the compile stage records as lower_s
    pte.write_bytes(lowered.pte)
    steps["lower"], t = time.perf_counter() - t, time.perf_counter()
    runner = HostRunner(pte)
    outputs = runner.run(tuple(model.example_inputs))
    # The pipeline's infer stage times `runs` executions too; so does the plain script.
    latency = measure_latency(runner, tuple(model.example_inputs), warmup=3, runs=runs)
    steps["execute"] = time.perf_counter() - t
    total = time.perf_counter() - t0
    return {"total_s": total, "steps_s": steps, "lower_s": lower_s, "latency": latency,
            "outputs": outputs, "model": model}


def _sqnr_vs_eager(model: Any, outputs: tuple[torch.Tensor, ...]) -> float:
    """The plain program's first output against eager fp32 on the example input, in dB."""
    with torch.no_grad():
        eager = model.module(*model.example_inputs)
    first = eager if isinstance(eager, torch.Tensor) else next(
        v for v in (eager.values() if isinstance(eager, dict) else eager)
        if isinstance(v, torch.Tensor))
    return round(sqnr_db(first.float().numpy(), outputs[0].float().numpy()), 1)


def _eager_ms(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], runs: int
              ) -> tuple[float, float]:
    """Eager fp32 PyTorch: (p50, p90) in ms over `runs` calls after 3 warm-up calls."""
    times = []
    with torch.no_grad():
        for _ in range(3):
            module(*inputs)
        for _ in range(runs):
            t = time.perf_counter()
            module(*inputs)
            times.append((time.perf_counter() - t) * 1e3)
    deciles = statistics.quantiles(times, n=10)
    return statistics.median(times), deciles[8]


def _stage_rss(model: str, recipe: Recipe, args: argparse.Namespace, work: Path
               ) -> dict[str, float]:
    """Each stage as its own CLI process: peak RSS in MB."""
    prep, quant, comp, inf = (work / s for s in STAGES)
    steps = [("prepare", ["qnn_prepare.cli", "--model", model, "--seq-len", str(args.seq_len),
                          "--calibration-samples", str(args.calibration_samples),
                          "-o", str(prep), "-q"])]
    source = prep
    target = ["--backend", args.backend.value]
    if args.backend is Backend.QNN:
        target += ["--soc", args.soc]
    if recipe.is_quantized:
        steps.append(("quantize", ["qnn_quant.cli", str(prep), "--recipe", recipe.value,
                                   *target, "-o", str(quant), "-q"]))
        source = quant
    steps.append(("compile", ["qnn_compile.cli", str(source), "--recipe", recipe.value,
                              *target, "-o", str(comp), "-q"]))
    steps.append(("infer", ["qnn_infer.cli", str(comp), "--runs", str(args.runs),
                            "--no-accuracy-gates", "-o", str(inf), "-q"]))
    return {name: round(run_stage(argv, work)[1]) for name, argv in steps}


def bench(model_name: str, recipe: Recipe, args: argparse.Namespace) -> dict[str, Any]:
    """One row: the pipeline and the plain calls side by side, then eager, the program's cost
    (MACs, weight bytes: the roofline's numerator) and peak RSS. The .pte is kept as
    `args.keep / <model>-<recipe>.pte` for the latency rounds."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = PipelineContext.create(
            model_name, out_dir=Path(tmp) / "out", force=True, recipe=recipe,
            backend=args.backend, soc=args.soc if args.backend is Backend.QNN else None,
            prepare={"seq_len": args.seq_len, "calibration_samples": args.calibration_samples},
            # A benchmark reports the accuracy it measured; it does not stop at a gate.
            infer={"runs": args.runs, "threads": args.threads, "accuracy_gates": False},
        )
        # Alternating which goes first: whichever runs second finds torch's and ExecuTorch's
        # caches warm for this model's shapes, and a fixed order would give it the edge. The
        # first round would still be the only cold one, so an untimed round of the plain calls
        # warms those caches for both.
        if args.warmup_round:
            _plain(model_name, recipe, args, Path(tmp))
        ours_s: list[float] = []
        plain_s: list[float] = []
        # Each run's seconds outside lowering, for the overhead column.
        ours_rest: list[float] = []
        plain_rest: list[float] = []
        for i in range(args.repeats):
            for which in ("ours", "plain") if i % 2 == 0 else ("plain", "ours"):
                t0 = time.perf_counter()
                if which == "ours":
                    result = run_pipeline(ctx).checked()
                    ours_s.append(time.perf_counter() - t0)
                    lower_s = _timing(result, Stage.COMPILE, "lower_s") or 0.0
                    ours_rest.append(ours_s[-1] - lower_s)
                else:
                    plain = _plain(model_name, recipe, args, Path(tmp))
                    plain_s.append(plain["total_s"])
                    plain_rest.append(plain["total_s"] - plain["lower_s"])
        ours = statistics.median(ours_s)
        # Both programs judged alike: the example input's first output against eager fp32.
        compiled = next(r.artifact for r in result.records if r.stage is Stage.COMPILE)
        assert compiled is not None  # the run was checked
        pte = next(compiled.glob("*.pte"))
        shutil.copy2(pte, args.keep / f"{model_name}-{recipe.value}.pte")
        ours_outputs = HostRunner(pte).run(tuple(plain["model"].example_inputs))
        sqnr = {"ours": _sqnr_vs_eager(plain["model"], ours_outputs),
                "plain": _sqnr_vs_eager(plain["model"], plain["outputs"])}
        report_s = _timing(result, Stage.QUANTIZE, "report_s") if recipe.is_quantized else None
        plain_total = statistics.median(plain_s)
    model = plain["model"]
    eager_p50, eager_p90 = _eager_ms(model.module, tuple(model.example_inputs), args.runs)
    stages = {r.stage.value: r.seconds for r in result.records if r.status == "ran"}
    latency = result.summary["latency_ms"]
    cost = inference_cost(model.module, tuple(model.example_inputs), recipe)
    rss: dict[str, float] = {}
    if model_name in args.rss:
        with tempfile.TemporaryDirectory() as tmp:
            rss = _stage_rss(model_name, recipe, args, Path(tmp))
    return {
        "model": model_name,
        "backend": args.backend.value,
        "soc": args.soc if args.backend is Backend.QNN else None,
        "recipe": recipe.value,
        "sqnr_db_vs_fp32": sqnr,
        "stages_s": stages,
        "pipeline_total_s": round(ours, 2),
        "plain_total_s": round(plain_total, 2),
        "plain_steps_s": {k: round(v, 2) for k, v in plain["steps_s"].items()},
        "pipeline_vs_plain": round(ours / plain_total, 3),
        # Medians over the repeats, lowering out of both sides.
        "overhead_s": round(statistics.median(ours_rest) - statistics.median(plain_rest), 2),
        "pipeline_lower_s": round(lower_s, 2),  # the last run's
        "plain_lower_s": round(plain["lower_s"], 2),
        "repeats": args.repeats,
        "warmup_round": args.warmup_round,
        # The per-layer accuracy report is work the plain script does not do at all.
        "accuracy_report_s": report_s,
        "pte_p50_ms": latency["p50"],
        "pte_p90_ms": latency["p90"],
        "plain_pte_p50_ms": plain["latency"]["p50_ms"],
        "eager_fp32_p50_ms": round(eager_p50, 3),
        "eager_fp32_p90_ms": round(eager_p90, 3),
        "pte_vs_eager_fp32": round(latency["p50"] / eager_p50, 3),
        "cost": {"macs": cost.macs, "bytes_read": cost.bytes_read},
        "delegated_ops": result.summary["delegated_ops"],
        "non_delegated_ops": result.summary["non_delegated_ops"],
        "peak_rss_mb": rss,
        "accuracy": result.summary["accuracy"],
    }


def _row(model_name: str, recipe: Recipe, args: argparse.Namespace) -> dict[str, Any]:
    """`bench`'s row, or one saying which side failed and why: a case the pipeline (or the
    plain calls) cannot run is a result of the comparison, not the end of the run."""
    try:
        return bench(model_name, recipe, args)
    except Exception as exc:  # recorded in the row, with its type and message
        print(f"{model_name} {recipe.value}: {type(exc).__name__}: {exc}"[:2000])
        return {"model": model_name, "backend": args.backend.value,
                "soc": args.soc if args.backend is Backend.QNN else None,
                "recipe": recipe.value, "error": f"{type(exc).__name__}: {exc}"[:500]}


def _latency(model_name: str, rows: list[dict[str, Any]], args: argparse.Namespace
             ) -> dict[str, Any]:
    """The model's programs (every recipe that ran) and eager fp32 in interleaved rounds."""
    model = load_model(model_name, seq_len=args.seq_len)
    inputs = tuple(model.example_inputs)
    contenders: dict[str, Any] = {}
    for row in rows:
        if row["model"] == model_name and "error" not in row:
            runner = HostRunner(args.keep / f"{model_name}-{row['recipe']}.pte",
                                example_inputs=inputs)
            contenders[f"{row['recipe']} .pte"] = lambda r=runner: r.run(inputs)

    def eager() -> object:
        with torch.no_grad():
            return model.module(*inputs)

    contenders["eager fp32"] = eager
    pairs = [(f"{q} .pte", "fp32 .pte") for q in ("8a8w", "fp16")
             if f"{q} .pte" in contenders and "fp32 .pte" in contenders]
    return summary(timed_rounds(contenders, args.latency_rounds, args.runs), "eager fp32",
                   pairs)


def _add_roofline(row: dict[str, Any], latency: dict[str, Any] | None,
                  peaks: HostPeaks) -> None:
    """The row's bound, reached by its median p50 over the rounds (else its infer p50)."""
    if "error" in row:
        return
    p50 = ((latency or {}).get("p50_ms", {}).get(f"{row['recipe']} .pte") or {}).get(
        "median", row["pte_p50_ms"])
    row["roofline"] = roofline(Cost(**row["cost"]), peaks, Recipe(row["recipe"]), p50)


def _timing(result: Any, stage: Stage, key: str) -> float | None:
    from qnn_common.sealing import load_manifest

    record = next(r for r in result.records if r.stage is stage)
    return load_manifest(record.artifact, verify=False).timings.get(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny-cnn", "minilm"])
    parser.add_argument("--backend", type=Backend, default=Backend.XNNPACK,
                        choices=[Backend.XNNPACK, Backend.QNN],
                        help="xnnpack: the plain calls are ExecuTorch's stock XNNPACK flow; qnn: "
                        "upstream's own QNN calls (qnn_plain_calls.py), for --soc on the HTP "
                        "emulator (default: %(default)s)")
    parser.add_argument("--soc", default="SM8650", help="the SoC for --backend qnn "
                        "(default: %(default)s)")
    parser.add_argument("--recipes", nargs="+", default=None,
                        choices=["fp32", "8a8w", "fp16", "16a8w", "16a16w", "16a4w"],
                        help="default: 8a8w fp32 on xnnpack, fp16 8a8w 16a8w on qnn")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--calibration-samples", type=int, default=16)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2,
                        help="pipeline and plain runs each, alternating which goes first; the "
                        "medians are compared (default: %(default)s)")
    parser.add_argument("--no-warmup-round", dest="warmup_round", action="store_false",
                        help="skip the untimed round of plain calls that warms torch's and "
                        "ExecuTorch's caches for the model's shapes before timing")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for the .pte and eager PyTorch (default: all cores)")
    parser.add_argument("--rss", nargs="*", default=["minilm"], metavar="MODEL",
                        help="models whose stages also run as separate processes for their "
                        "peak RSS (default: minilm; none: --rss)")
    parser.add_argument("--latency-rounds", type=int, default=5,
                        help="interleaved rounds timing every program of a model and eager "
                        "fp32 side by side, --runs calls each (default: %(default)s; 0: none)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    add_logging_args(parser)
    args = parser.parse_args()
    if args.recipes is None:
        args.recipes = ["fp16", "8a8w", "16a8w"] if args.backend is Backend.QNN else ["8a8w",
                                                                                    "fp32"]
    other = {"fp32"} if args.backend is Backend.QNN else {"fp16", "16a8w", "16a16w", "16a4w"}
    if wrong := sorted(set(args.recipes) & other):
        parser.error(f"--recipes {' '.join(wrong)}: not for --backend {args.backend.value}")
    # The table is the output: stage logs and third-party noise (library FutureWarnings by the
    # dozen, see qnn_common.cli.noise) only with -v.
    setup_logging(args.verbose, quiet=not args.verbose)
    threads = set_cpu_threads(args.threads)  # the runtime's pool, for the plain runs too
    torch.set_num_threads(threads)  # and eager PyTorch's, the same count
    # One untimed pass first: imports, kernel registration and the first lowering's one-time
    # setup would otherwise be charged to whichever side runs first.
    with tempfile.TemporaryDirectory() as tmp:
        _plain("tiny-cnn", Recipe(args.recipes[0]), args, Path(tmp), samples=2, runs=1)
    for model in args.models:
        load_model(model, seq_len=args.seq_len)  # warm the page cache and lazy imports
    with tempfile.TemporaryDirectory() as keep:
        args.keep = Path(keep)
        rows = [_row(m, Recipe(r), args) for m in args.models for r in args.recipes]
        latency = {m: _latency(m, rows, args) for m in args.models} if args.latency_rounds else {}
    # The emulator's times say nothing of a phone's limit: no roofline for the HTP.
    peaks = None if args.backend is Backend.QNN else probe_host(threads)
    for row in rows:
        if peaks is not None:
            _add_roofline(row, latency.get(row["model"]), peaks)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, load average "
               f"{os.getloadavg()[0]:.1f} at the end")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine}; {threads} "
          f"thread(s); seq_len {args.seq_len}, {args.calibration_samples} calibration samples, "
          f"{args.runs} timed runs, {args.backend.value}"
          + (f" {args.soc} (the x86 HTP emulator)" if args.backend is Backend.QNN else ""))
    result = {
        "bench": "pipeline",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine,
        "torch": torch.__version__, "threads": threads, "seq_len": args.seq_len,
        "backend": args.backend.value,
        "calibration_samples": args.calibration_samples, "runs": args.runs,
        "host_peaks": None if peaks is None else peaks.to_json(), "rows": rows,
        "latency_rounds": latency,
    }
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
