"""`--profile` (issue 54): a tiny model's runs read from their ETDump by ExecuTorch's Inspector
into a per-op table beside the run, sealed with it, on a delegate (XNNPACK) and without one
(portable: every op outside a delegate). A causal LM's table per method: tests/llm/llm_test.py
(its fp32 pipeline run is profiled)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from qnn_common.sealing import load_manifest
from qnn_infer import cli as infer_cli
from qnn_infer.profile import PROFILE_JSON, PROFILE_MD
from support.pipeline_runs import child_env, pipeline_command


def _profiled(out: Path, *extra: str) -> tuple[Path, dict[str, Any]]:
    run = subprocess.run(pipeline_command(out, "--profile", "--runs", "4", *extra),
                         env=child_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    (infer,) = out.glob("infer-*")
    return infer, json.loads((infer / PROFILE_JSON).read_text())


def test_xnnpack_kernels_are_timed_inside_their_delegate(tmp_path: Path) -> None:
    infer, profile = _profiled(tmp_path)
    manifest = load_manifest(infer)  # every file sealed: the profile is part of the artifact
    assert {PROFILE_MD, PROFILE_JSON, "etdump.etdp"} <= {f.path for f in manifest.files}
    ops = profile["ops"]
    assert isinstance(ops, list) and ops
    assert profile["runs"] >= 4 + 3  # the timed runs and the warmup, each traced
    assert all(op["delegated"] for op in ops)  # tiny-cnn at 8a8w: XNNPACK takes it whole
    assert any("Convolution" in op["name"] for op in ops)
    assert 0 < sum(op["share"] for op in ops) <= 1.0001
    assert float(profile["execute_ms"]) > 0
    assert manifest.metrics["profile"]["top"][0] == ops[0]["name"]
    table = (infer / PROFILE_MD).read_text()
    assert "| op / kernel |" in table and ops[0]["name"] in table


def test_portable_ops_are_all_outside_a_delegate(tmp_path: Path) -> None:
    _, profile = _profiled(tmp_path, "--backend", "portable", "--skip", "quantize")
    ops = profile["ops"]
    assert isinstance(ops, list) and ops
    assert not any(op["delegated"] for op in ops)
    assert any("convolution" in op["name"] for op in ops)
    assert float(profile["outside_delegates_ms"]) > 0


def test_profile_is_refused_for_a_device_run() -> None:
    run = subprocess.run([sys.executable, "-m", infer_cli.__name__, "missing.pte", "--profile",
                          "--device", "auto"], env=child_env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert "infer.profile" in run.stderr and "drop --etdump / --profile, or --device" in run.stderr
