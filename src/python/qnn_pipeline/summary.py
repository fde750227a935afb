"""The run's summary: `OUT/summary.json` (a stable contract for scripts and CI dashboards) and
the table the CLI prints.

Built from the stages' sealed manifests; a previous run's summary is removed before a run starts
(it must not pass for this run's if this one fails), and a file of that name that is not one of
ours is refused rather than replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from qnn_common.config import Stage
from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.reports import Comparison, CompileReport, InferReport, QuantizeReport
from qnn_common.store.atomic import atomic_write_text, remove_orphaned_temps
from qnn_pipeline.context import PipelineContext

SUMMARY_NAME = "summary.json"
Status = Literal["ran", "cached", "skipped"]


@dataclass(frozen=True)
class StageRecord:
    """What happened to one stage in one run."""

    stage: Stage
    status: Status
    seconds: float = 0.0
    artifact: Path | None = None


# What every summary this pipeline writes carries as `format`, and how a previous run's file is
# told from a user's own `summary.json`: the keys alone were not enough (a user's file that held
# the five headline keys was deleted, issue 49). A summary written before the marker is refused
# like a user's file; the error says to move it away.
SUMMARY_FORMAT = "qnn-pipeline-summary"


def is_our_summary(path: Path) -> bool:
    """Whether `path` is a regular file (not a symlink) holding a summary this pipeline wrote."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return (isinstance(raw, dict) and raw.get("format") == SUMMARY_FORMAT
            and isinstance(raw.get("stages"), list))


def remove_our_summary(path: Path) -> None:
    """Delete `path` if it is a summary this pipeline wrote; leave anything else alone."""
    if is_our_summary(path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_previous_summary(path: Path) -> None:
    # A run killed while writing its summary left a temp file beside it; a later run into this
    # --out sweeps it (once its writer is gone) so the tree holds only what runs completed.
    remove_orphaned_temps(path)
    if not os.path.lexists(path):
        return
    if not is_our_summary(path):
        if not os.path.lexists(path):
            return  # removed meanwhile by another run into this --out (a sweep's cells share one)
        raise ArtifactError(
            path,
            "exists and is not a summary this pipeline wrote (none with a \"format\": "
            f"\"{SUMMARY_FORMAT}\"); refusing to replace it with this run's: move it away, or "
            "choose another --out",
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def write_summary(
    ctx: PipelineContext, records: list[StageRecord], manifests: dict[Stage, Manifest],
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Path]:
    """summary.json, with `extra` entries (the evaluation's) after the stages' own."""
    summary = {**build_summary(ctx, records, manifests), **(extra or {})}
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = ctx.out_dir / SUMMARY_NAME
    atomic_write_text(summary_path, json.dumps(summary, indent=2) + "\n")
    return summary, summary_path


def build_summary(
    ctx: PipelineContext, records: list[StageRecord], manifests: dict[Stage, Manifest]
) -> dict[str, Any]:
    """The run at a glance; the keys are a stable contract for scripts and CI dashboards."""
    quantized = QuantizeReport.of(manifests.get(Stage.QUANTIZE))
    compiled = CompileReport.of(manifests.get(Stage.COMPILE))
    run = InferReport.of(manifests.get(Stage.INFER))
    vs_fp32, vs_fake_quant = run.vs_fp32 or Comparison(), run.vs_fake_quant or Comparison()
    # A bare .pte (--from X.pte) records no recipe: label it with what the program holds, not
    # with the context's defaults (which would call any program "xnnpack, fp32").
    bare = run.bare_pte and run.delegates is not None
    return {
        "format": SUMMARY_FORMAT,
        "model": ctx.prepare.model,
        "backend": ("+".join(run.delegates or []) or "portable") if bare else ctx.backend.value,
        "recipe": None if run.bare_pte else ctx.recipe.value,
        "soc": ctx.soc,
        "target": compiled.target,
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
            "sqnr_db_vs_fp32": vs_fp32.sqnr_db,
            "cosine_vs_fp32": vs_fp32.cosine,
            "sqnr_db_vs_fake_quant": vs_fake_quant.sqnr_db,
            "fake_quant_sqnr_db_vs_fp32": (quantized.vs_fp32 or Comparison()).sqnr_db,
            # The infer gates' verdict: true / false, null when nothing was judged (no infer,
            # no reference for the inputs, or gates off).
            "ok": run.verdict.ok,
            "gates": run.verdict.gates,
            "failures": run.verdict.failures,
        },
        "worst_layers": quantized.worst_layers[:3],
        "latency_ms": {"p50": run.latency_ms.get("p50"), "p90": run.latency_ms.get("p90")},
        # Compute ops that read a dequantized tensor, in all and by ATen op (e.g. {"linear": 36,
        # "add": 12}): what the recipe really quantized (null for a float program).
        "quantized_ops": quantized.quantized_ops,
        "quantized_op_kinds": quantized.quantized_op_kinds,
        # Of those, ops whose activation scale is chosen at run time (qnn_quant.layers).
        "dynamic_ops": quantized.dynamic_ops,
        # The per-layer recipes and the layers each took (quantize.layer_recipes).
        "layer_recipes": [
            {k: e.get(k) for k in ("pattern", "recipe", "layers")}
            for e in quantized.layer_recipes or []
        ],
        "pte_bytes": compiled.pte_bytes,
        "delegated_ops": compiled.delegated_ops,
        "non_delegated_ops": compiled.non_delegated_ops,
        **_generation_summary(run, vs_fp32),
    }


def _generation_summary(run: InferReport, vs_fp32: Comparison) -> dict[str, Any]:
    """A causal LM's generation and its teacher-forced agreement with the eager HF model."""
    if run.generation is None:
        return {}
    return {
        "generation": {
            **{k: run.generation.get(k) for k in (
                "text", "new_tokens", "ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s",
            )},
            "argmax_agreement_vs_eager": vs_fp32.argmax_agreement,
            "sqnr_db_vs_eager": vs_fp32.sqnr_db,
            # Of the held-out eval texts: eager fp32, fake quant (if quantized), the program.
            "perplexity": run.perplexity,
            # The same texts token by token against eager fp32: KL divergence, same top token,
            # perplexity and its ratio to fp32's with bootstrap intervals over the windows.
            "next_token": run.next_token,
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


def _signed_percent(ratio: Any) -> str:
    return f"{ratio - 1:+.1%}" if isinstance(ratio, float | int) else "-"


def _next_token_line(record: dict[str, Any]) -> str | None:
    """The program against eager fp32 as llama.cpp's --kl-divergence words it, perplexity with
    its interval; the fake-quantized model's KL and same-top after it, where carried."""
    program = record.get("program")
    if not isinstance(program, dict):
        return None
    kl, ppl, ratio = (program.get(k) or {} for k in (
        "kl_divergence", "perplexity", "perplexity_ratio"))

    def num(value: Any, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, float | int) else str(value)

    line = (
        f"KL vs fp32 ({kl.get('tokens')} tokens): mean {num(kl.get('mean'), '.4f')}, "
        f"p99 {num(kl.get('p99'), '.3f')}, max {num(kl.get('max'), '.3f')} nats; "
        f"same top {num(program.get('same_top_percent'), '.1f')} % "
        f"({program.get('flips')} flips, {program.get('near_tie_flips')} on a near tie "
        f"< {program.get('near_tie_nats')} nats); "
        f"perplexity {num(ppl.get('value'), '.3f')} [{num(ppl.get('low'), '.3f')}, "
        f"{num(ppl.get('high'), '.3f')}] ({_signed_percent(ratio.get('value'))} "
        f"[{_signed_percent(ratio.get('low'))}, {_signed_percent(ratio.get('high'))}] vs fp32; "
        f"{num(100 * ppl.get('confidence', 0), '.0f')} % over {ppl.get('windows')} windows)"
    )
    fake = record.get("fake_quant")
    if isinstance(fake, dict):
        fake_kl = (fake.get("kl_divergence") or {}).get("mean")
        line += (f"; fake quant: KL mean {num(fake_kl, '.4f')}, "
                 f"same top {num(fake.get('same_top_percent'), '.1f')} %")
    return line


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
    if summary.get("layer_recipes"):
        lines.append("layer recipes: " + "; ".join(
            f"{e['pattern']} -> {e['recipe']} ({e['layers']} layer(s))"
            for e in summary["layer_recipes"]))
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
        next_token = gen.get("next_token")
        line = _next_token_line(next_token) if isinstance(next_token, dict) else None
        if line:
            lines.append(line)
    evaluation = summary.get("evaluation")
    if isinstance(evaluation, dict):
        lines.append(evaluation_line(evaluation))
    return "\n".join(lines)


def evaluation_line(entry: dict[str, Any]) -> str:
    """One terminal line of the program's evaluation (`qnn_pipeline.evaluation`)."""
    ratio = entry.get("perplexity_ratio") or {}
    gates = entry.get("gates")
    verdict = "not judged" if gates is None else ("ok" if gates["ok"] else "FAILED")
    kl = entry.get("kl_mean")
    top = entry.get("same_top_percent")
    return (
        f"eval ({entry['suite']}): KL {'-' if kl is None else f'{kl:.4f}'} nats, same top "
        f"{'-' if top is None else f'{top:.1f}'} % over {entry.get('corpus_tokens')} tokens; "
        f"perplexity {_pct(ratio.get('value'))} [{_pct(ratio.get('low'))}, "
        f"{_pct(ratio.get('high'))}] vs fp32; answers {entry.get('answers_found')}/"
        f"{entry.get('answers_known')} (fp32 {entry.get('fp32_answer_percent')} %); tasks acc "
        f"{entry.get('task_acc')} % (fp32 {entry.get('fp32_task_acc')} %); gates: {verdict}; "
        f"{entry['report']}"
    )


def _pct(ratio: Any) -> str:
    return "-" if not isinstance(ratio, int | float) else f"{100 * (ratio - 1):+.1f} %"
