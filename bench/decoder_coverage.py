"""Benchmark table: which decoder architectures run by default, per backend and recipe, in one
table, each with the decoders upstream ExecuTorch's Qualcomm flow ships recipes for that are
instances of it.

Reads the JSON of `bench/decoder_survey.py` runs (one per backend and recipe) and writes one
coverage JSON that `bench/docs_tables.py` renders into docs/llm.md:

    ./pants run bench/decoder_coverage.py -- docs/bench/decoder-survey-xnnpack.json \
        docs/bench/decoder-survey-qnn.json --json docs/bench/decoder-coverage.json

A cell says whether the architecture's tiny seeded checkpoint generated with every other setting
at its default, and its program's KL divergence from eager fp32 on the held-out windows; or
where and why not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from qnn_common.store.atomic import atomic_write_text

# The decoders upstream's Qualcomm LLM flow (examples/qualcomm/oss_scripts/llama) ships recipes
# for, and the transformers architecture each is an instance of.
UPSTREAM: dict[str, str] = {
    "Llama 3.2 (1B, 3B)": "llama",
    "Qwen 2.5": "qwen2",
    "Qwen 3": "qwen3",
    "Gemma": "gemma",
    "Gemma 2": "gemma2",
    "Gemma 3": "gemma3_text",
    "Phi-4-mini": "phi3",
    "SmolLM 2": "llama",
    "SmolLM 3": "smollm3",
    "Granite": "granite",
    "GLM-Edge": "glm",
    "CodeGen": "codegen",
}


def column(survey: dict[str, Any]) -> str:
    """A survey's settings as a column heading: backend, SoC, recipe."""
    s = survey["settings"]
    return " ".join(str(s[k]) for k in ("backend", "soc", "recipe") if s.get(k)) + (
        "" if s.get("recipe") else " (its default recipe)")


def cell(row: dict[str, Any] | None) -> dict[str, Any]:
    """One architecture's outcome in one survey."""
    if row is None:
        return {"status": "not surveyed"}
    out = {"status": row["status"], "kl_mean": row.get("kl_mean")}
    if row.get("reason"):
        where = f"{row['stage']}: " if row.get("stage") else ""
        out["reason"] = f"{where}{row['reason']}"
    return out


def coverage(surveys: list[dict[str, Any]]) -> dict[str, Any]:
    """Architectures (in the first survey's order) by survey column, and the upstream rows."""
    columns = [column(s) for s in surveys]
    by_arch = [{r["architecture"]: r for r in s["rows"]} for s in surveys]
    architectures: list[str] = []
    for s in surveys:
        architectures += [r["architecture"] for r in s["rows"]
                          if r["architecture"] not in architectures]
    return {
        "bench": "decoder_coverage",
        "columns": columns,
        "dates": [s.get("date") for s in surveys],
        "rows": [{"architecture": a, "cells": [cell(b.get(a)) for b in by_arch]}
                 for a in architectures],
        "upstream": [{"model": m, "architecture": a} for m, a in UPSTREAM.items()],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("surveys", nargs="+", type=Path, help="decoder_survey.py JSON files")
    p.add_argument("--json", type=Path, required=True, help="write the coverage here")
    args = p.parse_args()
    surveys = [json.loads(path.read_text(encoding="utf-8")) for path in args.surveys]
    for path, survey in zip(args.surveys, surveys, strict=True):
        if survey.get("bench") != "decoder_survey":
            raise SystemExit(f"{path}: not a bench/decoder_survey.py result")
    atomic_write_text(args.json, json.dumps(coverage(surveys), indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
