"""A sharded HTP compile resumes where it was killed, and rebuilds only the contexts whose layers
changed (qnn_compile.context_cache): real compiles of a 4-layer decoder at 3 shards, SM8650."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from qnn_common.artifact import Artifact
from qnn_common.cli.child_env import python_child_env
from qnn_common.config import CompileConfig, Stage
from qnn_common.recipes import Backend, Recipe
from qnn_common.sealing import load_manifest
from qnn_common.stages import CONTEXT_CACHE_DIR, PTE, CompileInput
from qnn_compile import cli as compile_cli  # run as a child, which is killed
from qnn_compile.api import run_compile
from qnn_infer.families.causal_lm import program_logits
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from qnn_prepare.causal_lm.tiny_decoders import EOS_ID, VOCAB, byte_tokenizer

LAYERS, SHARDS = 4, 3  # shards of 1, 2 and 1 layers
CONTEXTS = 2 * SHARDS  # prefill's and decode's graphs of a shard in a context each
CONFIG = CompileConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.FP16, num_shards=SHARDS)


def _decoder(directory: Path, last_layer_seed: int | None = None) -> Path:
    """A random 4-layer Llama with the byte tokenizer; with `last_layer_seed`, the same model
    but for its last layer's MLP."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        eos_token_id=EOS_ID, pad_token_id=EOS_ID,
    ))
    if last_layer_seed is not None:
        torch.manual_seed(last_layer_seed)
        with torch.no_grad():
            for p in model.model.layers[-1].mlp.parameters():
                p.normal_(0, 0.02)
    model.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory


def _prepared(model: Path, out: Path) -> Path:
    ctx = PipelineContext.create(
        str(model), backend="qnn", soc="SM8650", recipe="fp16", out_dir=out,
        stop_after=Stage.PREPARE,
        prepare={"kv_cache": True, "max_seq_len": 32, "prefill_len": 8, "eval_samples": 1},
    )
    stages = run_pipeline(ctx).checked().summary["stages"]
    return next(Path(s["artifact"]) for s in stages if s["name"] == "prepare")


def _contexts(compiled: Path) -> list[dict[str, object]]:
    contexts: list[dict[str, object]] = load_manifest(
        compiled, expect_stage=Stage.COMPILE).metrics["contexts"]
    return contexts


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ctx-cache")
    return _prepared(_decoder(root / "model"), root / "run")


@pytest.fixture(scope="module")
def resumed(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """A compile killed (kill -9) once its first context is built, then run again: (its context
    cache, its output, the contexts the killed run had stored)."""
    root = tmp_path_factory.mktemp("resumed")
    cache, out = root / "contexts", root / "compiled"
    child = subprocess.Popen(
        [sys.executable, "-m", compile_cli.__name__, str(prepared), "-o", str(out),
         "--backend", "qnn", "--soc", "SM8650", "--recipe", "fp16",
         "--num-shards", str(SHARDS), "--context-cache", str(cache)],
        env=python_child_env(), stderr=subprocess.PIPE, text=True,
    )
    assert child.stderr is not None
    said = []
    for line in child.stderr:
        said.append(line)
        if f"built HTP context 1/{CONTEXTS}" in line:
            os.kill(child.pid, signal.SIGKILL)
            break
    child.wait()
    assert child.returncode == -signal.SIGKILL, "".join(said[-20:])
    stored = len(list(cache.glob("*.ctx")))
    assert not (out / PTE).exists()  # nothing sealed that a later run could trust
    run_compile(CompileInput(Artifact.open(prepared), CONFIG, out, context_cache=cache))
    return cache, out, stored


def test_a_compile_killed_after_its_first_context_resumes_there(
    prepared: Path, resumed: tuple[Path, Path, int], tmp_path: Path
) -> None:
    """kill -9 once the first context is built: the rerun reuses what was stored and builds the
    rest, and its program computes what a compile never interrupted does."""
    cache, out, stored = resumed
    assert 1 <= stored < CONTEXTS
    reused = [c["reused"] for c in _contexts(out)]
    assert reused == [True] * stored + [False] * (CONTEXTS - stored)
    shards = load_manifest(out, expect_stage=Stage.COMPILE).metrics["shards"]["shards"]
    assert [s["reused"] for s in shards] == [all(reused[2 * i:2 * i + 2]) for i in range(SHARDS)]
    assert all(s["build_s"] > 0 for s in shards if not s["reused"])

    entries = {p.stem: p.read_bytes() for p in cache.glob("*.ctx")}
    assert {c["key"] for c in _contexts(out)} == set(entries)  # every context now stored

    whole = run_compile(CompileInput(Artifact.open(prepared), CONFIG, tmp_path / "whole"))
    assert "contexts" not in whole.sealed.metrics  # no cache: nothing recorded
    for a, b in zip(program_logits(out), program_logits(whole.path), strict=True):
        assert torch.equal(a, b)


def test_a_model_changed_in_its_last_layer_rebuilds_only_the_last_shard(
    resumed: tuple[Path, Path, int], tmp_path: Path
) -> None:
    # The resumed compile above stored every context of the model: a model changed in its last
    # layer's MLP reuses the first two shards' (prefill's and decode's: 4) and builds the last.
    cache, out, _ = resumed
    changed = _prepared(_decoder(tmp_path / "model-b", last_layer_seed=7), tmp_path / "run-b")
    second = run_compile(
        CompileInput(Artifact.open(changed), CONFIG, tmp_path / "b", context_cache=cache))
    assert [c["reused"] for c in _contexts(second.path)] == [True] * 4 + [False] * 2
    first_keys = [c["key"] for c in _contexts(out)]
    assert [c["key"] for c in _contexts(second.path)][:4] == first_keys[:4]


def test_the_pipeline_keeps_its_contexts_under_its_output_directory(tmp_path: Path) -> None:
    model = _decoder(tmp_path / "model")
    ctx = PipelineContext.create(
        str(model), backend="qnn", soc="SM8650", recipe="fp16", out_dir=tmp_path / "run",
        stop_after=Stage.COMPILE, compile={"num_shards": 2},
        prepare={"kv_cache": True, "max_seq_len": 32, "prefill_len": 8, "eval_samples": 1},
    )
    run_pipeline(ctx).checked()
    assert len(list((tmp_path / "run" / CONTEXT_CACHE_DIR).glob("*.ctx"))) == 4
    forced = run_pipeline(dataclasses.replace(ctx, force=True)).checked().summary
    compiled = next(Path(s["artifact"]) for s in forced["stages"] if s["name"] == "compile")
    assert [c["reused"] for c in _contexts(compiled)] == [True] * 4
