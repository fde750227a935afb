"""Chat-formatted calibration windows: rendered with the model's own template, or none."""

from __future__ import annotations

from pathlib import Path

from qnn_prepare.causal_lm.chat_calibration import chat_sequences
from qnn_prepare.causal_lm.export import CausalLm, load_causal_lm
from qnn_prepare.causal_lm.tiny_decoders import save_tiny_decoder

_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


def _lm(tmp_path: Path, template: str | None) -> CausalLm:
    from transformers import AutoTokenizer

    directory = save_tiny_decoder("tiny-qwen", tmp_path / "hf", seed=3)
    if template is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        tokenizer.chat_template = template
        tokenizer.save_pretrained(directory)
    return load_causal_lm(str(directory), max_seq_len=64, prefill_len=16)


def test_windows_are_conversations_in_the_models_template(tmp_path: Path) -> None:
    lm = _lm(tmp_path, _TEMPLATE)
    # The tiny tokenizer is one token per byte: a window long enough to reach the answer.
    windows = chat_sequences(lm, 3, 160)
    assert len(windows) == 3 and all(w.shape == (160,) for w in windows)
    texts = [bytes(w.tolist()).decode("utf-8", "replace") for w in windows]
    assert all(t.startswith("<user>") and "<assistant>" in t for t in texts)
    assert len(set(texts)) == 3  # different turns from the calibration text


def test_a_model_without_a_template_gets_none(tmp_path: Path) -> None:
    assert chat_sequences(_lm(tmp_path, None), 3, 48) == []
