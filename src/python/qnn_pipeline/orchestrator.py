"""Chains prepare -> quantize -> compile -> infer through artifact directories.

Each stage's output lands in `OUT/<stage>-<cache key[:12]>/`. The key covers the stage config, the
digests of its inputs and the package and tool versions, so a rerun finds an up-to-date artifact
(its manifest verified, hashes and all) and skips the stage; a changed input changes the key and
only the stages downstream of it run again.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from qnn_common.artifact import Artifact
from qnn_common.config import QuantizeConfig, Stage
from qnn_common.errors import ArtifactError, ConfigValidationError, PipelineError, StageError
from qnn_common.manifest import MANIFEST_NAME, Manifest
from qnn_common.sealing import load_manifest
from qnn_common.stages import (
    CONTEXT_CACHE_DIR,
    CompileInput,
    InferInput,
    PrepareInput,
    QuantizeInput,
)
from qnn_common.store.artifact_dir import cleans_up_artifacts
from qnn_common.store.artifact_lock import acquire_artifact_lock, release_artifact_lock
from qnn_compile.api import compile_cache_key, run_compile
from qnn_compile.backends import preflight
from qnn_infer.api import infer_cache_key, run_infer
from qnn_infer.device import check_device_ready
from qnn_infer.evaluation.report import EvalGateError
from qnn_infer.gate_check import AccuracyGateError, gate_failure
from qnn_infer.program_check import check_program_matches
from qnn_pipeline import families
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.evaluation import EvalRequest, run_evaluation
from qnn_pipeline.summary import (
    SUMMARY_NAME,
    StageRecord,
    remove_previous_summary,
    write_summary,
)
from qnn_prepare.api import prepare_cache_key, run_prepare
from qnn_prepare.models import task_for
from qnn_quant.api import quantize_cache_key, run_quantize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineResult:
    """A finished run: its stages, its summary, and the infer gates' failure if it missed them
    (the run is complete and sealed either way; the CLI turns a failure into exit code 2)."""

    records: tuple[StageRecord, ...]
    summary: dict[str, Any]
    summary_path: Path
    gate_failure: AccuracyGateError | None = None
    # --eval: the program missed the evaluation's gates (OUT/eval.md holds the figures).
    eval_failure: EvalGateError | None = None

    def checked(self) -> PipelineResult:
        """This result, or its gate failure raised: for callers that treat a run below its
        gates as an error."""
        if self.gate_failure is not None:
            raise self.gate_failure
        if self.eval_failure is not None:
            raise self.eval_failure
        return self


StageIn = TypeVar("StageIn", PrepareInput, QuantizeInput, CompileInput, InferInput)


@dataclass(frozen=True)
class StageRunner(Generic[StageIn]):
    """How the orchestrator drives one stage, typed by that stage's input: its cache key from
    the run's context and the upstream artifact (None at the start), which names the output
    directory; the input from those and that directory; the run."""

    key: Callable[[PipelineContext, Artifact | None], str]
    make_input: Callable[[PipelineContext, Artifact | None, Path], StageIn]
    run: Callable[[StageIn], Artifact]

    def run_into(self, ctx: PipelineContext, source: Artifact | None, out_dir: Path) -> Artifact:
        return self.run(self.make_input(ctx, source, out_dir))


def _need(source: Artifact | None, stage: Stage) -> Artifact:
    if source is None:
        raise ConfigValidationError(
            "pipeline.from", None, f"{stage} needs an input artifact; run the earlier stages"
        )
    return source


def _quantize_config(ctx: PipelineContext) -> QuantizeConfig:
    if ctx.quantize is None:  # PipelineContext guarantees a config unless quantize is skipped
        raise ConfigValidationError("pipeline.recipe", ctx.recipe.value, "is not quantized")
    return ctx.quantize


_PREPARE = StageRunner[PrepareInput](
    lambda ctx, src: prepare_cache_key(ctx.prepare),
    lambda ctx, src, out: PrepareInput(ctx.prepare, out),
    run_prepare,
)


def _quantize_input(ctx: PipelineContext, source: Artifact | None, out: Path) -> QuantizeInput:
    src = _need(source, Stage.QUANTIZE)
    return QuantizeInput(src, _quantize_config(ctx), out)


def _compile_input(ctx: PipelineContext, source: Artifact | None, out: Path) -> CompileInput:
    src = _need(source, Stage.COMPILE)
    # One context cache for every compile of this output tree: a rerun after a kill, or with a
    # program changed in some layers, rebuilds only the HTP contexts it lacks.
    return CompileInput(src, ctx.compile, out, context_cache=ctx.out_dir / CONTEXT_CACHE_DIR)


_QUANTIZE = StageRunner[QuantizeInput](
    lambda ctx, src: quantize_cache_key(_quantize_config(ctx), _need(src, Stage.QUANTIZE)),
    _quantize_input,
    run_quantize,
)
_COMPILE = StageRunner[CompileInput](
    lambda ctx, src: compile_cache_key(ctx.compile, _need(src, Stage.COMPILE)),
    _compile_input,
    run_compile,
)
_INFER = StageRunner[InferInput](
    lambda ctx, src: infer_cache_key(ctx.infer, _need(src, Stage.INFER)),
    lambda ctx, src, out: InferInput(_need(src, Stage.INFER), ctx.infer, out),
    run_infer,
)
_RUNNERS: dict[Stage, StageRunner[Any]] = {
    Stage.PREPARE: _PREPARE, Stage.QUANTIZE: _QUANTIZE, Stage.COMPILE: _COMPILE,
    Stage.INFER: _INFER,
}


def start_of(from_artifact: Path) -> Stage:
    """The first stage to run when resuming from `from_artifact`."""
    if from_artifact.is_dir():
        produced = Stage(load_manifest(from_artifact).stage)
        if produced is Stage.INFER:
            raise ArtifactError(from_artifact, "is an infer artifact: nothing is left to run")
        return list(Stage)[produced.position + 1]
    if from_artifact.suffix == ".pt2":
        return Stage.COMPILE
    if from_artifact.suffix == ".pte":
        return Stage.INFER
    raise ArtifactError(
        from_artifact, "not an artifact directory, .pt2 or .pte; cannot tell where to resume"
    )


def _cached(out_dir: Path, stage: Stage, key: str) -> Manifest | None:
    """The artifact's manifest if it is verified and made from exactly these inputs, else None.

    Locks `out_dir` first, so a concurrent run writing it is waited for and its artifact reused;
    on None the lock stays held until the stage seals (or the run ends).
    """
    acquire_artifact_lock(out_dir)
    if not (out_dir / MANIFEST_NAME).is_file():
        return None
    try:
        manifest = load_manifest(out_dir, expect_stage=stage, expect_cache_key=key)
        if stage is Stage.COMPILE:
            # A re-sealed artifact around another program must not be reported as this one.
            check_program_matches(out_dir, manifest)
    except ArtifactError as err:
        # The path says which file failed; the reason's own advice ("rerun the stage") is what
        # happens next anyway, so it is not repeated as if the user had to act.
        reason = re.sub(r";\s*rerun the stage.*$", "", err.reason)
        log.warning("%s: cached artifact refused, running the stage again: %s: %s",
                    stage, err.path, reason)
        return None
    release_artifact_lock(out_dir)
    return manifest


@cleans_up_artifacts  # unsealed staging directories and locks of a failed run
def run_pipeline(
    ctx: PipelineContext, *, from_artifact: Path | None = None,
    evaluation: EvalRequest | None = None,
) -> PipelineResult:
    """Run the stages `ctx` asks for and write `ctx.out_dir/summary.json`.

    Each stage gets the previous one's `Artifact`: the programs a stage saved go to the next
    stage in memory, not through a reload (the files are written and verified all the same).
    A run that misses its accuracy gates returns normally, its `gate_failure` set; with
    `evaluation`, the run's models are then evaluated (`qnn_pipeline.evaluation`), and a miss
    of those gates sets `eval_failure`.
    """
    first = start_of(from_artifact) if from_artifact is not None else Stage.PREPARE
    # Before any stage runs: a host without the backend's toolchain (QNN: a missing or skewed
    # SDK) must not cost a prepare + quantize.
    preflight(ctx.backend)
    if Stage.INFER not in ctx.skip and ctx.stop_after in (None, Stage.INFER):
        check_device_ready(ctx.infer)  # no adb or device must not cost three stages first
    families.preflight(ctx, first)  # each model family's checks of the settings
    if first is Stage.PREPARE:
        task_for(ctx.prepare)  # a model that names nothing fails here, before --out is touched
    # Only now, the run known to be valid: the previous run's summary must not pass for this
    # run's if this one fails. A file of that name that is not ours is refused, not replaced.
    remove_previous_summary(ctx.out_dir / SUMMARY_NAME)
    source = None if from_artifact is None else _resumed(from_artifact)
    records: list[StageRecord] = []
    manifests: dict[Stage, Manifest] = {}
    for stage in Stage:
        past_stop = ctx.stop_after is not None and stage.position > ctx.stop_after.position
        if stage.position < first.position or stage in ctx.skip or past_stop:
            records.append(StageRecord(stage, "skipped"))
            log.info("%s skipped", stage)
            continue
        runner = _RUNNERS[stage]
        key = runner.key(ctx, source)
        out_dir = ctx.out_dir / f"{stage}-{key[:12]}"
        cached = None if ctx.force else _cached(out_dir, stage, key)
        if cached is not None:
            log.info("%s cached: %s is up to date", stage, out_dir)
            records.append(StageRecord(stage, "cached", 0.0, out_dir))
            source = Artifact(out_dir, cached)
        else:
            log.info("%s started", stage)
            t = time.perf_counter()
            try:
                source = runner.run_into(ctx, source, out_dir)
            except PipelineError as err:
                if err.stage is None:
                    err.stage = stage
                raise
            except Exception as err:  # anything unforeseen still names the stage it broke in
                raise StageError(stage, f"failed: {type(err).__name__}: {err}", err) from err
            seconds = time.perf_counter() - t
            log.info("%s completed in %.1f s -> %s", stage, seconds, out_dir)
            records.append(StageRecord(stage, "ran", round(seconds, 3), out_dir))
        if source.manifest is not None:
            manifests[stage] = source.manifest
    extra: dict[str, Any] = {}
    eval_failure = None
    if evaluation is not None:
        dirs = {r.stage: r.artifact for r in records if r.artifact is not None}
        extra["evaluation"], eval_failure = run_evaluation(
            evaluation, dirs, backend=ctx.backend, recipe=ctx.recipe, out_dir=ctx.out_dir,
            generation=ctx.infer.generation,
        )
    summary, summary_path = write_summary(ctx, records, manifests, extra)
    infer = manifests.get(Stage.INFER)
    # Fresh or cached: a cached run that failed its gates (same program, inputs and gates) fails
    # again. The summary holds the numbers and accuracy.ok false either way.
    failure = None if infer is None or source is None else gate_failure(source.path, infer)
    return PipelineResult(tuple(records), summary, summary_path, failure, eval_failure)


def _resumed(path: Path) -> Artifact:
    """--from: an artifact directory with its manifest, or a bare .pt2 / .pte."""
    return Artifact.open(path)


