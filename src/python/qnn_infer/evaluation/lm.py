"""What the evaluation asks of a language model (`qnn_common.causal_lm.steps.StepLm`: prefill and
decode steps, whatever runs them), so that every model is scored by the same code on the same
tokens: teacher-forced logits and greedy replies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from qnn_common.causal_lm.steps import StepLm, feed

Logits = npt.NDArray[np.float32]


def logits(lm: StepLm, ids: Sequence[int]) -> Logits:
    """Teacher-forced logits [len(ids), vocab] of `ids` fed from position 0."""
    out: torch.Tensor = feed(lm.prefill, lm.decode, list(ids), 0, lm.spec)
    return out.detach().to(torch.float32).numpy()


# A continuation of at most this many tokens goes a token at a time through decode: a padded
# prefill window costs as much as a whole window, a decode step one token.
SHORT_CONTINUATION = 8


def continued(lm: StepLm, ids: Sequence[int], start: int) -> Logits:
    """Logits [len(ids), vocab] of `ids` fed at positions start.., after a context already fed
    below `start` (what a cache holds beyond `start` is overwritten, never read)."""
    out: torch.Tensor = feed(lm.prefill, lm.decode, list(ids), start, lm.spec,
                             decode_up_to=SHORT_CONTINUATION)
    return out.detach().to(torch.float32).numpy()


@dataclass(frozen=True)
class Reply:
    """A greedy reply: its tokens and the logits each was picked from ([len(tokens), vocab])."""

    tokens: tuple[int, ...]
    logits: Logits


def greedy(lm: StepLm, prompt: Sequence[int], new_tokens: int) -> Reply:
    """Up to `new_tokens` greedy tokens after `prompt` (fewer where the context ends or a stop
    token comes; the stop token is kept), the prompt fed as generation feeds it
    (`qnn_infer.generate.generate`, `StepLm.prompt_decode_up_to`)."""
    if not prompt:
        raise ValueError("an empty prompt")
    room = lm.spec.context - len(prompt)
    budget = min(new_tokens, room)
    if budget < 1:
        raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room in a context of "
                         f"{lm.spec.context}")
    row = feed(lm.prefill, lm.decode, list(prompt), 0, lm.spec,
               decode_up_to=lm.prompt_decode_up_to)[-1]
    rows: list[torch.Tensor] = []
    tokens: list[int] = []
    position = len(prompt)
    while True:
        rows.append(row.detach().to(torch.float32))
        token = int(torch.argmax(row))
        tokens.append(token)
        if len(tokens) >= budget or token in lm.spec.stop_token_ids:
            break
        row = feed(lm.prefill, lm.decode, [token], position, lm.spec)[-1]
        position += 1
    return Reply(tuple(tokens), torch.stack(rows).numpy())
