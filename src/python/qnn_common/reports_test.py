"""The stage reports: what a stage seals (`to_metrics`) reads back as the same report (`of`), a
field's name is its key, and a figure a stage did not record is absent, not null."""

from __future__ import annotations

import json
from typing import Any

from qnn_common.manifest import Manifest
from qnn_common.reports import (
    WEIGHT_RECORDS,
    Comparison,
    CompileReport,
    GateVerdict,
    InferReport,
    QuantizeReport,
)


def _sealed(metrics: dict[str, Any], inputs: dict[str, str] | None = None) -> Manifest:
    # Through JSON, as a manifest is stored and read.
    return Manifest(stage="s", package="p", package_version="0", config={},
                    inputs=inputs or {}, files=(), tools={}, cache_key="k",
                    metrics=json.loads(json.dumps(metrics)))


def test_a_compile_report_reads_back_as_written_and_leaves_out_what_it_lacks() -> None:
    report = CompileReport(model="m", target={"backend": "qnn"}, pte_bytes=10, delegated_ops=3,
                           non_delegated_ops=1, partitions=1,
                           non_delegated_op_counts={"aten.mean.dim": 1},
                           delegate_bytes={"forward": [7]})
    metrics = report.to_metrics()
    assert "shards" not in metrics and "contexts" not in metrics
    assert CompileReport.of(_sealed(metrics)) == report
    assert CompileReport.of(None) == CompileReport()


def test_a_quantize_report_puts_its_weight_records_under_their_names() -> None:
    accuracy = {"vs_fp32": {"sqnr_db": 20.0, "cosine": 0.99}, "worst_layers": [{"name": "l"}]}
    report = QuantizeReport(model="m", quantized_ops=4, quantized_op_kinds={"linear": 4},
                            dynamic_ops=4, weight_rounding="nearest", calibration="none",
                            weight_records={"8da4w": {"group_size": 32}}, accuracy=accuracy)
    metrics = report.to_metrics()
    assert metrics["8da4w"] == {"group_size": 32} and "layer_recipes" not in metrics
    read = QuantizeReport.of(_sealed(metrics))
    assert read == report
    assert read.vs_fp32 == Comparison(20.0, 0.99) and read.worst_layers == [{"name": "l"}]
    assert "8da4w" in WEIGHT_RECORDS and "gptq" in WEIGHT_RECORDS and "8a8w" not in WEIGHT_RECORDS


def test_an_infer_report_carries_the_gate_verdict_as_a_field() -> None:
    verdict = GateVerdict(ok=False, recipe="8a8w", gates={"min_cosine_vs_fp32": 0.99},
                          failures=[{"field": "min_cosine_vs_fp32", "value": 0.5, "gate": 0.99}])
    report = InferReport(model="m", runner="host", threads=2, samples=3,
                         latency_ms={"p50": 1.0, "p90": 2.0},
                         accuracy={"vs_fp32": {"cosine": 0.5}, "perplexity": {"fp32": 3.0}},
                         accuracy_gates=verdict)
    metrics = report.to_metrics()
    assert metrics["accuracy_gates"] == {
        "ok": False, "recipe": "8a8w", "gates": {"min_cosine_vs_fp32": 0.99},
        "failures": [{"field": "min_cosine_vs_fp32", "value": 0.5, "gate": 0.99}],
    }
    assert not {"delegates", "runtime", "generation", "profile", "bare_pte"} & set(metrics)
    read = InferReport.of(_sealed(metrics))
    assert read == report and read.verdict == verdict
    assert read.vs_fp32 == Comparison(cosine=0.5) and read.vs_fake_quant is None
    assert read.perplexity == {"fp32": 3.0} and read.next_token is None
    # A run from a bare .pte is told by the manifest's inputs, not by a metric.
    assert InferReport.of(_sealed(metrics, {"pte": "sha"})).bare_pte


def test_nothing_judged_and_nothing_recorded_read_as_none() -> None:
    run = InferReport.of(_sealed({"accuracy_gates": "garbage", "accuracy": None}))
    assert run.verdict == GateVerdict() and run.verdict.ok is None
    assert run.accuracy == {} and run.latency_ms == {}
    assert QuantizeReport.of(_sealed({"gptq": "not a record"})).weight_records == {}
