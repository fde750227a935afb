"""The sensitivity bench on a real quantize artifact: tiny-llama, 16a8w for the HTP (quantize
needs no SDK), its fake-quant model with each class of activation rounding left out."""

from __future__ import annotations

from pathlib import Path

from qdq_sensitivity import sensitivity
from tables import qdq_sensitivity

from qnn_common.config import Stage
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline


def test_each_class_of_rounding_left_out_in_turn(tmp_path: Path) -> None:
    ctx = PipelineContext.create(
        "tiny-llama", backend="qnn", soc="SM8650", recipe="16a8w", out_dir=tmp_path,
        stop_after=Stage.QUANTIZE,
        prepare={"kv_cache": True, "max_seq_len": 64, "prefill_len": 16,
                 "calibration_samples": 2, "eval_samples": 1},
    )
    summary = run_pipeline(ctx).checked().summary
    quantized = next(Path(s["artifact"]) for s in summary["stages"] if s["name"] == "quantize")

    rows = sensitivity(quantized, draws=1, groups=None)
    by_name = {r["float"]: r for r in rows}
    assert {"none", "none, jitter 1", "all activations", "add", "linear", "rms_norm",
            "input cache"} <= set(by_name)
    assert all(r["program"] == "first token computed" for r in rows)  # a byte tokenizer: no BOS
    none, floats = by_name["none"], by_name["all activations"]
    assert none["ops"] == 0 and floats["ops"] == sum(
        r["ops"] for r in rows if r["float"] not in {"none", "all activations"}
        and not r["float"].startswith("none,"))
    # Without activation rounding only the 8-bit weights differ from fp32: closer than the
    # fake-quant model with it.
    assert floats["sqnr_db"] > none["sqnr_db"]
    assert "| first token computed (fp32 " in qdq_sensitivity({"rows": rows})
