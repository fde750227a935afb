"""The prompt suite: every model's greedy reply to each prompt against the float model's (tokens
until the first divergence, and there the float model's own margin for its token over the one
taken, so that a near tie is told from a broken program), the known answer found or not, and
how much a reply repeats itself."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qnn_common.causal_lm.steps import StepLm
from qnn_common.numerics.lm_metrics import NEAR_TIE_NATS
from qnn_infer.evaluation.data import PromptCase, spread
from qnn_infer.evaluation.lm import Reply, greedy

log = logging.getLogger(__name__)

NEW_TOKENS = 32
# A reply repeats itself where its n-grams of this length recur.
REPEAT_NGRAM = 4


def repetition(tokens: Sequence[int], n: int = REPEAT_NGRAM) -> float:
    """The share of a reply's n-grams that occurred earlier in it (0: none repeats)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def answered(text: str, answers: Sequence[str]) -> bool:
    """Whether `text` holds any of `answers` (case-insensitive)."""
    low = text.lower()
    return any(a.lower() in low for a in answers)


@dataclass(frozen=True)
class PromptRow:
    """One model's reply to one prompt, against the reference's."""

    prompt: str
    text: str
    same_tokens: int  # tokens equal to the reference's before the first difference
    identical: bool
    margin: float | None  # at the first difference: reference's logit of its token minus this one's
    answer_found: bool | None  # None: no known answer
    repetition: float

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "text": self.text, "same_tokens": self.same_tokens,
                "identical": self.identical,
                "margin": None if self.margin is None else round(self.margin, 4),
                "answer_found": self.answer_found, "repetition": round(self.repetition, 4)}


def compare_reply(case: PromptCase, reply: Reply, reference: Reply, text: str) -> PromptRow:
    """`reply` against the reference's reply to the same prompt."""
    same = 0
    for mine, theirs in zip(reply.tokens, reference.tokens, strict=False):
        if mine != theirs:
            break
        same += 1
    identical = reply.tokens == reference.tokens
    margin = None
    if not identical and same < min(len(reply.tokens), len(reference.tokens)):
        # Up to `same` both read the same tokens, so the reference's logits at `same` score the
        # very choice this model made: its margin says how near a tie the flip was.
        row = reference.logits[same]
        margin = float(row[reference.tokens[same]] - row[reply.tokens[same]])
    return PromptRow(case.prompt, text, same, identical, margin,
                     answered(text, case.answers) if case.answers else None,
                     repetition(reply.tokens))


def summarize(rows: Sequence[PromptRow]) -> dict[str, Any]:
    """A model's suite in figures: exact-answer matches, identical replies, divergences (and
    how many on a near tie), mean repetition."""
    known = [r for r in rows if r.answer_found is not None]
    flips = [r for r in rows if r.margin is not None]
    return {
        "prompts": len(rows),
        "answers_known": len(known),
        "answers_found": sum(1 for r in known if r.answer_found),
        "answer_percent": round(100.0 * sum(1 for r in known if r.answer_found) / len(known), 2)
        if known else None,
        "identical": sum(1 for r in rows if r.identical),
        "mean_same_tokens": round(sum(r.same_tokens for r in rows) / len(rows), 2) if rows else 0,
        "diverged": len(flips),
        "diverged_near_tie": sum(1 for r in flips if r.margin is not None
                                 and r.margin < NEAR_TIE_NATS),
        "mean_repetition": round(sum(r.repetition for r in rows) / len(rows), 4) if rows else 0,
    }


def run_prompts(
    models: Sequence[StepLm], cases: Sequence[PromptCase],
    encode: Callable[[str], list[int]], decode_text: Callable[[Sequence[int]], str],
    new_tokens: int = NEW_TOKENS, limits: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Each model's replies; the first model is the reference. A model named in `limits`
    answers only that many prompts, spread over the suite (`indices` says which)."""
    reference, *others = models
    limits = limits or {}
    # A prompt that fills the context leaves no room for a reply: skipped by every model.
    encoded = [(i, case, encode(case.prompt)) for i, case in enumerate(cases)]
    fitting = [(i, case, ids) for i, case, ids in encoded if 0 < len(ids) < reference.spec.context]
    if len(fitting) < len(cases):
        log.warning("prompts: %d of %d skipped, longer than the context of %d tokens",
                    len(cases) - len(fitting), len(cases), reference.spec.context)
    picked = {m.name: {fitting[k][0] for k in spread(range(len(fitting)), limits.get(m.name))}
              for m in others}
    replies: dict[str, list[PromptRow]] = {m.name: [] for m in models}
    indices: dict[str, list[int]] = {m.name: [] for m in models}
    for number, (index, case, ids) in enumerate(fitting, 1):
        ref = greedy(reference, ids, new_tokens)
        ref_text = decode_text(ref.tokens)
        replies[reference.name].append(compare_reply(case, ref, ref, ref_text))
        indices[reference.name].append(index)
        for model in others:
            if index not in picked[model.name]:
                continue
            reply = greedy(model, ids, new_tokens)
            replies[model.name].append(
                compare_reply(case, reply, ref, decode_text(reply.tokens)))
            indices[model.name].append(index)
        if number % 10 == 0 or number == len(fitting):
            log.info("prompts: %d of %d answered", number, len(fitting))
    ref_rows = dict(zip(indices[reference.name], replies[reference.name], strict=True))
    return {
        "reference": reference.name, "new_tokens": new_tokens,
        "skipped_too_long": len(cases) - len(fitting),
        "models": {
            name: {
                **summarize(rows),
                # The reference over the same prompts: a limited model is judged on its subset.
                "reference_answer_percent": summarize(
                    [ref_rows[i] for i in indices[name]])["answer_percent"],
                "indices": indices[name],
                "rows": [r.to_json() for r in rows],
            }
            for name, rows in replies.items() if rows
        },
    }
