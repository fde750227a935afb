"""The built-in tiny decoders ship trained weights that load and predict the shipped text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from qnn_common.errors import ConfigValidationError
from qnn_prepare.causal_lm.tiny_decoders import (
    TINY_DECODERS,
    VOCAB,
    byte_tokenizer,
    next_byte_loss,
    save_tiny_decoder,
    text_bytes,
)


@pytest.mark.parametrize("name", sorted(TINY_DECODERS))
def test_shipped_weights_predict_the_text_far_better_than_chance(name: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    data = torch.tensor(list(text_bytes()), dtype=torch.int64)
    trained = AutoModelForCausalLM.from_pretrained(
        str(save_tiny_decoder(name, tmp_path / "trained")), local_files_only=True
    ).eval()
    random = AutoModelForCausalLM.from_pretrained(
        str(save_tiny_decoder(name, tmp_path / "random", trained=False)), local_files_only=True
    ).eval()
    uniform = math.log(VOCAB)
    # A random decoder is about as good as a uniform guess; the shipped one has learned the text
    # (measured: ~5.6 vs ~1.0 nats).
    assert next_byte_loss(random, data) > uniform - 0.3
    assert next_byte_loss(trained, data) < 2.0
    # The directory is a complete HF checkpoint: config, weights, tokenizer.
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "trained").iterdir()
    }


def test_byte_tokenizer_round_trips_text() -> None:
    tokenizer = byte_tokenizer()
    text = "Alice was beginning to get very tired — ünïcode too."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_unknown_decoder_names_the_built_ins(tmp_path: Path) -> None:
    with pytest.raises(ConfigValidationError, match="tiny-llama"):
        save_tiny_decoder("tiny-gpt", tmp_path)
