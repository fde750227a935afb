"""What a causal LM is calibrated on and what it is evaluated on are never the same text."""

from __future__ import annotations

import pytest

from qnn_prepare.causal_lm.export import HALVES, HELD_OUT, load_causal_lm, text_sequences


def _windows(tokens: list[list[int]], n: int) -> set[tuple[int, ...]]:
    return {tuple(t[i : i + n]) for t in tokens for i in range(len(t) - n + 1)}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen"])
def test_tiny_decoders_calibrate_on_one_half_and_are_evaluated_on_the_other(name: str) -> None:
    lm = load_causal_lm(name, max_seq_len=64, prefill_len=16)
    assert lm.texts is HALVES
    calibration = text_sequences(lm, 16, 32)
    evaluation = text_sequences(lm, 16, 32, text=lm.texts.eval, stride=32)
    # No 24-byte run of any eval window occurs in any calibration window (shorter ones do: the
    # same phrases recur in one chapter, " Alice was ").
    as_lists = [[int(v) for v in t] for t in calibration], [[int(v) for v in t] for t in evaluation]
    assert not _windows(as_lists[0], 24) & _windows(as_lists[1], 24)
    # Eval windows follow each other: every token once.
    starts = [lm.encode(lm.texts.eval)[i * 32 : i * 32 + 32] for i in range(16)]
    assert as_lists[1] == starts


def test_other_models_are_evaluated_on_text_they_are_not_calibrated_on() -> None:
    assert HELD_OUT.calibration != HELD_OUT.eval and "Four score" in HELD_OUT.eval
    sentences = [s.strip() for s in HELD_OUT.eval.split(".") if len(s.strip()) > 20]
    assert sentences and not any(s in HELD_OUT.calibration for s in sentences)
    assert "Gettysburg" in HELD_OUT.eval_source and "Alice" in HELD_OUT.calibration_source


def test_a_causal_lm_is_what_transformers_loads_as_one() -> None:
    from qnn_prepare.hf_dir import is_causal_lm_architecture

    for name in ("LlamaForCausalLM", "GPT2LMHeadModel", "OpenAIGPTLMHeadModel"):
        assert is_causal_lm_architecture(name), name
    for name in ("BertModel", "BertForSequenceClassification", "T5ForConditionalGeneration"):
        assert not is_causal_lm_architecture(name), name
