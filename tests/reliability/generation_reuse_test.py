"""Issue 49, item 9: tiny-llama's generation infer was never reused, and every rerun warned that
the artifact "cannot vouch for" being the stage's output.

`generation.stream` (print tokens as they come) is left out of infer's cache key, but the manifest
recorded it, so the key recomputed from the manifest's config never matched the recorded one: the
pipeline refused its own artifact and ran infer again. The manifest now records the config as the
key hashes it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import qnn_infer
from qnn_common.config import InferConfig, Stage
from qnn_common.llm_spec import GenerationConfig
from qnn_common.sealing import load_manifest, seal_stage


def _seal(out: Path, config: InferConfig) -> str:
    out.mkdir()
    (out / "report.txt").write_text("generated\n")
    manifest = seal_stage(out, stage=Stage.INFER, package="qnn-infer", module=qnn_infer,
                          config=config, inputs={"compile": "0" * 64}, files=["report.txt"],
                          timings={}, metrics={})
    return manifest.cache_key


@pytest.mark.parametrize("stream", [True, False])
def test_a_generation_infer_artifact_vouches_for_its_own_key(tmp_path: Path, stream: bool) -> None:
    config = InferConfig(runs=1, generation=GenerationConfig(prompt="Once upon a time",
                                                             max_new_tokens=8, stream=stream))
    key = _seal(tmp_path / "infer", config)
    # What the orchestrator does before reusing it: this raised "cannot vouch for" with stream on.
    manifest = load_manifest(tmp_path / "infer", expect_stage=Stage.INFER, expect_cache_key=key)
    assert manifest.cache_key == key


def test_streaming_or_not_is_the_same_artifact(tmp_path: Path) -> None:
    shown = InferConfig(runs=1, generation=GenerationConfig(stream=True))
    quiet = dataclasses.replace(shown, generation=GenerationConfig(stream=False))
    assert _seal(tmp_path / "a", shown) == _seal(tmp_path / "b", quiet)
