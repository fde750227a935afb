"""A sweep's results as one table: model x target x recipe -> accuracy, latency, .pte size, status.

`sweep.json` is the contract for scripts (one object per cell, the node counts per stage);
`sweep.md` is the same table for people, followed by each failure with its stage and reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qnn_common.store.atomic import atomic_write_text
from qnn_pipeline.sweep_plan import CellResult

MARKDOWN_NAME = "sweep.md"
JSON_NAME = "sweep.json"


def cell_record(result: CellResult) -> dict[str, Any]:
    """One cell as JSON: where it ran, how it ended, and its headline numbers."""
    summary = result.summary or {}
    accuracy = summary.get("accuracy") or {}
    latency = summary.get("latency_ms") or {}
    return {
        "model": result.cell.model,
        "backend": result.cell.backend.value,
        "soc": result.cell.soc,
        "target": result.cell.target,
        "recipe": result.cell.recipe.value,
        "status": result.status,
        "stages": dict(result.stages),
        "failed_stage": result.failed_stage,
        "error": result.error,
        "sqnr_db_vs_fp32": accuracy.get("sqnr_db_vs_fp32"),
        "cosine_vs_fp32": accuracy.get("cosine_vs_fp32"),
        "accuracy_ok": accuracy.get("ok"),
        "latency_ms_p50": latency.get("p50"),
        "latency_ms_p90": latency.get("p90"),
        "pte_bytes": summary.get("pte_bytes"),
        "artifacts": [s["artifact"] for s in summary.get("stages", []) if s.get("artifact")],
    }


def _num(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else format(value, fmt)  # "inf" stays "inf"


def _stages(stages: Mapping[str, str]) -> str:
    """`ran prepare, infer` / `all cached` / `prepare failed`: the work this cell's chain did."""
    bad = [f"{name} {status}" for name, status in stages.items() if status == "failed"]
    if bad or not stages:
        return ", ".join(bad) or "-"
    ran = [name for name, status in stages.items() if status == "ran"]
    return "ran " + ", ".join(ran) if ran else "all cached"


def to_markdown(cells: Sequence[CellResult], counts: Mapping[str, Mapping[str, int]],
                seconds: float) -> str:
    """The table, the work done per stage, and the failures with their stage and reason."""
    lines = [
        "| model | target | recipe | status | SQNR vs fp32 (dB) | cosine | p50 (ms) | .pte (bytes) "
        "| stages |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for c in cells:
        r = cell_record(c)
        status = c.status if c.failed_stage is None else f"{c.status} ({c.failed_stage})"
        lines.append(
            f"| {r['model']} | {r['target']} | {r['recipe']} | {status} "
            f"| {_num(r['sqnr_db_vs_fp32'], '.1f')} | {_num(r['cosine_vs_fp32'], '.4f')} "
            f"| {_num(r['latency_ms_p50'], '.3f')} | {_num(r['pte_bytes'], ',')} "
            f"| {_stages(c.stages)} |"
        )
    done = sum(c.status == "ok" for c in cells)
    lines += ["", f"{done} of {len(cells)} cells completed in {seconds:.1f} s. Work per stage:", ""]
    for stage, by_status in counts.items():
        parts = [f"{n} {status}" for status, n in by_status.items() if n]
        lines.append(f"- {stage}: {', '.join(parts) or 'none'}")
    failures = [c for c in cells if c.status != "ok"]
    if failures:
        lines += ["", "Failures:", ""]
        lines += [f"- {c.cell.name}: {c.status} at {c.failed_stage}: {c.error}" for c in failures]
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, cells: Sequence[CellResult],
                  counts: Mapping[str, Mapping[str, int]], seconds: float,
                  artifact_dir: Path) -> tuple[str, Path, Path]:
    """Write `sweep.md` and `sweep.json` into `out_dir`; return the table and their paths.

    The table is returned, not read back: another sweep into the same directory may have
    replaced the file since, and this run must print its own.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out_dir / MARKDOWN_NAME, out_dir / JSON_NAME
    markdown = to_markdown(cells, counts, seconds)
    atomic_write_text(md_path, markdown)
    document = {
        "cells": [cell_record(c) for c in cells],
        "nodes": {stage: dict(by_status) for stage, by_status in counts.items()},
        "seconds": round(seconds, 3),
        "artifact_dir": str(artifact_dir),
    }
    atomic_write_text(json_path, json.dumps(document, indent=2) + "\n")
    return markdown, md_path, json_path
