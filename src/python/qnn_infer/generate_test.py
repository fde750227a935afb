"""Picking tokens and the generation loop, over a stand-in program (the real .pte runs in
tests/llm)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from qnn_common.cli import noise
from qnn_common.errors import ConfigValidationError
from qnn_common.llm_spec import DECODE, PREFILL, GenerationConfig, LlmSpec
from qnn_common.recipes import Backend
from qnn_infer import generate as generate_module
from qnn_infer.generate import PteLm, generate, pick_next, prompt_rest_decode_up_to

LOGITS = torch.tensor([0.0, 3.0, 2.5, 1.0, -1.0])


def test_greedy_is_argmax() -> None:
    assert pick_next(LOGITS, GenerationConfig(), torch.Generator()) == 1


def test_sampling_is_reproducible_with_a_seed_and_varies_without() -> None:
    cfg = GenerationConfig(temperature=2.0, seed=3)
    runs = [[pick_next(LOGITS, cfg, torch.Generator().manual_seed(s)) for _ in range(20)]
            for s in (3, 3, 4)]
    assert runs[0] == runs[1]
    assert len(set(runs[0]) | set(runs[2])) > 1


def test_top_k_and_top_p_cut_the_candidates() -> None:
    gen = torch.Generator().manual_seed(0)
    top2 = {pick_next(LOGITS, GenerationConfig(temperature=5.0, top_k=2), gen) for _ in range(200)}
    assert top2 == {1, 2}
    # p(1) ~ 0.55 at temperature 1: a top_p below it keeps the single most likely token.
    nucleus = {pick_next(LOGITS, GenerationConfig(temperature=1.0, top_p=0.3), gen)
               for _ in range(100)}
    assert nucleus == {1}


class Counter:
    """A program that always predicts (last token + 1) % vocab, with a call log."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.decoded: list[int] = []

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(1, ids.shape[1], self.vocab)
        for i, t in enumerate(ids[0].tolist()):
            out[0, i, (t + 1) % self.vocab] = 1.0
        return out

    def prefill(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self._logits(ids)

    def decode(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.decoded.append(int(pos))
        return self._logits(ids)


def test_generation_counts_up_to_the_stop_token_and_reports_speed() -> None:
    spec = LlmSpec(max_seq_len=32, prefill_len=4, vocab_size=10, stop_token_ids=(9,))
    lm = Counter(10)
    result = generate(lm.prefill, lm.decode, [3, 4, 5], GenerationConfig(max_new_tokens=20),
                      spec, lambda toks: ",".join(map(str, toks)))
    assert result.tokens == (6, 7, 8, 9)
    assert result.stopped_by == "stop_token"
    assert result.text == "6,7,8,9"
    # Each new token is decoded at its own position: 6 at 3, 7 at 4, 8 at 5 (9 ends it).
    assert lm.decoded == [3, 4, 5]
    assert result.ttft_ms > 0 and result.decode_tokens_per_s > 0


def test_a_short_prompt_rest_goes_through_decode_when_asked() -> None:
    spec = LlmSpec(max_seq_len=32, prefill_len=4, vocab_size=10, stop_token_ids=(9,))
    for up_to, decoded in ((1, [3, 4, 5]), (3, [0, 1, 2, 3, 4, 5])):
        lm = Counter(10)
        result = generate(lm.prefill, lm.decode, [3, 4, 5], GenerationConfig(max_new_tokens=20),
                          spec, str, decode_up_to=up_to)
        assert result.tokens == (6, 7, 8, 9) and lm.decoded == decoded


def test_a_prompt_rest_goes_through_decode_by_the_backends_rule_unless_pinned() -> None:
    # A rule, not a timing: the same prompt gets the same reply however loaded the host is.
    auto = GenerationConfig()
    assert prompt_rest_decode_up_to(auto, Backend.XNNPACK) == 4  # a CPU window: 5-8 steps
    assert prompt_rest_decode_up_to(auto, Backend.QNN) == 1  # an HTP window: about one step
    assert prompt_rest_decode_up_to(auto, Backend.PORTABLE) == 1
    pinned = GenerationConfig(prompt_decode_up_to=7)
    assert {prompt_rest_decode_up_to(pinned, b) for b in Backend} == {7}


def test_generation_stops_at_max_new_tokens_and_streams(capsys: pytest.CaptureFixture[str]) -> None:
    spec = LlmSpec(max_seq_len=32, prefill_len=4, vocab_size=100)
    lm = Counter(100)
    cfg = GenerationConfig(max_new_tokens=3, stream=True)
    result = generate(lm.prefill, lm.decode, [1], cfg, spec, lambda toks: "".join(map(str, toks)))
    assert result.tokens == (2, 3, 4) and result.stopped_by == "max_new_tokens"
    assert capsys.readouterr().out == "234\n"


def test_a_prompt_that_leaves_no_room_is_refused_before_running() -> None:
    spec = LlmSpec(max_seq_len=8, prefill_len=4, vocab_size=10)
    lm = Counter(10)
    with pytest.raises(ConfigValidationError, match="ask for at most 3"):
        generate(lm.prefill, lm.decode, [1] * 5, GenerationConfig(max_new_tokens=4), spec, str)
    assert lm.decoded == []


# Native code writes to fds 1 and 2; under capfd, those are sys.stdout's and sys.stderr's.


class _ChattyMethod:
    """A method whose runtime, like the QNN emulator's, reports its load and release."""

    def __init__(self, name: str) -> None:
        line = f"[INFO] [Qnn ExecuTorch]: Running level=3 optimization. ({name})\n"
        os.write(sys.stderr.fileno(), line.encode())

    def __del__(self) -> None:
        os.write(sys.stderr.fileno(), b"[INFO] [Qnn ExecuTorch]: Destroy Qnn context\n")


class _ChattyRuntime:
    method_names = (PREFILL, DECODE)

    def load_program(self, path: str) -> _ChattyRuntime:
        os.write(sys.stdout.fileno(), b" # LIBNATIVE: No alternate configuration present in "
                 b"libnative_tls.conf or from LIBNATIVE_CONFIG environment variable\n")
        os.write(sys.stderr.fileno(), b"[WARNING] [Qnn ExecuTorch]: Qnn API version 2.40.0 is "
                 b"used. The version is tested against 2.27.0.\n")
        return self

    def load_method(self, name: str) -> _ChattyMethod:
        return _ChattyMethod(name)


def test_the_runtime_greetings_and_goodbyes_stay_out_of_the_stream(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 49, item 10: on the HTP the runtime's [INFO] lines for loading each method came
    right before the streamed tokens, and its goodbyes after the report (tests/qnn runs the real
    emulator). Without quiet mode (-v) they all show."""
    monkeypatch.setattr(noise, "_quiet", False)
    monkeypatch.setattr(generate_module, "host_runtime", _ChattyRuntime)
    spec = LlmSpec(max_seq_len=32, prefill_len=4, vocab_size=10)
    noise.quiet_third_party()
    lm = PteLm(Path("model.pte"), spec)
    lm.close()
    assert capfd.readouterr() == ("", "")
    monkeypatch.setattr(noise, "_quiet", False)  # -v
    PteLm(Path("model.pte"), spec).close()
    shown = capfd.readouterr()
    assert "LIBNATIVE" in shown.out
    assert shown.err.count("Running level=3") == 2 and "Destroy Qnn context" in shown.err
