"""The causal LM's checks of a run, asked by the orchestrator through `families.preflight`:
each refusal before any stage runs, with the message the orchestrator used to raise itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError
from qnn_pipeline import orchestrator
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.families import FAMILIES, preflight
from qnn_pipeline.orchestrator import run_pipeline

SHAPES = {"max_seq_len": 48, "prefill_len": 8}


def _generating(prompt: str, *, kv_cache: bool = True) -> PipelineContext:
    return PipelineContext.create(
        "tiny-llama", recipe="fp32", prepare={"kv_cache": kv_cache, **(SHAPES if kv_cache else {})},
        infer={"generation": {"prompt": prompt}},
    )


def test_a_prompt_without_a_kv_cache_is_refused() -> None:
    with pytest.raises(ConfigValidationError, match="generation needs a causal LM exported with "
                       "a KV cache, and prepare.kv_cache is off"):
        preflight(_generating("Hi", kv_cache=False), Stage.PREPARE)


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    with pytest.raises(ConfigValidationError, match="context of 48 tokens"):
        preflight(_generating("x" * 60), Stage.PREPARE)
    preflight(_generating("Hi"), Stage.PREPARE)  # one that fits passes


def test_sharding_without_a_kv_cache_is_refused() -> None:
    ctx = PipelineContext.create("tiny-llama", backend="qnn", soc="SM8650", recipe="16a8w",
                                 compile={"num_shards": 2})
    with pytest.raises(ConfigValidationError, match="sharding splits a causal LM's decoder "
                       "layers, exported with its KV cache"):
        preflight(ctx, Stage.PREPARE)


def test_a_resumed_run_is_not_checked() -> None:
    """From --from, the export exists: the stages downstream check what it holds."""
    preflight(_generating("x" * 60, kv_cache=False), Stage.QUANTIZE)


def test_the_orchestrator_asks_the_families_before_any_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Stage] = []

    class Recording:
        def preflight(self, ctx: PipelineContext, first: Stage) -> None:
            asked.append(first)
            raise ConfigValidationError("x", 1, "refused by the family")

    monkeypatch.setitem(FAMILIES, "causal-lm", Recording())
    monkeypatch.setattr(orchestrator, "_RUNNERS", {})  # a stage run would be a KeyError
    ctx = PipelineContext.create("tiny-cnn", out_dir=tmp_path / "out")
    with pytest.raises(ConfigValidationError, match="refused by the family"):
        run_pipeline(ctx)
    assert asked == [Stage.PREPARE]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
