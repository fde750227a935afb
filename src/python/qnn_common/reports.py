"""What the quantize, compile and infer stages record in their manifests' metrics, typed.

Both sides go through these dataclasses: a stage builds its report and seals `to_metrics()`; a
reader (the pipeline's summary, a sweep, a dashboard script) takes `Report.of(manifest)`. A
field's name is its key in the manifest, so each key is spelled once, and a field a stage did not
record (a float program has no quantized ops, a run without references no comparison, a program
without shards no shard table) is None on the reading side and absent from the JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from qnn_common.manifest import Manifest
from qnn_common.recipes import Recipe

# SQNRs are floats, or "inf" / "-inf" as JSON has no infinity (metrics.json_float).
Sqnr = float | str

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_R = TypeVar("_R", bound="DataclassInstance")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _to_metrics(report: DataclassInstance, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The report's fields as the manifest's metrics, in field order, None left out."""
    return {f.name: getattr(report, f.name) for f in dataclasses.fields(report)
            if f.name not in skip and getattr(report, f.name) is not None}


def _of(cls: type[_R], metrics: Mapping[str, Any], **typed: Any) -> _R:
    """A report read back from metrics: each field under its own name, `typed` overriding."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{n: metrics.get(n) for n in names if n in metrics and n not in typed}, **typed)


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


# A weight transform's record sits under its name: GPTQ's, or a dynamic recipe's (8da4w: its
# groups, the linears it quantized and those it kept float).
WEIGHT_RECORDS = ("gptq", *(r.value for r in Recipe if r.is_dynamic))


@dataclass(frozen=True)
class QuantizeReport:
    """What quantizing did: what it quantized (in all, by ATen op, and how many with run-time
    activation scales), the weight rounding and its record, the per-layer recipes, and the
    fake-quant model against fp32 (`accuracy`: `qnn_quant.report`'s record)."""

    model: str | None = None
    quantized_ops: int | None = None
    quantized_op_kinds: dict[str, int] | None = None
    dynamic_ops: int | None = None
    weight_rounding: str | None = None
    # A dynamic recipe's: where its activation scales come from (none is calibrated).
    calibration: str | None = None
    # WEIGHT_RECORDS' entries this run made, each at the top level under its name.
    weight_records: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The per-layer recipe table's entries, each with the layers it took (pattern, recipe,
    # layers, module_paths); None when the whole model is at its recipe.
    layer_recipes: list[dict[str, Any]] | None = None
    accuracy: dict[str, Any] = field(default_factory=dict)

    @property
    def vs_fp32(self) -> Comparison | None:
        return Comparison.of(self.accuracy.get("vs_fp32"))

    @property
    def worst_layers(self) -> list[dict[str, Any]]:
        return list(self.accuracy.get("worst_layers") or [])

    def to_metrics(self) -> dict[str, Any]:
        metrics = _to_metrics(self, skip=("weight_records", "accuracy"))
        return {**metrics, **self.weight_records, "accuracy": self.accuracy}

    @classmethod
    def of(cls, manifest: Manifest | None) -> QuantizeReport:
        if manifest is None:
            return cls()
        m = manifest.metrics
        return _of(cls, m, accuracy=_dict(m.get("accuracy")), weight_records={
            name: m[name] for name in WEIGHT_RECORDS if isinstance(m.get(name), dict)
        })


@dataclass(frozen=True)
class CompileReport:
    """The lowered program: its target record, size, how much of it the backend took, each
    delegate's payload per method in call order (for QNN each HTP context, several per method
    with --num-shards), the shard plan beside its measure, and the context cache's record."""

    model: str | None = None
    target: dict[str, Any] | None = None
    pte_bytes: int | None = None
    delegated_ops: int | None = None
    non_delegated_ops: int | None = None
    partitions: int | None = None
    non_delegated_op_counts: dict[str, int] | None = None
    delegate_bytes: dict[str, list[int]] | None = None
    shards: dict[str, Any] | None = None
    contexts: list[dict[str, Any]] | None = None

    def to_metrics(self) -> dict[str, Any]:
        return _to_metrics(self)

    @classmethod
    def of(cls, manifest: Manifest | None) -> CompileReport:
        return cls() if manifest is None else _of(cls, manifest.metrics)


@dataclass(frozen=True)
class GateVerdict:
    """The infer gates' verdict (`metrics.accuracy_gates`): `ok` True when every gate with a
    reference passed, False when one failed, None when nothing was judged; the gates in force
    and each failure (field, comparison, metric, value, gate)."""

    ok: bool | None = None
    recipe: str | None = None
    gates: dict[str, Any] | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, record: Any) -> GateVerdict:
        r = _dict(record)
        return cls(r.get("ok"), r.get("recipe"), r.get("gates"), list(r.get("failures") or []))


@dataclass(frozen=True)
class InferReport:
    """A run of the program: who ran it, latency, accuracy against the references, the gates'
    verdict, for a causal LM its generation, and with --profile the top of its op profile.
    `delegates`: set for a bare .pte, whose recipe nothing recorded (the backends its delegates
    are for). `accuracy` holds `vs_fp32` / `vs_fake_quant` comparisons and, for a causal LM,
    perplexities and `next_token` (`qnn_common.numerics.lm_metrics`: KL divergence, same top
    token, perplexity intervals, eager fp32 against the fake-quantized model and the program)."""

    model: str | None = None
    delegates: list[str] | None = None
    runner: str | None = None
    threads: int | None = None
    runtime: dict[str, Any] | None = None
    samples: int | None = None
    latency_ms: Mapping[str, float] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)
    accuracy_gates: GateVerdict = field(default_factory=GateVerdict)
    generation: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    # Read off the manifest's inputs, not a metric: run from a bare .pte.
    bare_pte: bool = False

    @property
    def verdict(self) -> GateVerdict:
        return self.accuracy_gates

    @property
    def vs_fp32(self) -> Comparison | None:
        return Comparison.of(self.accuracy.get("vs_fp32"))

    @property
    def vs_fake_quant(self) -> Comparison | None:
        return Comparison.of(self.accuracy.get("vs_fake_quant"))

    @property
    def perplexity(self) -> dict[str, Any] | None:
        value = self.accuracy.get("perplexity")
        return value if isinstance(value, dict) else None

    @property
    def next_token(self) -> dict[str, Any] | None:
        value = self.accuracy.get("next_token")
        return value if isinstance(value, dict) else None

    def to_metrics(self) -> dict[str, Any]:
        metrics = _to_metrics(self, skip=("bare_pte",))
        return {**metrics, "accuracy_gates": self.accuracy_gates.to_json()}

    @classmethod
    def of(cls, manifest: Manifest | None) -> InferReport:
        if manifest is None:
            return cls()
        m = manifest.metrics
        generation = m.get("generation")
        return _of(
            cls, m, latency_ms=_dict(m.get("latency_ms")), accuracy=_dict(m.get("accuracy")),
            accuracy_gates=GateVerdict.of(m.get("accuracy_gates")),
            generation=generation if isinstance(generation, dict) else None,
            bare_pte="pte" in manifest.inputs,
        )
