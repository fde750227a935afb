"""Judging a run against its accuracy gates, and the error a CLI ends a run below them with."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from qnn_common.config import Stage
from qnn_common.errors import PipelineError
from qnn_common.gates import NEXT_RECIPE, AccuracyGates
from qnn_common.manifest import Manifest
from qnn_common.recipes import Recipe
from qnn_common.reports import GateVerdict, InferReport

# Each gate: its field, the comparison it reads ("vs_fp32" / "vs_fake_quant" / "perplexity"), the
# metric, and the qnn-infer / qnn-pipeline flag that sets it. `max_*` gates are upper bounds.
GATES: tuple[tuple[str, str, str, str], ...] = (
    ("min_sqnr_db_vs_fp32", "vs_fp32", "sqnr_db", "--min-sqnr-db"),
    ("min_cosine_vs_fp32", "vs_fp32", "cosine", "--min-cosine"),
    ("min_sqnr_db_vs_fake_quant", "vs_fake_quant", "sqnr_db", "--min-sqnr-db-vs-fake-quant"),
    ("min_cosine_vs_fake_quant", "vs_fake_quant", "cosine", "--min-cosine-vs-fake-quant"),
    ("max_perplexity_vs_fake_quant", "perplexity", "ratio_vs_fake_quant",
     "--max-perplexity-vs-fake-quant"),
    # Causal LMs (accuracy["next_token"]["program"]), each judged at the end of its bootstrap
    # interval that noise cannot reach, so a run fails only where its whole interval does.
    ("max_kl_vs_fp32", "next_token", "kl_mean_low", "--max-kl-vs-fp32"),
    ("min_same_top_percent_vs_fp32", "next_token", "same_top_high", "--min-same-top-vs-fp32"),
)
GATE_FLAGS: dict[str, str] = {name: flag for name, _, _, flag in GATES}


def _measured(accuracy: dict[str, Any], comparison: str, metric: str) -> float | None:
    """The value a gate reads, or None when the run has nothing to compare."""
    if comparison not in accuracy:
        return None
    if metric == "ratio_vs_fake_quant":  # program / fake-quant perplexity
        found = accuracy[comparison]
        if "program" not in found or "fake_quant" not in found:
            return None
        return float(found["program"]) / float(found["fake_quant"])
    if comparison == "next_token":
        return next_token_bound(accuracy[comparison].get("program"), metric)
    return float(accuracy[comparison][metric])


def next_token_bound(record: dict[str, Any] | None, metric: str) -> float | None:
    """A next-token comparison's figure at the end of its interval a gate reads: the KL mean's
    low end, the same-top %'s high end, near ties forgiven (the point itself where no interval
    was recorded)."""
    if record is None:
        return None
    if metric == "kl_mean_low":
        kl = record["kl_divergence"]
        return float(kl.get("mean_interval", {}).get("low", kl["mean"]))
    # Near-tie flips forgiven where recorded (`same_top_decided_percent`), else every flip.
    interval = record.get("same_top_decided_percent") or record.get("same_top_percent_interval")
    return float((interval or {}).get("high", record["same_top_percent"]))


class AccuracyGateError(PipelineError):
    """The program ran, but its outputs are less accurate than the infer gates allow.

    The infer artifact is written and sealed anyway (its outputs are the evidence): `artifact_dir`
    and `manifest` point at it, and `failures` lists each gate missed with the measured value.
    """

    stage = Stage.INFER

    def __init__(self, artifact_dir: Path, manifest: Manifest, failures: list[dict[str, Any]],
                 recipe: str | None, accuracy: dict[str, Any] | None = None) -> None:
        self.artifact_dir = artifact_dir
        self.manifest = manifest
        self.failures = failures
        what = f"this {recipe} program" if recipe else "this program"
        missed = "; ".join(
            f"{LABELS[f['metric']]} {f['comparison'].replace('_', ' ')} "
            f"{_fmt(f['value'], f['metric'])} {'>' if f['field'].startswith('max_') else '<'} "
            f"{_fmt(f['gate'], f['metric'])} ({f['field']})"
            for f in failures
        )
        relaxed = [(f["field"], _fmt(_relaxed(f["metric"], f["value"]), "")) for f in failures]
        flags = " ".join(f"{GATE_FLAGS[name]} {value}" for name, value in relaxed)
        toml = ", ".join(f"{name} = {value}" for name, value in relaxed)
        cause = _recipe_cause(failures, accuracy or {}, recipe)
        super().__init__(
            f"infer: the outputs of {what} are below the accuracy gates: {missed}.{cause} The "
            f"outputs are kept in {artifact_dir} for inspection. If this accuracy is expected, "
            f"relax the gate ({flags}, or under [infer] in the TOML file: {toml}), or pass "
            "--no-accuracy-gates to report without checking"
        )


# How much closer to its fake-quantized model than to fp32 a program must be for a missed
# vs-fp32 gate to be the quantization's loss rather than the compile's.
_RECIPE_LOSS_MARGIN_DB = 10.0


def _fake_quant_match(failures: list[dict[str, Any]], accuracy: dict[str, Any]) -> float | None:
    """The program's SQNR against its fake-quantized model when only vs-fp32 gates failed and
    the program is much closer to that model than to fp32; else None."""
    comparisons = {f["comparison"] for f in failures}
    if comparisons != {"vs_fp32"}:
        return None
    vs_fake_quant = (accuracy.get("vs_fake_quant") or {}).get("sqnr_db")
    vs_fp32 = (accuracy.get("vs_fp32") or {}).get("sqnr_db")
    if vs_fake_quant is None or vs_fp32 is None:
        return None
    if float(vs_fake_quant) < float(vs_fp32) + _RECIPE_LOSS_MARGIN_DB:
        return None
    return float(vs_fake_quant)


def _recipe_cause(
    failures: list[dict[str, Any]], accuracy: dict[str, Any], recipe: str | None
) -> str:
    """The sentence blaming the recipe where the fake-quantized model loses as much (by its
    logits' SQNR, or by its next token's KL); empty where nothing says so."""
    per_layer = "or read the quantize stage's per-layer report for the layers that lose it."
    matched = _fake_quant_match(failures, accuracy)
    if matched is not None:
        return (f" The program matches its fake-quantized model ({_fmt(matched, 'sqnr_db')}), "
                f"so the loss is the recipe's, not the compile's: {_more_bits(recipe)}, "
                f"{per_layer}")
    recipe_kl = _fake_quant_kl(failures, accuracy)
    if recipe_kl is not None:
        return (f" Its fake-quantized model is about as far from fp32 (KL {recipe_kl:.4g}), so "
                f"the loss is the recipe's, not the compile's: {_more_bits(recipe)}, {per_layer}")
    return ""


def _more_bits(recipe: str | None) -> str:
    known = {r.value: r for r in Recipe}
    nxt = NEXT_RECIPE.get(known[recipe]) if recipe in known else None
    return ("pick more bits" if not nxt
            else "try --recipe " + " or ".join(r.value for r in nxt))


def _fake_quant_kl(failures: list[dict[str, Any]], accuracy: dict[str, Any]) -> float | None:
    """The fake-quantized model's mean KL from fp32 when only next-token gates failed and it is
    at least half the program's (the recipe loses that much before any compile); else None."""
    if {f["comparison"] for f in failures} != {"next_token"}:
        return None
    record = accuracy.get("next_token") or {}
    fake, program = record.get("fake_quant"), record.get("program")
    if fake is None or program is None:
        return None
    kl = float(fake["kl_divergence"]["mean"])
    return kl if kl >= 0.5 * float(program["kl_divergence"]["mean"]) else None


LABELS = {"sqnr_db": "SQNR", "cosine": "cosine",
          "ratio_vs_fake_quant": "program / fake-quant ratio of",
          "kl_mean_low": "KL divergence from fp32 (its interval's low end) of the",
          "same_top_high": "same top token as fp32 where it decided, % (near ties forgiven; its "
          "interval's high end), of the"}


def _fmt(value: float, metric: str) -> str:
    text = "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:.4g}"
    return text + (" dB" if metric == "sqnr_db" else "")


def _relaxed(metric: str, value: float) -> float:
    """A gate just below the measured value, to suggest in the error message."""
    if not math.isfinite(value):
        return -math.inf if metric == "sqnr_db" else -1.0
    if metric == "sqnr_db":
        return math.floor(value)
    if metric in ("ratio_vs_fake_quant", "kl_mean_low"):  # upper bounds: just above
        return math.ceil(value * 100) / 100
    if metric == "same_top_high":
        return math.floor(value)
    return max(-1.0, math.floor(value * 1000) / 1000)


def judge_accuracy(
    accuracy: dict[str, Any], gates: AccuracyGates, recipe: Recipe | None = None
) -> GateVerdict:
    """The gate verdict recorded in the infer manifest (`InferReport.accuracy_gates`).

    `ok` is True when every gate with a reference passed, False when one failed, and None when
    there was nothing to judge (no reference for these inputs, or no gate for what there is).
    """
    failures: list[dict[str, Any]] = []
    checked = 0
    for name, comparison, metric, _ in GATES:
        gate = getattr(gates, name)
        value = None if gate is None else _measured(accuracy, comparison, metric)
        if gate is None or value is None:
            continue
        checked += 1
        # NaN (nothing comparable) fails: a gate that cannot be checked must not read as passed.
        if not (value <= gate if name.startswith("max_") else value >= gate):
            failures.append({"field": name, "comparison": comparison, "metric": metric,
                             "value": value, "gate": gate})
    return GateVerdict(
        ok=None if checked == 0 else not failures,
        recipe=None if recipe is None else recipe.value,
        gates=dataclasses.asdict(gates),
        failures=failures,
    )


def gate_failure(artifact_dir: Path, manifest: Manifest) -> AccuracyGateError | None:
    """The error a run below its gates ends with, from the infer artifact's recorded verdict;
    None if it passed or nothing was judged.

    Infer seals its artifact and returns whatever the verdict (the outputs are the evidence);
    the CLIs turn a failure into exit code 2. Read for every infer result, fresh or cached: a
    cached artifact that failed its gates (same program, inputs and gates) fails again rather
    than passing on the second run.
    """
    report = InferReport.of(manifest)
    if report.verdict.ok is not False:
        return None
    failures = [
        {**f, "value": float(f["value"]), "gate": float(f["gate"])}  # "inf" strings in JSON
        for f in report.verdict.failures
    ]
    return AccuracyGateError(artifact_dir, manifest, failures, report.verdict.recipe,
                             report.accuracy)
