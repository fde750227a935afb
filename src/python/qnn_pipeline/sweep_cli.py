"""`qnn-pipeline sweep`: a matrix of models x backends (x SoCs) x recipes, on Ray or in process."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qnn_common.cli.support import (
    EXIT_ERROR,
    add_logging_args,
    check_output_writable,
    command_parser,
    setup_logging,
)
from qnn_common.config.toml_file import read_toml
from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Backend, Recipe, parse_enum
from qnn_common.soc import lookup_soc
from qnn_pipeline.out_lock import sole_sweep
from qnn_pipeline.ray_join import check_ray_address
from qnn_pipeline.sweep import run_sweep
from qnn_pipeline.sweep_plan import STAGE_SECTIONS, Matrix

EPILOG = """examples:
  qnn-pipeline sweep --model tiny-cnn,minilm --backend xnnpack,portable --recipe fp32,8a8w
  qnn-pipeline sweep --model minilm --backend qnn --soc SM8650,SM8750 --recipe 16a8w,fp16
  qnn-pipeline sweep --config sweep.toml --ray-address ray://head:10001 --artifacts /shared/art
  qnn-pipeline sweep --config sweep.toml --jobs 1          # in this process, no Ray

sweep.toml:
  [sweep]
  models = ["tiny-cnn", "minilm"]
  backends = ["xnnpack", "portable"]
  recipes = ["fp32", "8a8w"]
  socs = ["SM8650"]        # qnn cells: one per SoC
  out = "sweep"            # sweep.md, sweep.json; artifacts in out/artifacts unless `artifacts`
  jobs = 2
  # ray_address = "head:6379"   # or "ray://head:10001": needs pip install 'ray[client]'
  # ray_timeout = 60            # seconds to join it
  [infer]                  # [prepare] [quantize] [compile] [infer]: as in a pipeline TOML,
  runs = 10                # shared by every cell

Cells that share a prefix share its artifact: one prepare per model, one quantize per (model,
recipe, quantizer target). Exit code 0 when every valid cell completed, 2 when one failed (the
others still ran; sweep.md lists each failure with its stage and reason).

"""

SWEEP_KEYS = ("models", "backends", "recipes", "socs", "out", "artifacts", "jobs", "ray_address",
              "ray_timeout")


@dataclass(frozen=True)
class SweepOptions:
    """Where and how to run: everything but the matrix."""

    out: Path
    artifacts: Path | None
    jobs: int | None
    ray_address: str | None
    ray_timeout: float | None = None


def build_sweep_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "qnn-pipeline sweep",
        "Run the pipeline over a matrix of models, backends, SoCs and recipes, as a DAG of shared "
        "stages, on Ray (local by default) or in this process (--jobs 1).",
        EPILOG,
    )
    p.add_argument("--config", type=Path, help="a sweep TOML file; flags override it")
    p.add_argument("--model", action="append", help="models, comma-separated or repeated")
    p.add_argument("--backend", action="append", help="backends: xnnpack, portable, qnn")
    p.add_argument("--recipe", action="append", help="recipes, e.g. fp32,8a8w")
    p.add_argument("--soc", action="append", help="SoCs for qnn cells, e.g. SM8650,SM8750")
    p.add_argument("--out", type=Path, help="where sweep.md / sweep.json go (default: sweep)")
    p.add_argument("--artifacts", type=Path,
                   help="the shared artifact directory (default: OUT/artifacts); on a cluster, "
                   "a path every node sees")
    p.add_argument("--jobs", type=int,
                   help="parallel cells on a local Ray (default: every core); 1 runs in process")
    p.add_argument("--ray-address",
                   help="join this Ray cluster instead of starting a local one: host:6379 (the "
                   "head's GCS), or ray://host:10001 (Ray Client: pip install 'ray[client]')")
    p.add_argument("--ray-timeout", type=float,
                   help="seconds to join the cluster at --ray-address before giving up "
                   "(default: 60)")
    p.add_argument("--runs", type=int, help="timed inference runs per cell (default: 20)")
    p.add_argument("--threads", type=int,
                   help="runtime threads per cell's timed runs (default: every core; with "
                   "parallel cells, 1 keeps their latencies from contending)")
    p.add_argument("--seq-len", type=int, help="token length for text models (default: 128)")
    p.add_argument("--calibration-samples", type=int, help="default: 16")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_logging_args(p)
    return p


def _split(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _strings(table: Mapping[str, Any], key: str) -> list[str]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigValidationError(f"sweep.{key}", value, "must be a list of strings")
    return value


def sweep_from_mapping(
    data: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> tuple[Matrix, SweepOptions]:
    """Build the matrix and options from TOML-shaped data; `overrides` (None = not given) win."""
    for section in data:
        if section != "sweep" and section not in STAGE_SECTIONS:
            raise ConfigValidationError(section, data[section], "unknown section of a sweep "
                                        "file", allowed=("sweep", *STAGE_SECTIONS))
    top = dict(data.get("sweep", {}))
    for key in top:
        if key not in SWEEP_KEYS:
            raise ConfigValidationError(f"sweep.{key}", top[key], "unknown key", SWEEP_KEYS)
    top.update({k: v for k, v in (overrides or {}).items() if v is not None})
    settings = {k: dict(v) for k, v in data.items() if k != "sweep"}
    for section, table in (overrides or {}).get("settings", {}).items():
        settings.setdefault(section, {}).update(table)
    top.pop("settings", None)
    top.setdefault("backends", [Backend.XNNPACK.value])
    top.setdefault("recipes", [Recipe.A8W8.value])
    matrix = Matrix(
        models=tuple(_strings(top, "models")),
        backends=tuple(parse_enum(Backend, b, "sweep.backends") for b in _strings(top, "backends")),
        recipes=tuple(parse_enum(Recipe, r, "sweep.recipes") for r in _strings(top, "recipes")),
        socs=tuple(lookup_soc(s, "sweep.socs").name for s in _strings(top, "socs")),
        settings=settings,
    )
    jobs = top.get("jobs")
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ConfigValidationError("sweep.jobs", jobs, "must be a whole number >= 1")
    address = top.get("ray_address")
    if address is not None and not isinstance(address, str):
        raise ConfigValidationError("sweep.ray_address", address, "must be a string")
    timeout = top.get("ray_timeout")
    if timeout is not None and (not isinstance(timeout, int | float) or isinstance(timeout, bool)
                                or not 0 < timeout <= 3600):
        raise ConfigValidationError("sweep.ray_timeout", timeout,
                                    "must be a number of seconds, above 0 and at most 3600")
    artifacts = top.get("artifacts")
    options = SweepOptions(
        out=Path(top.get("out", "sweep")),
        artifacts=None if artifacts is None else Path(artifacts),
        jobs=jobs,
        ray_address=address,
        ray_timeout=timeout,
    )
    return matrix, options


def sweep_main(argv: Sequence[str] | None) -> int:
    """The `qnn-pipeline sweep` command body (run it through `run_cli`)."""
    parser = build_sweep_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    if not args.verbose:
        # Each cell's stage-by-stage log lines would bury the progress bar; -v shows them.
        for name in ("qnn_pipeline.orchestrator", *(f"qnn_{s}" for s in ("prepare", "quant",
                                                                           "compile", "infer"))):
            logging.getLogger(name).setLevel(logging.WARNING)
    data = read_toml(args.config) if args.config is not None else {}
    stage_flags = {
        "prepare": {"seq_len": args.seq_len, "calibration_samples": args.calibration_samples},
        "infer": {"runs": args.runs, "threads": args.threads},
    }
    overrides: dict[str, Any] = {
        "models": _split(args.model), "backends": _split(args.backend),
        "recipes": _split(args.recipe), "socs": _split(args.soc),
        "out": None if args.out is None else str(args.out),
        "artifacts": None if args.artifacts is None else str(args.artifacts),
        "jobs": args.jobs, "ray_address": args.ray_address, "ray_timeout": args.ray_timeout,
        "settings": {s: {k: v for k, v in t.items() if v is not None}
                     for s, t in stage_flags.items() if any(v is not None for v in t.values())},
    }
    if args.config is None and overrides["models"] is None:
        parser.error("pass --model (and --backend, --recipe) or --config sweep.toml")
    matrix, options = sweep_from_mapping(data, overrides)
    if options.ray_address is not None:
        check_ray_address(options.ray_address)  # a missing ray[client] before any work
    check_output_writable(options.out, "--out")
    if options.artifacts is not None:
        check_output_writable(options.artifacts, "--artifacts")
    with sole_sweep(options.out):  # its tables are this sweep's alone
        result = run_sweep(
            matrix, options.out, artifact_dir=options.artifacts, jobs=options.jobs,
            ray_address=options.ray_address, ray_timeout=options.ray_timeout,
            progress=not args.no_progress, verbose=args.verbose,
        )
    print(result.markdown, end="")
    print(f"tables: {result.markdown_path}, {result.json_path}")
    if result.ok:
        return 0
    # The tables list every failure; the one line a script or a reader of the tail sees.
    failed = [c for c in result.cells if c.status in ("failed", "not run")]
    first = failed[0]
    print(f"error: {len(failed)} of {len(result.cells)} cells did not complete; first: "
          f"{first.cell.name} at {first.failed_stage}: {first.error}; every failure is in "
          f"{result.markdown_path}", file=sys.stderr)
    return EXIT_ERROR
