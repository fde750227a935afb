"""The shared causal-LM driver: chunking, padding, positions, and the limits it enforces."""

from __future__ import annotations

import pytest
import torch

from qnn_common.causal_lm.steps import feed, teacher_forced_logits
from qnn_common.errors import ConfigValidationError
from qnn_common.llm_spec import GenerationConfig, LlmSpec, check_fits

VOCAB = 50


class RecordingLm:
    """A stand-in program with a real cache: logits one-hot at (sum of cached tokens) % VOCAB,
    so any wrong position, lost write or leaked padding changes the answer."""

    def __init__(self, spec: LlmSpec) -> None:
        self.spec = spec
        self.cache = torch.zeros(spec.max_seq_len, dtype=torch.int64)
        self.calls: list[tuple[str, list[int]]] = []

    def _step(self, name: str, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        assert ids.shape == (1, pos.numel())
        assert int(pos.max()) < self.spec.max_seq_len, "wrote past the cache"
        self.calls.append((name, pos.tolist()))
        out = torch.zeros(1, pos.numel(), VOCAB)
        for i, p in enumerate(pos.tolist()):
            self.cache[p] = ids[0, i]
            out[0, i, int(self.cache[: p + 1].sum()) % VOCAB] = 1.0
        return out

    def prefill(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        assert pos.numel() == self.spec.prefill_len
        return self._step("prefill", ids, pos)

    def decode(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        assert pos.numel() == 1
        return self._step("decode", ids, pos)


def expected(tokens: list[int]) -> list[int]:
    return [sum(tokens[: i + 1]) % VOCAB for i in range(len(tokens))]


@pytest.mark.parametrize("n", [1, 3, 8, 11, 16, 20])
def test_feed_matches_a_full_recompute_at_every_length(n: int) -> None:
    spec = LlmSpec(max_seq_len=20, prefill_len=8, vocab_size=VOCAB, pad_token_id=7)
    lm = RecordingLm(spec)
    tokens = [(3 * i + 1) % VOCAB for i in range(n)]
    logits = feed(lm.prefill, lm.decode, tokens, 0, spec)
    assert logits.shape == (n, VOCAB)
    assert logits.argmax(-1).tolist() == expected(tokens)


def test_full_chunks_prefill_and_a_tail_that_would_overflow_decodes() -> None:
    spec = LlmSpec(max_seq_len=20, prefill_len=8, vocab_size=VOCAB)
    lm = RecordingLm(spec)
    feed(lm.prefill, lm.decode, list(range(19)), 0, spec)
    # 0-7, 8-15 in prefill; 16-18 padded to 8 would reach position 23 > 19: decode instead.
    assert [name for name, _ in lm.calls] == ["prefill", "prefill", "decode", "decode", "decode"]


def test_a_short_tail_is_padded_when_the_padding_fits() -> None:
    spec = LlmSpec(max_seq_len=32, prefill_len=8, vocab_size=VOCAB)
    lm = RecordingLm(spec)
    feed(lm.prefill, lm.decode, [1, 2, 3], 0, spec)
    assert lm.calls == [("prefill", list(range(8)))]


def test_a_rest_up_to_decode_up_to_tokens_is_decoded() -> None:
    spec = LlmSpec(max_seq_len=32, prefill_len=8, vocab_size=VOCAB)
    for n, calls in ((3, ["decode"] * 3), (4, ["prefill"]), (11, ["prefill"] + ["decode"] * 3)):
        lm = RecordingLm(spec)
        tokens = [(5 * i + 2) % VOCAB for i in range(n)]
        logits = feed(lm.prefill, lm.decode, tokens, 0, spec, decode_up_to=3)
        assert [name for name, _ in lm.calls] == calls, n
        assert logits.argmax(-1).tolist() == expected(tokens)


def test_continuing_from_a_position_keeps_the_cache() -> None:
    spec = LlmSpec(max_seq_len=32, prefill_len=4, vocab_size=VOCAB)
    lm = RecordingLm(spec)
    tokens = [5, 9, 2, 7, 1, 1, 4]
    feed(lm.prefill, lm.decode, tokens[:5], 0, spec)
    tail = feed(lm.prefill, lm.decode, tokens[5:], 5, spec)
    assert tail.argmax(-1).tolist() == expected(tokens)[5:]


def test_teacher_forced_logits_restart_each_text_at_zero() -> None:
    spec = LlmSpec(max_seq_len=16, prefill_len=4, vocab_size=VOCAB)
    lm = RecordingLm(spec)
    texts = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([9, 9])]
    out = teacher_forced_logits(lm.prefill, lm.decode, texts, spec)
    assert [o.argmax(-1).tolist() for o in out] == [expected([1, 2, 3, 4, 5]), expected([9, 9])]


def test_feeding_past_the_context_is_refused() -> None:
    spec = LlmSpec(max_seq_len=8, prefill_len=4, vocab_size=VOCAB)
    lm = RecordingLm(spec)
    with pytest.raises(ConfigValidationError, match="exceed the context of 8"):
        feed(lm.prefill, lm.decode, list(range(9)), 0, spec)


def test_check_fits_names_the_limit_and_the_way_out() -> None:
    spec = LlmSpec(max_seq_len=64, prefill_len=16, vocab_size=VOCAB)
    check_fits(10, 54, spec)
    with pytest.raises(ConfigValidationError, match="longer than the program's context of 64"):
        check_fits(64, 1, spec)
    with pytest.raises(ConfigValidationError, match="ask for at most 14"):
        check_fits(50, 20, spec)


def test_spec_round_trips_through_json_and_rejects_bad_shapes() -> None:
    spec = LlmSpec(max_seq_len=64, prefill_len=16, vocab_size=257, stop_token_ids=(256,))
    assert LlmSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ConfigValidationError, match="must not exceed max_seq_len"):
        LlmSpec(max_seq_len=8, prefill_len=16, vocab_size=2)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"prompt": ""}, "prompt"), ({"max_new_tokens": 0}, "max_new_tokens"),
     ({"temperature": -1.0}, "temperature"), ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"),
     ({"prompt_decode_up_to": 0}, "prompt_decode_up_to"),
     ({"prompt_decode_up_to": True}, "prompt_decode_up_to")],
)
def test_generation_config_rejects_nonsense(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigValidationError, match=f"generation.{field}"):
        GenerationConfig(**kwargs)  # type: ignore[arg-type]  # values of several field types
