"""`qnn-pipeline sweep` for real, on a local Ray: 2 models x 2 recipes x 2 targets.

Real stages in Ray workers (export, PT2E quantization, lowering, the ExecuTorch runtime), checked
through the sweep's own tables: each shared prefix ran once (one prepare per model, one quantize
per model and quantizer target), a cell that fails does not stop the others, and a rerun (on Ray,
then in process with --jobs 1) finds every node cached.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from qnn_pipeline.cli import main as pipeline_main

MODELS = "tiny-cnn,sweep.sweep_factories:mlp"
MATRIX = ["--backend", "xnnpack,portable", "--recipe", "fp32,8a8w", "--runs", "3",
          "--calibration-samples", "4", "--threads", "1", "--no-progress"]


def _sweep(out: Path, *extra: str, models: str = MODELS) -> tuple[int, dict[str, Any], float]:
    start = time.monotonic()
    code = pipeline_main(["sweep", "--model", models, *MATRIX, "--out", str(out),
                          "--artifacts", str(out.parent / "artifacts"), *extra])
    seconds = time.monotonic() - start
    print(f"sweep {out.name}: exit {code} in {seconds:.1f} s")
    return code, json.loads((out / "sweep.json").read_text()), seconds


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """The 8 good cells plus 4 of a model whose factory fails, on a local Ray of 2 CPUs."""
    root = tmp_path_factory.mktemp("sweep")
    code, doc, _ = _sweep(root / "first", "--jobs", "2",
                          models=MODELS + ",sweep.sweep_factories:broken")
    return code, doc, root


def test_every_good_cell_completes_with_its_numbers(
    first: tuple[int, dict[str, Any], Path],
) -> None:
    code, doc, root = first
    good = [c for c in doc["cells"] if not c["model"].endswith(":broken")]
    assert len(good) == 8
    assert {(c["model"], c["target"], c["recipe"]) for c in good} == {
        (m, t, r) for m in MODELS.split(",") for t in ("xnnpack", "portable")
        for r in ("fp32", "8a8w")
    }
    for c in good:
        assert c["status"] == "ok", c
        assert c["accuracy_ok"] is True, c
        assert c["pte_bytes"] > 0 and c["latency_ms_p50"] > 0
        assert c["sqnr_db_vs_fp32"] > (60 if c["recipe"] == "fp32" else 10), c
    md = (root / "first" / "sweep.md").read_text()
    assert "| tiny-cnn | portable | 8a8w | ok |" in md


def test_shared_prefixes_ran_once(first: tuple[int, dict[str, Any], Path]) -> None:
    _, doc, _ = first
    nodes = doc["nodes"]
    # 2 good models prepared once each (the broken one failed); one quantize per (model, target)
    # for 8a8w; compile and infer per cell.
    assert nodes["prepare"] == {"ran": 2, "cached": 0, "failed": 1, "not run": 0}
    assert nodes["quantize"] == {"ran": 4, "cached": 0, "failed": 0, "not run": 2}
    assert nodes["compile"] == {"ran": 8, "cached": 0, "failed": 0, "not run": 4}
    assert nodes["infer"] == {"ran": 8, "cached": 0, "failed": 0, "not run": 4}
    artifacts = first[2] / "artifacts"
    assert len(list(artifacts.glob("prepare-*"))) == 2
    assert len(list(artifacts.glob("quantize-*"))) == 4
    assert len(list(artifacts.glob("compile-*"))) == 8
    assert not (artifacts / "summary.json").exists()


def test_a_failing_cell_does_not_stop_the_others(first: tuple[int, dict[str, Any], Path]) -> None:
    code, doc, root = first
    assert code == 2  # some cell failed
    bad = [c for c in doc["cells"] if c["model"].endswith(":broken")]
    assert len(bad) == 4
    for c in bad:
        assert (c["status"], c["failed_stage"]) == ("failed", "prepare")
        assert "broken on purpose" in c["error"]
    md = (root / "first" / "sweep.md").read_text()
    assert "sweep.sweep_factories:broken / xnnpack / fp32: failed at prepare:" in md


def test_a_rerun_is_all_cached(first: tuple[int, dict[str, Any], Path]) -> None:
    root = first[2]
    for name, extra in (("again-ray", ("--jobs", "2")), ("again-inprocess", ("--jobs", "1"))):
        code, doc, seconds = _sweep(root / name, *extra)
        assert code == 0
        assert all(c["status"] == "ok" for c in doc["cells"]) and len(doc["cells"]) == 8
        ran = {stage: n["ran"] for stage, n in doc["nodes"].items()}
        assert ran == {"prepare": 0, "quantize": 0, "compile": 0, "infer": 0}, doc["nodes"]
        assert [n["cached"] for n in doc["nodes"].values()] == [2, 4, 8, 8]
        assert all(c["stages"] and set(c["stages"].values()) == {"cached"} for c in doc["cells"])
