"""Issue 49, Deliver 5: fuzzed manifest numbers and structure, read by the pipeline's cache check.

A seeded, bounded fuzzer: each case takes a real tiny-cnn run, changes one number (or the shape
around it) in one artifact's manifest.json, to a huge, negative, fractional, non-finite or
nested value or one of another type, re-seals it where JSON can hold the value (anyone can: the
digest is integrity, not a signature), and reruns the pipeline on that output directory. Every
case runs in one child process (a crash or a hang there cannot take pytest with it), bounded in
time. Each must end in exit 0 (the artifact reused or made again) or exit 2 with one `error:`
line: no traceback, no abort, no hang.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qnn_common.manifest import MANIFEST_NAME
from qnn_pipeline.cli import main as pipeline_main
from support.pipeline_runs import TINY_CNN, child_env
from support.summary import read_summary

SEED = 49
BOUND_S = 360  # every case in one child: about 5 s each, 20 on a loaded 2-core machine

HUGE = "1" + "0" * 5000  # past Python's 4,300 digits: not even json.dumps can write it
VALUES: list[Any] = [
    HUGE, f"-{HUGE}", 10**30, -1, -(2**63), 0, 0.5, -0.0, 1e308, "1e999", "NaN", True, None,
    "12", [], {}, [1, [2, [3]]], {"a": {"b": {"c": 1}}}, "[" * 300 + "]" * 300,
]
# What a rerun finds cached and reads (metrics, timings, sizes), and what makes it run again
# (infer's config: a cheap stage); the other stages' configs would make the bound minutes.
STAGES = ("prepare", "quantize", "compile", "infer")


def _leaves(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path


def _fuzzable(stage: str, path: tuple[str | int, ...]) -> bool:
    if path[0] == "config":
        return stage == "infer"
    if path[0] == "files":  # a wrong size makes the stage run again
        return stage in ("compile", "infer")
    return True


def _digest(raw: dict[str, Any]) -> str:
    """The manifest's own digest, as docs/artifacts.md defines it (qnn_common.manifest)."""
    blob = json.dumps({k: v for k, v in raw.items() if k != "digest"}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


MARK = "\u0000fuzzed\u0000"


def _mutate(manifest: Path, rng: random.Random, stage: str, value: Any) -> str:
    """Set one number of `manifest` to `value` (re-sealed); returns what was done."""
    raw = json.loads(manifest.read_text(encoding="utf-8"))
    path = rng.choice([p for p in _leaves(raw) if _fuzzable(stage, p)])
    parent = raw
    for key in path[:-1]:
        parent = parent[key]
    textual = isinstance(value, str) and value not in ("12",)
    parent[path[-1]] = MARK if textual else value
    raw["digest"] = _digest(raw)
    text = json.dumps(raw, indent=2, sort_keys=True)
    if textual:  # raw JSON text no json.dumps writes: sealed over the marker, so refused
        text = text.replace(json.dumps(MARK), value)
    manifest.write_text(text, encoding="utf-8")
    shown = value if not isinstance(value, str) or len(value) < 40 else f"{value[:12]}..."
    return f"{stage}:{'/'.join(map(str, path))} = {shown!r}"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    assert pipeline_main([*TINY_CNN, "--out", str(out), "-q"]) == 0
    return out


DRIVER = r"""
import contextlib, io, json, sys, traceback
from qnn_pipeline.cli import main
argv, outs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for out in outs:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = main([*argv, "--out", out, "-q"])
    except BaseException:  # what run_cli let through: the defect under test
        code = "raised"
        err.write(traceback.format_exc())
    print(json.dumps({"out": out, "code": code, "err": err.getvalue()[-4000:]}), flush=True)
"""


def test_fuzzed_manifest_numbers_give_a_rerun_or_one_error_line(run: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    stage_dirs = {s["name"]: Path(s["artifact"]).name for s in read_summary(run)["stages"]}
    cases: dict[str, str] = {}
    for i, value in enumerate(VALUES):  # each value once, at a seeded place
        out = tmp_path / f"case{i:02d}"
        shutil.copytree(run, out)
        stage = rng.choice(STAGES)
        cases[str(out)] = _mutate(out / stage_dirs[stage] / MANIFEST_NAME, rng, stage, value)
    child = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(list(TINY_CNN)), json.dumps(list(cases))],
        env=child_env(), capture_output=True, text=True, timeout=BOUND_S,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    results = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), child.stdout[-3000:]
    bad = []
    for result in results:
        errors = [line for line in result["err"].splitlines() if line.startswith("error:")]
        ok = (result["code"] == 0 or (result["code"] == 2 and len(errors) == 1)) and \
            "Traceback" not in result["err"]
        if not ok:
            bad.append(f"{cases[result['out']]}: exit {result['code']}: {result['err'][-600:]}")
    assert not bad, "\n\n".join(bad)
