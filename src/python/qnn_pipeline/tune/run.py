"""One search, end to end, on the pipeline's own cached stages: the model prepared once, the
cheap and rich recipes quantized, the sensitivity pass, the verified search, the winner
compiled; every quantize artifact and every score kept under OUT, so a killed search run again
takes what it had (the stages from the pipeline's cache, the scores from OUT/tune/scores)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError
from qnn_common.gates import NEXT_RECIPE
from qnn_common.layer_recipes import LayerRecipe, mixable_recipes
from qnn_common.recipes import Recipe, parse_enum
from qnn_common.soc import lookup_soc
from qnn_common.store.atomic import atomic_write_text
from qnn_pipeline.context import PipelineContext, pipeline_from_mapping
from qnn_pipeline.orchestrator import run_pipeline
from qnn_pipeline.tune.front import write_report
from qnn_pipeline.tune.scoring import Reference, Score
from qnn_pipeline.tune.search import Budget, Search, search
from qnn_pipeline.tune.sensitivity import Sensitivity, measure
from qnn_quant.lm_steps import artifact_lm

log = logging.getLogger(__name__)

RUNS, TUNE = "runs", "tune"


@dataclass(frozen=True)
class TuneRequest:
    """A search: the pipeline settings every candidate shares (`sections`, TOML-shaped, as
    `qnn-pipeline --config` reads them; its quantize recipe is the cheap one), the recipe to
    promote groups to (None: the next one up that mixes), the budget, the corpus tokens each
    candidate is scored on, and whether the winner is compiled."""

    sections: Mapping[str, Mapping[str, Any]]
    out: Path
    budget: Budget
    promote_to: Recipe | None = None
    tokens: int = 1024
    eval_file: Path | None = None
    compile_winner: bool = True
    force: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _context(request: TuneRequest, recipe: Recipe, table: tuple[LayerRecipe, ...],
             stop_after: Stage) -> PipelineContext:
    sections = {k: dict(v) for k, v in request.sections.items()}
    top = sections.setdefault("pipeline", {})
    top.update(recipe=recipe.value, out=request.out / RUNS, stop_after=stop_after.value)
    top.pop("skip", None)
    sections.setdefault("prepare", {})["kv_cache"] = True
    quantize = sections.setdefault("quantize", {})
    quantize["layer_recipes"] = table or None
    if not table:
        quantize.pop("layer_recipes")
    return pipeline_from_mapping(sections)


def promote_to(ctx: PipelineContext, wanted: Recipe | None) -> Recipe:
    """The rich recipe: `wanted` if it mixes into the cheap program, else the next recipe up
    (`NEXT_RECIPE`) that does, else fp32 (a float layer mixes into any program)."""
    soc = None if ctx.soc is None else lookup_soc(ctx.soc)
    allowed = mixable_recipes(ctx.backend, ctx.recipe, soc)
    if wanted is not None:
        if wanted not in allowed:
            raise ConfigValidationError(
                "--promote-to", wanted.value,
                f"does not mix into a {ctx.recipe.value} program on {ctx.backend.value}",
                allowed=tuple(r.value for r in allowed))
        return wanted
    return next((r for r in reversed(NEXT_RECIPE.get(ctx.recipe, ())) if r in allowed),
                Recipe.FP32)


def _stage_dirs(ctx: PipelineContext) -> dict[Stage, Path]:
    """Run the pipeline (its cached stages taken as they are): each stage's artifact."""
    result = run_pipeline(ctx)
    return {r.stage: r.artifact for r in result.records if r.artifact is not None}


def _stage_dir(ctx: PipelineContext, stage: Stage) -> Path:
    dirs = _stage_dirs(ctx)
    assert stage in dirs, f"the pipeline ran no {stage}"
    return dirs[stage]


def tune(request: TuneRequest) -> Search:
    """Run the search (module docstring); the report is under OUT/tune."""
    if request.tokens < 64:
        raise ConfigValidationError("--tokens", request.tokens,
                                    "scores nothing worth ranking: give at least 64")
    named = request.sections.get("pipeline", {}).get("recipe") or Recipe.A8W8.value
    cheap_ctx = _context(request, parse_enum(Recipe, str(named), "--recipe"), (),
                         Stage.QUANTIZE)
    if not cheap_ctx.recipe.is_quantized or cheap_ctx.recipe.is_dynamic:
        raise ConfigValidationError(
            "--recipe", cheap_ctx.recipe.value,
            "the search mixes static recipes per layer (a dynamic one mixes with fp32 only, a "
            "float one has nothing to mix); start from 8a8w on CPUs or 16a4w_block on the HTP")
    cheap, rich = cheap_ctx.recipe, promote_to(cheap_ctx, request.promote_to)
    here = request.out / TUNE
    scores = here / "scores"
    scores.mkdir(parents=True, exist_ok=True)
    log.info("tune: %s, groups promoted to %s; budget %s", cheap.value, rich.value,
             request.budget.to_json())
    cheap_dirs = _stage_dirs(cheap_ctx)  # one run gives both: no second pass for prepare's
    cheap_q, prepare = cheap_dirs[Stage.QUANTIZE], cheap_dirs[Stage.PREPARE]
    rich_src = prepare if rich is Recipe.FP32 else _stage_dir(
        _context(request, rich, (), Stage.QUANTIZE), Stage.QUANTIZE)
    reference = Reference.of(prepare, request.tokens, request.eval_file)
    log.info("tune: float model's logits over %d tokens in %.0f s", reference.tokens,
             reference.seconds)

    key = {"cheap": cheap_q.name, "rich": rich_src.name, "tokens": reference.tokens,
           "windows": [len(w) for w in reference.windows]}
    sensitivity = _cached_sensitivity(here / "sensitivity.json", key)
    if sensitivity is None:
        sensitivity = measure(
            reference, cheap_q, rich_src,
            progress=lambda i, n, name: log.info("sensitivity: %d of %d groups (%s)", i, n,
                                                 name))
        atomic_write_text(here / "sensitivity.json",
                          json.dumps({"key": key, **sensitivity.to_json()}, indent=2) + "\n")

    def verify(table: tuple[LayerRecipe, ...]) -> tuple[Score, Path]:
        q = _stage_dir(_context(request, cheap, table, Stage.QUANTIZE), Stage.QUANTIZE)
        path = scores / f"{q.name}.json"
        if path.is_file() and not request.force:
            data = json.loads(path.read_text("utf-8"))
            if data.get("tokens_key") == key["windows"]:
                log.info("tune: candidate scored by an earlier run: %s", path)
                return Score.from_json(data), q
        score = reference.score(artifact_lm(q, "candidate"))
        atomic_write_text(path, json.dumps({**score.to_json(), "tokens_key": key["windows"],
                                            "layer_recipes": [e.to_text() for e in table]},
                                           indent=2) + "\n")
        return score, q

    found = search(sensitivity, cheap, rich, request.budget, verify)
    extra: dict[str, Any] = {"tokens": reference.tokens, "sensitivity_seconds":
                             round(sensitivity.seconds, 1), **request.extra}
    sections = {k: {kk: vv for kk, vv in v.items() if kk not in ("out", "stop_after", "skip")}
                for k, v in request.sections.items()}
    sections.setdefault("prepare", {})
    sections["prepare"] = {**sections["prepare"], "kv_cache": True}
    if found.winner is not None and request.compile_winner:
        ctx = _context(request, cheap, found.winner.table, Stage.COMPILE)
        compiled = _stage_dir(ctx, Stage.COMPILE)
        pte = next(compiled.glob("*.pte"))
        extra["program"] = f"{pte.stat().st_size:,} bytes ({compiled.name}/{pte.name})"
        extra["program_bytes"] = pte.stat().st_size
        extra["program_dir"] = str(compiled)
    write_report(here, found, sections, extra)
    return found


def _cached_sensitivity(path: Path, key: Mapping[str, Any]) -> Sensitivity | None:
    """The sensitivity pass of an earlier run of this search, if made from the same artifacts
    and tokens."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("key") != dict(key):
        return None
    return Sensitivity.from_json(data)
