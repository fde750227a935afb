"""`qnn-pipeline tune` for real (issue 53): on a tiny decoder with one layer made sensitive to
its weights' rounding on purpose, the search promotes that layer and no other, verified by
quantizing and scoring; a search killed midway resumes from what it had; the winner's TOML
rebuilds the winner's program byte for byte."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from qnn_common.config import Stage
from qnn_common.recipes import Recipe
from qnn_common.sealing import load_manifest
from qnn_common.stages import program_files
from qnn_common.store.hashing import sha256_file
from qnn_common.torchio.programs import load_methods
from qnn_pipeline import cli
from qnn_pipeline.context import load_pipeline_toml
from qnn_pipeline.orchestrator import run_pipeline
from qnn_pipeline.tune.run import TuneRequest, tune
from qnn_pipeline.tune.search import Budget, Search
from support.pipeline_runs import child_env
from support.quantized_weights import weight_grids
from support.schedule import scheduled
from support.tiny_llama import SENSITIVE_LAYER, save_sensitive_llama

SENSITIVE = f"hf.model.{SENSITIVE_LAYER}"
# Budgets between the cheap model's KL divergence and that with the sensitive layer promoted
# (each backend's tiny-model figures, measured: docs/tune.md).
HTP_BUDGET = 0.01
CPU_BUDGET = 0.0055


@pytest.fixture(scope="module")
def sensitive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_sensitive_llama(tmp_path_factory.mktemp("sensitive"))


def _sections(model: Path, backend: str, recipe: str, soc: str | None = None) -> dict[str, dict[
        str, object]]:
    return {"pipeline": {"model": str(model), "backend": backend, "recipe": recipe,
                         **({} if soc is None else {"soc": soc})}}


@scheduled("a search on the HTP's recipes, a minute; the CPU search below runs the same "
           "search on every push")
def test_the_one_layer_made_sensitive_is_promoted_and_no_other(
    sensitive: Path, tmp_path: Path,
) -> None:
    found = tune(TuneRequest(_sections(sensitive, "qnn", "16a4w", "SM8650"), tmp_path,
                             Budget(max_kl=HTP_BUDGET), compile_winner=False))
    assert found.plan.rich is Recipe.A16W8  # the next recipe up that mixes into 16a4w
    assert found.plan.order[0].group.name == SENSITIVE_LAYER
    assert found.winner is not None and found.winner.promoted == 1
    (entry,) = found.winner.table
    assert entry.recipe is Recipe.A16W8
    layers = [p for g in found.plan.order for p in g.group.paths]
    assert [p for p in layers if re.search(entry.pattern, p)] == [
        f"{SENSITIVE}.{name}" for name in ("gate_proj", "up_proj", "down_proj")]
    # Verified, not predicted: nothing promoted misses the budget, the winner meets it.
    assert found.verified[0].score.kl > HTP_BUDGET >= found.winner.score.kl

    # The winner's quantized program: that block's linears at 8 bits per channel, every other
    # at 4.
    artifact = found.winner.artifact
    assert artifact is not None
    files = program_files(artifact, load_manifest(artifact))
    grids = weight_grids(load_methods({m: artifact / f for m, f in files.items()})["prefill"])
    for path, (kind, quant_max) in grids.items():
        if path.startswith(SENSITIVE):
            assert (kind, quant_max) == ("per channel", 127), path
        else:
            assert (kind, quant_max) == ("per channel", 7), path

    assert _checked_report(tmp_path / "tune", found, Recipe.A16W4)["winner"] == 1


def _checked_report(report: Path, found: Search, recipe: Recipe) -> dict[str, Any]:
    """The search's report: the front as JSON, a table and a plot, and the winner as a TOML
    recipe whose layer table is the winner's; the front's JSON, for more checks."""
    assert found.winner is not None
    front: dict[str, Any] = json.loads((report / "front.json").read_text())
    winner = front["winner"]
    assert winner in front["front"] and f"| {winner} |" in (report / "front.md").read_text()
    assert (report / "front.svg").read_text().startswith("<svg")
    rebuilt = load_pipeline_toml(report / "recipe.toml")
    assert rebuilt.quantize is not None
    assert rebuilt.quantize.layer_recipes == found.winner.table
    assert rebuilt.recipe is recipe
    return front


def _wait_for(path: Path, child: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not any(path.glob("*.json")):
        assert child.poll() is None, "the search ended before scoring a candidate"
        assert time.monotonic() < deadline, f"no score under {path} in {seconds} s"
        time.sleep(0.2)


class _Recorded(logging.Handler):
    """Every log message, as text."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def resumed(
    sensitive: Path, tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, tuple[bytes, int]], Search, list[str]]:
    """A CPU search killed (SIGKILL) once it had scored its first candidate, then run again to
    the end in this process: (its OUT, the scores the killed run left, the search, the rerun's
    log)."""
    out = tmp_path_factory.mktemp("tune-cpu")
    argv = [sys.executable, "-m", cli.__name__, "tune", "--model", str(sensitive),
            "--max-kl", str(CPU_BUDGET), "--out", str(out), "-q"]
    child = subprocess.Popen(argv, env=child_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        _wait_for(out / "tune" / "scores", child, 600)
    finally:
        child.kill()
        child.wait()
    left = {p.name: (p.read_bytes(), p.stat().st_mtime_ns)
            for p in (out / "tune" / "scores").glob("*.json")}
    handler = _Recorded()
    records = handler.messages
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        found = tune(TuneRequest(_sections(sensitive, "xnnpack", "8a8w"), out,
                                 Budget(max_kl=CPU_BUDGET)))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return out, left, found, records


def test_a_killed_search_resumes_from_what_it_had(
    resumed: tuple[Path, dict[str, tuple[bytes, int]], Search, list[str]],
) -> None:
    out, left, found, records = resumed
    assert left, "the killed run had scored a candidate"
    for name, (data, mtime) in left.items():
        path = out / "tune" / "scores" / name
        assert (path.read_bytes(), path.stat().st_mtime_ns) == (data, mtime), name
        assert any(str(path) in r and "earlier run" in r for r in records), name
    assert not any("groups scored" in r for r in records)  # the pass read back, not run again
    # Its quantize artifacts were the pipeline's cache hits, not built again.
    assert sum("quantize cached" in r for r in records) >= len(left)
    assert found.winner is not None
    assert found.plan.rich is Recipe.FP32  # nothing richer mixes into XNNPACK's 8a8w
    assert [g.group.name for g in found.plan.order][:1] == [SENSITIVE_LAYER]
    assert found.winner.score.kl <= CPU_BUDGET < found.verified[0].score.kl
    _checked_report(out / "tune", found, Recipe.A8W8)


def test_the_winners_toml_rebuilds_its_program_byte_for_byte(
    resumed: tuple[Path, dict[str, tuple[bytes, int]], Search, list[str]], tmp_path: Path,
) -> None:
    out, _, found, _ = resumed
    front = json.loads((out / "tune" / "front.json").read_text())
    winner_dir = Path(front["program_dir"])
    (winner_pte,) = winner_dir.glob("*.pte")
    ctx = load_pipeline_toml(out / "tune" / "recipe.toml",
                             {"pipeline": {"out": tmp_path, "stop_after": "compile"}})
    result = run_pipeline(ctx)
    (compiled,) = (r.artifact for r in result.records
                   if r.stage is Stage.COMPILE and r.artifact is not None)
    (rebuilt,) = compiled.glob("*.pte")
    assert all(r.status == "ran" for r in result.records if r.artifact is not None)
    assert sha256_file(rebuilt) == sha256_file(winner_pte)
    assert found.winner is not None and front["program_bytes"] == winner_pte.stat().st_size
