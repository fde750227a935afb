"""Typed views of what the quantize, compile and infer stages record in their manifests' metrics.

Each stage writes its figures as JSON (`Manifest.metrics`); a reader (the pipeline's summary, a
sweep, a dashboard script) takes them through these views instead of walking key paths of its
own, so each key is spelled once on the reading side. A figure a stage did not record (a float
program has no quantized ops, a run without references no comparison) reads as None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qnn_common.manifest import Manifest

# SQNRs are floats, or "inf" / "-inf" as JSON has no infinity (metrics.json_float).
Sqnr = float | str


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Comparison:
    """Outputs against one reference (fp32, or the fake-quantized model)."""

    sqnr_db: Sqnr | None = None
    cosine: float | None = None
    argmax_agreement: float | None = None  # causal LMs, teacher-forced logits

    @classmethod
    def of(cls, record: Any) -> Comparison | None:
        if not isinstance(record, dict):
            return None
        return cls(record.get("sqnr_db"), record.get("cosine"), record.get("argmax_agreement"))


@dataclass(frozen=True)
class QuantizeReport:
    """What quantizing did: the fake-quant model against fp32, its worst layers, what it
    quantized (in all, by ATen op, and how many with run-time activation scales)."""

    vs_fp32: Comparison | None = None
    worst_layers: list[dict[str, Any]] = field(default_factory=list)
    quantized_ops: int | None = None
    quantized_op_kinds: dict[str, int] | None = None
    dynamic_ops: int | None = None
    # The per-layer recipe table's entries, each with the layers it took (pattern, recipe,
    # layers, module_paths); empty when the whole model is at its recipe.
    layer_recipes: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, manifest: Manifest | None) -> QuantizeReport:
        if manifest is None:
            return cls()
        m, accuracy = manifest.metrics, _dict(manifest.metrics.get("accuracy"))
        return cls(
            Comparison.of(accuracy.get("vs_fp32")), list(accuracy.get("worst_layers") or []),
            m.get("quantized_ops"), m.get("quantized_op_kinds"), m.get("dynamic_ops"),
            list(m.get("layer_recipes") or []),
        )


@dataclass(frozen=True)
class CompileReport:
    """The lowered program: its target record, size and how much of it the backend took."""

    target: dict[str, Any] | None = None
    pte_bytes: int | None = None
    delegated_ops: int | None = None
    non_delegated_ops: int | None = None

    @classmethod
    def of(cls, manifest: Manifest | None) -> CompileReport:
        if manifest is None:
            return cls()
        m = manifest.metrics
        return cls(m.get("target"), m.get("pte_bytes"), m.get("delegated_ops"),
                   m.get("non_delegated_ops"))


@dataclass(frozen=True)
class GateVerdict:
    """The infer gates' verdict: ok True / False, None when nothing was judged."""

    ok: bool | None = None
    gates: dict[str, Any] | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class InferReport:
    """A run of the program: accuracy against the references, the gates' verdict, latency, and
    for a causal LM its generation and perplexities. `bare_pte`: run from a bare .pte, whose
    recipe nothing recorded; `delegates` then names the backends its delegates are for.
    `next_token`: a causal LM's fake-quantized model and program against eager fp32 token by
    token (`qnn_common.numerics.lm_metrics`: KL divergence, same top token, perplexity
    intervals)."""

    vs_fp32: Comparison | None = None
    vs_fake_quant: Comparison | None = None
    verdict: GateVerdict = field(default_factory=GateVerdict)
    latency_ms: Mapping[str, float] = field(default_factory=dict)
    generation: dict[str, Any] | None = None
    perplexity: dict[str, Any] | None = None
    bare_pte: bool = False
    delegates: list[str] | None = None
    next_token: dict[str, Any] | None = None

    @classmethod
    def of(cls, manifest: Manifest | None) -> InferReport:
        if manifest is None:
            return cls()
        m, accuracy = manifest.metrics, _dict(manifest.metrics.get("accuracy"))
        gates = _dict(m.get("accuracy_gates"))
        generation = m.get("generation")
        perplexity = accuracy.get("perplexity")
        next_token = accuracy.get("next_token")
        return cls(
            Comparison.of(accuracy.get("vs_fp32")), Comparison.of(accuracy.get("vs_fake_quant")),
            GateVerdict(gates.get("ok"), gates.get("gates"), list(gates.get("failures") or [])),
            _dict(m.get("latency_ms")),
            generation if isinstance(generation, dict) else None,
            perplexity if isinstance(perplexity, dict) else None,
            "pte" in manifest.inputs, m.get("delegates"),
            next_token if isinstance(next_token, dict) else None,
        )
