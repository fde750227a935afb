"""Chains prepare -> quantize -> compile -> infer through artifact directories.

Each stage's output lands in `OUT/<stage>-<cache key[:12]>/`. The key covers the stage config, the
digests of its inputs and the package and tool versions, so a rerun finds an up-to-date artifact
(its manifest verified, hashes and all) and skips the stage; a changed input changes the key and
only the stages downstream of it run again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from qnn_common import program_handoff
from qnn_common.artifact_dir import cleans_up_artifacts
from qnn_common.artifact_lock import acquire_artifact_lock, release_artifact_lock
from qnn_common.config import PipelineContext, QuantizeConfig, Stage
from qnn_common.errors import ArtifactError, ConfigValidationError, PipelineError, StageError
from qnn_common.manifest import MANIFEST_NAME, Manifest, atomic_write_text, load_manifest
from qnn_common.qnn_sdk import check_compatible, find_qnn_sdk
from qnn_common.recipes import Backend
from qnn_common.stages import (
    CompileInput,
    InferInput,
    PrepareInput,
    QuantizeInput,
)
from qnn_compile.api import compile_cache_key, run_compile
from qnn_infer.api import infer_cache_key, run_infer
from qnn_infer.gate_check import AccuracyGateError, check_accuracy_gates
from qnn_infer.program_check import check_program_matches
from qnn_prepare.api import prepare_cache_key, run_prepare
from qnn_prepare.causal_lm import check_prompt_fits
from qnn_prepare.models import task_for
from qnn_quant.api import quantize_cache_key, run_quantize

log = logging.getLogger(__name__)

Status = Literal["ran", "cached", "skipped"]
SUMMARY_NAME = "summary.json"


@dataclass(frozen=True)
class StageRecord:
    """What happened to one stage in one run."""

    stage: Stage
    status: Status
    seconds: float = 0.0
    artifact: Path | None = None


@dataclass(frozen=True)
class PipelineResult:
    records: tuple[StageRecord, ...]
    summary: dict[str, Any]
    summary_path: Path


StageIn = TypeVar("StageIn", PrepareInput, QuantizeInput, CompileInput, InferInput)


class _Sealed(Protocol):
    """What every stage's run returns: its sealed artifact's manifest (and more)."""

    @property
    def manifest(self) -> Manifest: ...


@dataclass(frozen=True)
class StageRunner(Generic[StageIn]):
    """How the orchestrator drives one stage, typed by that stage's input: build the input from
    the run's context, the upstream artifact (None at the start) and the output directory; key
    it; run it. The key does not depend on the output directory (which is named after the key),
    so it is computed on the input for `KEY_ONLY`."""

    make_input: Callable[[PipelineContext, Path | None, Path], StageIn]
    cache_key: Callable[[StageIn], str]
    run: Callable[[StageIn], _Sealed]

    def key(self, ctx: PipelineContext, source: Path | None) -> str:
        return self.cache_key(self.make_input(ctx, source, KEY_ONLY))

    def run_into(self, ctx: PipelineContext, source: Path | None, out_dir: Path) -> Manifest:
        return self.run(self.make_input(ctx, source, out_dir)).manifest


# The output directory of an input built only for its cache key: never written.
KEY_ONLY = Path()


def _need(source: Path | None, stage: Stage) -> Path:
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
    lambda ctx, src, out: PrepareInput(ctx.prepare, out),
    lambda inp: prepare_cache_key(inp.config),
    run_prepare,
)
_QUANTIZE = StageRunner[QuantizeInput](
    lambda ctx, src, out: QuantizeInput(_need(src, Stage.QUANTIZE), _quantize_config(ctx), out),
    quantize_cache_key,
    run_quantize,
)
_COMPILE = StageRunner[CompileInput](
    lambda ctx, src, out: CompileInput(_need(src, Stage.COMPILE), ctx.compile, out),
    compile_cache_key,
    run_compile,
)
_INFER = StageRunner[InferInput](
    lambda ctx, src, out: InferInput(_need(src, Stage.INFER), ctx.infer, out),
    infer_cache_key,
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
# Each program a stage saves goes to the next stage in memory, not through a reload
# (qnn_common.program_handoff); the files are written and verified all the same.
@program_handoff.handing_over()
def run_pipeline(ctx: PipelineContext, *, from_artifact: Path | None = None) -> PipelineResult:
    """Run the stages `ctx` asks for and write `ctx.out_dir/summary.json`."""
    first = start_of(from_artifact) if from_artifact is not None else Stage.PREPARE
    if ctx.backend is Backend.QNN:
        # Before any stage runs: a missing or skewed QNN SDK must not cost a prepare + quantize.
        sdk = find_qnn_sdk()
        check_compatible(sdk)
        log.info("QNN %s at %s%s", sdk.qnn_version, sdk.root,
                 " (x86 dev SDK, bridged)" if sdk.bridged else "")
    generation = ctx.infer.generation
    if first is Stage.PREPARE and generation is not None and not ctx.prepare.kv_cache:
        # Without a KV cache the program is a plain forward: the prompt would be dropped, and
        # the run would exit 0 as if it had generated.
        raise ConfigValidationError(
            "infer.generation", {"prompt": generation.prompt[:40]},
            "generation needs a causal LM exported with a KV cache, and prepare.kv_cache is "
            "off: set `kv_cache = true` under [prepare] (what --prompt does), or remove "
            "[infer.generation]",
        )
    if first is Stage.PREPARE and ctx.prepare.kv_cache and generation is not None:
        # A prompt the context cannot hold is refused before minutes of export and lowering.
        check_prompt_fits(
            ctx.prepare.model, max_seq_len=ctx.prepare.max_seq_len,
            prefill_len=ctx.prepare.prefill_len, prompt=generation.prompt,
            max_new_tokens=generation.max_new_tokens,
        )
    if first is Stage.PREPARE:
        task_for(ctx.prepare)  # a model that names nothing fails here, before --out is touched
    # Only now, the run known to be valid: the previous run's summary must not pass for this
    # run's if this one fails. A file of that name that is not ours is refused, not replaced.
    _remove_previous_summary(ctx.out_dir / SUMMARY_NAME)
    source = from_artifact
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
        gate_error: AccuracyGateError | None = None
        if cached is not None:
            log.info("%s cached: %s is up to date", stage, out_dir)
            program_handoff.discard()  # the next stage reads this artifact, not the last
            records.append(StageRecord(stage, "cached", 0.0, out_dir))
            manifests[stage] = cached
            if stage is Stage.INFER:
                # Same program, inputs and gates: a run that failed its gates fails again.
                try:
                    check_accuracy_gates(out_dir, cached)
                except AccuracyGateError as err:
                    gate_error = err
        else:
            log.info("%s started", stage)
            t = time.perf_counter()
            try:
                manifests[stage] = runner.run_into(ctx, source, out_dir)
            except AccuracyGateError as err:  # the stage ran and sealed its artifact
                manifests[stage] = err.manifest
                gate_error = err
            except PipelineError as err:
                if err.stage is None:
                    err.stage = stage
                raise
            except Exception as err:  # anything unforeseen still names the stage it broke in
                raise StageError(stage, f"failed: {type(err).__name__}: {err}", err) from err
            seconds = time.perf_counter() - t
            log.info("%s completed in %.1f s -> %s", stage, seconds, out_dir)
            records.append(StageRecord(stage, "ran", round(seconds, 3), out_dir))
        if gate_error is not None:
            # The run is complete (infer is last) but wrong: write the summary, with accuracy.ok
            # false and the numbers, for the dashboards, then fail the pipeline.
            records.extend(StageRecord(s, "skipped") for s in list(Stage)[stage.position + 1:])
            _write_summary(ctx, records, manifests)
            raise gate_error
        source = out_dir
    summary, summary_path = _write_summary(ctx, records, manifests)
    return PipelineResult(tuple(records), summary, summary_path)


# Keys every summary this pipeline writes has had (build_summary): how a previous run's file is
# told from a user's own `summary.json`.
_SUMMARY_KEYS = frozenset({"model", "backend", "recipe", "stages", "accuracy"})


def is_our_summary(path: Path) -> bool:
    """Whether `path` is a regular file (not a symlink) holding a summary this pipeline wrote."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(raw, dict):
        return False
    return raw.keys() >= _SUMMARY_KEYS and isinstance(raw["stages"], list)


def _remove_previous_summary(path: Path) -> None:
    if not os.path.lexists(path):
        return
    if not is_our_summary(path):
        if not os.path.lexists(path):
            return  # removed meanwhile by another run into this --out (a sweep's cells share one)
        raise ArtifactError(
            path,
            "exists and is not a summary this pipeline wrote; refusing to replace it with this "
            "run's: move it away, or choose another --out",
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _write_summary(
    ctx: PipelineContext, records: list[StageRecord], manifests: dict[Stage, Manifest]
) -> tuple[dict[str, Any], Path]:
    summary = build_summary(ctx, records, manifests)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = ctx.out_dir / SUMMARY_NAME
    atomic_write_text(summary_path, json.dumps(summary, indent=2) + "\n")
    return summary, summary_path


def build_summary(
    ctx: PipelineContext, records: list[StageRecord], manifests: dict[Stage, Manifest]
) -> dict[str, Any]:
    """The run at a glance; the keys are a stable contract for scripts and CI dashboards."""

    def metric(stage: Stage, *path: str) -> Any:
        value: Any = manifests[stage].metrics if stage in manifests else None
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    # A bare .pte (--from X.pte) records no recipe: label it with what the program holds, not
    # with the context's defaults (which would call any program "xnnpack, fp32").
    infer = manifests.get(Stage.INFER)
    bare = infer is not None and "pte" in infer.inputs
    delegates = infer.metrics.get("delegates") if infer is not None else None
    return {
        "model": ctx.prepare.model,
        "backend": ("+".join(delegates) or "portable") if bare and delegates is not None
        else ctx.backend.value,
        "recipe": None if bare else ctx.recipe.value,
        "soc": ctx.soc,
        "target": metric(Stage.COMPILE, "target"),
        "stages": [
            {
                "name": r.stage.value,
                "status": r.status,
                "seconds": r.seconds,
                "artifact": None if r.artifact is None else str(r.artifact),
            }
            for r in records
        ],
        "accuracy": {
            "sqnr_db_vs_fp32": metric(Stage.INFER, "accuracy", "vs_fp32", "sqnr_db"),
            "cosine_vs_fp32": metric(Stage.INFER, "accuracy", "vs_fp32", "cosine"),
            "sqnr_db_vs_fake_quant": metric(Stage.INFER, "accuracy", "vs_fake_quant", "sqnr_db"),
            "fake_quant_sqnr_db_vs_fp32": metric(Stage.QUANTIZE, "accuracy", "vs_fp32", "sqnr_db"),
            # The infer gates' verdict: true / false, null when nothing was judged (no infer,
            # no reference for the inputs, or gates off).
            "ok": metric(Stage.INFER, "accuracy_gates", "ok"),
            "gates": metric(Stage.INFER, "accuracy_gates", "gates"),
            "failures": metric(Stage.INFER, "accuracy_gates", "failures") or [],
        },
        "worst_layers": (metric(Stage.QUANTIZE, "accuracy", "worst_layers") or [])[:3],
        "latency_ms": {
            "p50": metric(Stage.INFER, "latency_ms", "p50"),
            "p90": metric(Stage.INFER, "latency_ms", "p90"),
        },
        # Compute ops that read a dequantized tensor, in all and by ATen op (e.g. {"linear": 36,
        # "add": 12}): what the recipe really quantized (null for a float program).
        "quantized_ops": metric(Stage.QUANTIZE, "quantized_ops"),
        "quantized_op_kinds": metric(Stage.QUANTIZE, "quantized_op_kinds"),
        # Of those, ops whose activation scale is chosen at run time (qnn_quant.layers).
        "dynamic_ops": metric(Stage.QUANTIZE, "dynamic_ops"),
        "pte_bytes": metric(Stage.COMPILE, "pte_bytes"),
        "delegated_ops": metric(Stage.COMPILE, "delegated_ops"),
        "non_delegated_ops": metric(Stage.COMPILE, "non_delegated_ops"),
        **_generation_summary(metric),
    }


def _generation_summary(metric: Callable[..., Any]) -> dict[str, Any]:
    """A causal LM's generation and its teacher-forced agreement with the eager HF model."""
    generation = metric(Stage.INFER, "generation")
    if not isinstance(generation, dict):
        return {}
    return {
        "generation": {
            **{k: generation.get(k) for k in (
                "text", "new_tokens", "ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s",
            )},
            "argmax_agreement_vs_eager": metric(
                Stage.INFER, "accuracy", "vs_fp32", "argmax_agreement"
            ),
            "sqnr_db_vs_eager": metric(Stage.INFER, "accuracy", "vs_fp32", "sqnr_db"),
            # Of the held-out eval texts: eager fp32, fake quant (if quantized), the program.
            "perplexity": metric(Stage.INFER, "accuracy", "perplexity"),
        }
    }


def _perplexity_line(ppl: dict[str, Any]) -> str:
    figures = [f"{label} {ppl[key]:.3f}" for key, label in (
        ("fp32", "eager fp32"), ("fake_quant", "fake quant"), ("program", "program"),
    ) if isinstance(ppl.get(key), float | int)]
    change = ppl.get("vs_fp32")
    return (
        f"perplexity of the held-out text ({ppl.get('tokens')} tokens): " + ", ".join(figures)
        + (f" ({change:+.1%} vs fp32)" if isinstance(change, float | int) else "")
    )


def _verdict(ok: bool | None) -> str:
    return "gates: -" if ok is None else "gates: ok" if ok else "gates: FAILED"


def format_summary(summary: dict[str, Any]) -> str:
    """A terminal table of the stages followed by the headline numbers."""
    lines = [f"{'stage':10s} {'status':8s} {'seconds':>8s}  artifact"]
    for s in summary["stages"]:
        lines.append(
            f"{s['name']:10s} {s['status']:8s} {s['seconds']:8.1f}  {s['artifact'] or '-'}"
        )
    acc, lat = summary["accuracy"], summary["latency_ms"]

    def num(value: Any, fmt: str) -> str:
        if value is None:
            return "-"
        return value if isinstance(value, str) else format(value, fmt)  # "inf" stays "inf"

    lines.append("")
    lines.append(
        f"{summary['model']} on {summary['backend']} "
        f"({summary['recipe'] or 'recipe unknown: a bare .pte'}"
        f"{', ' + summary['soc'] if summary['soc'] else ''}): "
        f"SQNR vs fp32 {num(acc['sqnr_db_vs_fp32'], '.1f')} dB, "
        f"cosine {num(acc['cosine_vs_fp32'], '.4f')}, "
        f"vs fake-quant {num(acc['sqnr_db_vs_fake_quant'], '.1f')} dB "
        f"({_verdict(acc.get('ok'))}); "
        f"latency p50 {num(lat['p50'], '.3f')} ms, p90 {num(lat['p90'], '.3f')} ms; "
        f".pte {num(summary['pte_bytes'], ',')} bytes"
    )
    kinds = summary.get("quantized_op_kinds")
    if summary.get("quantized_ops") is not None:
        by_kind = ", ".join(f"{k} {n}" for k, n in (kinds or {}).items())
        dynamic = summary.get("dynamic_ops")
        lines.append(
            f"quantized ops: {summary['quantized_ops']}" + (f" ({by_kind})" if by_kind else "")
            + (f", of which {dynamic} dynamic (activation scale per call)" if dynamic else "")
        )
    gen = summary.get("generation")
    if gen:
        lines.append(
            f"generated {gen['new_tokens']} token(s): {gen['text']!r}\n"
            f"time to first token {num(gen['ttft_ms'], '.1f')} ms, "
            f"prefill {num(gen['prefill_tokens_per_s'], '.1f')} tok/s, "
            f"decode {num(gen['decode_tokens_per_s'], '.1f')} tok/s; "
            f"argmax agreement vs eager {num(gen['argmax_agreement_vs_eager'], '.3f')}, "
            f"SQNR vs eager {num(gen['sqnr_db_vs_eager'], '.1f')} dB"
        )
        ppl = gen.get("perplexity")
        if isinstance(ppl, dict):
            lines.append(_perplexity_line(ppl))
    return "\n".join(lines)
