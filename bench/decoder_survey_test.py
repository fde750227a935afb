"""decoder_survey: a tiny checkpoint of an architecture through the default pipeline, for real,
and the table its rows render to."""

from __future__ import annotations

from pathlib import Path

import torch
from decoder_survey import ARCHITECTURES, survey_one, write_checkpoint
from tables import render, survey_count

from support.schedule import scheduled


def test_every_architecture_is_a_config_transformers_builds(tmp_path: Path) -> None:
    from transformers import AutoConfig

    for model_type in ARCHITECTURES:
        assert AutoConfig.for_model(model_type).model_type == model_type


@scheduled("a decoder through the whole default pipeline; tests/llm/default_attention_test.py "
           "runs decoders with every setting at its default on every push")
def test_one_architecture_through_the_default_pipeline(tmp_path: Path) -> None:
    row = survey_one("qwen2", tmp_path, {"backend": "xnnpack"})
    assert row["status"] == "generates", row
    assert row["custom_ops"] is True  # plain causal attention: ExecuTorch's custom ops
    assert row["new_tokens"] == 8 and 0 <= row["kl_mean"] < 0.25
    assert render({"bench": "decoder_survey", "settings": {"backend": "xnnpack"},
                   "rows": [row]}).splitlines()[2].startswith("| qwen2 | yes | generates | ")


def test_rows_render_to_the_table_and_its_count() -> None:
    row = {"architecture": "qwen2", "status": "generates", "custom_ops": True, "new_tokens": 8,
           "kl_mean": 0.012, "same_top_percent": 96.9, "seconds": 12.5, "reason": ""}
    refused = {"architecture": "x", "status": "refused", "reason": "a | b", "custom_ops": None}
    result = {"bench": "decoder_survey", "settings": {"backend": "xnnpack"},
              "rows": [row, refused]}
    lines = render(result).splitlines()
    assert survey_count(result) == (
        "1 of 2 generate with every setting at its default (backend xnnpack).")
    assert lines[2].startswith("| qwen2 | yes | generates | ")
    assert lines[3] == "| x | - | refused | - | - (-) | a / b |"


def test_a_checkpoint_is_seeded(tmp_path: Path) -> None:
    # A dependency of transformers (its weight format), hence in every resolve that has it.
    from safetensors.torch import load_file  # pants: no-infer-dep

    first = load_file(write_checkpoint("llama", tmp_path / "a") / "model.safetensors")
    second = load_file(write_checkpoint("llama", tmp_path / "b") / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
