"""Calibration windows in an instruct model's chat format.

A chat prompt reaches the model as its template renders it: role markers, special tokens, a
default system prompt. Plain-text calibration never shows the model those tokens, so a static
recipe sets every activation range without them, and the activations they produce at run time
can fall outside and clip. SmolLM2-135M at 16a8w, calibrated on 16 plain-text windows, scored
better teacher-forced than on 4, yet answered the chat question wrong (docs/llm.md, SmolLM2 on the
HTP). Upstream's QNN LLM export calibrates instruct models on chat-formatted samples for the
same reason. Half of an instruct model's calibration windows are conversations built from the
calibration text (a sentence as the user's turn, the sentences after it as the assistant's),
rendered with the model's own template in the bounded renderer every foreign template goes
through (`qnn_common.torchio.chat_template`).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from qnn_common.torchio.chat_template import render_chat
from qnn_prepare.causal_lm.export import CausalLm

# Sentences the assistant's turn starts with: enough to fill any window in this repo's shapes,
# re-rendered with more if not. The user's turn is one sentence cut to a few words, so that even
# a short window reaches the assistant's turn.
_ANSWER_SENTENCES = 6
_USER_WORDS = 12


def has_chat_template(lm: CausalLm) -> bool:
    return lm.tokenizer is not None and bool(getattr(lm.tokenizer, "chat_template", None))


def _sentences(text: str) -> list[str]:
    parts = [p.strip() for p in re.split(r"(?<=[.!?])\s+", " ".join(text.split()))]
    return [p for p in parts if p]


def chat_sequences(lm: CausalLm, count: int, length: int) -> list[torch.Tensor]:
    """`count` token windows of `length`, each the start of a conversation in `lm`'s chat
    template; none if it has no template (or one that renders too little to fill a window)."""
    if count < 1 or not has_chat_template(lm):
        return []
    tokenizer = lm.tokenizer
    assert tokenizer is not None
    sentences = _sentences(lm.texts.calibration)
    where = Path(lm.name)
    out = []
    for i in range(count):
        first = (i * 3) % len(sentences)
        answer_len = _ANSWER_SENTENCES
        while True:
            answer = [sentences[(first + 1 + k) % len(sentences)] for k in range(answer_len)]
            text = render_chat(
                tokenizer,
                [{"role": "user", "content": " ".join(sentences[first].split()[:_USER_WORDS])},
                 {"role": "assistant", "content": " ".join(answer)}],
                where, add_generation_prompt=False,
            )
            # As infer tokenizes a rendered prompt: the template has put the special tokens in.
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(ids) >= length or answer_len >= 4 * len(sentences):
                break
            answer_len *= 2
        if len(ids) < length:  # a template that drops the turns: nothing chat-like to calibrate
            return []
        out.append(torch.tensor(ids[:length], dtype=torch.int64))
    return out
