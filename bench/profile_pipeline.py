"""Profile one pipeline run with cProfile: where the seconds go beyond the plain ExecuTorch calls.

Run: `./pants run bench/profile_pipeline.py -- --model minilm --top 40` (`--backend qnn --recipe
fp16` for the HTP)

Runs the whole pipeline (fresh output directory, every stage runs) under cProfile, writes the raw
profile (`--out`, readable with `python -m pstats` or snakeviz) and prints:
- the top functions by cumulative time;
- the pipeline's own overhead, function by function: hashing, manifests, saving / loading
  programs, references and the accuracy report (what the plain calls do not do), with how often
  each ran.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

from qnn_common.cli.support import add_logging_args, setup_logging
from qnn_common.recipes import Backend
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline

# (file suffix, function name) of the pipeline's own work around the plain calls.
OVERHEAD = (
    ("qnn_common/store/hashing.py", "sha256_file"),
    ("qnn_common/sealing.py", "load_manifest"),
    ("qnn_common/sealing.py", "write_manifest"),
    ("qnn_common/sealing.py", "manifest_digest"),
    ("qnn_common/cache_keys.py", "tool_versions"),
    ("qnn_common/torchio/programs.py", "load_program"),
    ("qnn_common/torchio/programs.py", "handed_on"),
    ("qnn_common/torchio/programs.py", "save_program"),
    ("qnn_common/torchio/samples.py", "save_samples"),
    ("qnn_common/torchio/samples.py", "load_samples"),
    ("qnn_common/torchio/pt2_archive.py", "check_pt2_archive"),
    ("qnn_common/store/atomic.py", "atomic_copy"),
    ("qnn_common/store/atomic.py", "atomic_path"),
    ("qnn_quant/report.py", "accuracy_report"),
    ("qnn_quant/families/single.py", "_call"),
    ("qnn_compile/api.py", "compile_cache_key"),
    ("qnn_quant/api.py", "quantize_cache_key"),
    ("qnn_infer/api.py", "infer_cache_key"),
    ("torch/export/__init__.py", "load"),
    ("torch/export/__init__.py", "save"),
)


def overhead_rows(stats: pstats.Stats) -> list[tuple[str, int, float, float]]:
    """(function, calls, own seconds, cumulative seconds) for each OVERHEAD function seen."""
    rows = []
    raw = stats.stats  # type: ignore[attr-defined]  # pstats keeps its table here, untyped
    for (filename, _, name), (_, calls, own, cum, _) in raw.items():
        for suffix, wanted in OVERHEAD:
            if name == wanted and filename.endswith(suffix):
                rows.append((f"{suffix}:{name}", calls, own, cum))
    return sorted(rows, key=lambda r: -r[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--recipe", default="8a8w")
    parser.add_argument("--backend", type=Backend, default=Backend.XNNPACK,
                        choices=list(Backend), help="default: %(default)s")
    parser.add_argument("--soc", default="SM8650", help="for --backend qnn (default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--calibration-samples", type=int, default=16)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("pipeline.prof"),
                        help="raw cProfile output (default: %(default)s)")
    add_logging_args(parser)
    args = parser.parse_args()
    setup_logging(args.verbose, quiet=not args.verbose)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = PipelineContext.create(
            args.model, out_dir=Path(tmp) / "out", force=True, recipe=args.recipe,
            backend=args.backend, soc=args.soc if args.backend is Backend.QNN else None,
            prepare={"seq_len": args.seq_len, "calibration_samples": args.calibration_samples},
            infer={"runs": args.runs},
        )
        profiler = cProfile.Profile()
        t = time.perf_counter()
        profiler.enable()
        result = run_pipeline(ctx).checked()
        profiler.disable()
        total = time.perf_counter() - t
    profiler.dump_stats(str(args.out))
    print(f"{args.model} {args.recipe}: {total:.1f} s under cProfile; stages: "
          + ", ".join(f"{r.stage.value} {r.seconds:.1f} s" for r in result.records))
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf)
    stats.sort_stats("cumulative").print_stats(args.top)
    print(buf.getvalue())
    print("| pipeline overhead function | calls | own s | cumulative s |")
    print("|---|---|---|---|")
    for name, calls, own, cum in overhead_rows(stats):
        print(f"| {name} | {calls} | {own:.2f} | {cum:.2f} |")


if __name__ == "__main__":
    main()
