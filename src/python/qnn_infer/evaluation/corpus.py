"""Next-token figures over a corpus: each document cut into windows of the context's length,
every candidate's logits scored against the float model's window by window
(`qnn_common.numerics.lm_metrics.score_window`), so that no model's logits for the whole corpus
are ever held. A slow candidate (the HTP emulator's program) can be limited to the first windows;
the report says over how many tokens each ran."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qnn_common.causal_lm.steps import StepLm
from qnn_common.numerics.lm_metrics import WindowScore, score_window, summarize_windows
from qnn_infer.evaluation.data import Document
from qnn_infer.evaluation.lm import logits

log = logging.getLogger(__name__)

# Windows no longer than this even where the context is longer: scoring cost grows with it.
MAX_WINDOW = 512
MIN_WINDOW = 2


def windows(
    documents: Sequence[Document], encode: Callable[[str], list[int]], length: int,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """Each document's tokens cut into windows of `length` (a last, shorter one kept if it
    scores anything), in order, up to `max_tokens` in all."""
    if length < MIN_WINDOW:
        raise ValueError(f"windows of {length} tokens score nothing")
    out: list[list[int]] = []
    total = 0
    for doc in documents:
        ids = encode(doc.text)
        for start in range(0, len(ids), length):
            window = ids[start:start + length]
            if max_tokens is not None:
                window = window[:max_tokens - total]
            if len(window) < MIN_WINDOW:
                break
            out.append(window)
            total += len(window)
            if max_tokens is not None and total >= max_tokens:
                return out
    return out


@dataclass(frozen=True)
class CorpusResult:
    """Per candidate: its comparison with the reference as JSON, over how many windows and
    tokens it ran, and its seconds."""

    reference: str
    tokens: int
    windows: int
    candidates: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "tokens": self.tokens, "windows": self.windows,
                "candidates": self.candidates}


def score_corpus(
    reference: StepLm, candidates: Sequence[StepLm], cut: Sequence[Sequence[int]],
    limits: Mapping[str, int] | None = None,
) -> CorpusResult:
    """Every candidate against `reference` over the windows `cut` (a candidate named in `limits`
    over the first windows that hold at most that many tokens)."""
    limits = limits or {}
    scores: dict[str, list[WindowScore]] = {c.name: [] for c in candidates}
    seconds = {c.name: 0.0 for c in candidates}
    budget = {c.name: limits.get(c.name) for c in candidates}
    used = {c.name: 0 for c in candidates}
    ref_seconds = 0.0
    for number, ids in enumerate(cut, 1):
        wanted = [c for c in candidates
                  if budget[c.name] is None or used[c.name] + len(ids) <= (budget[c.name] or 0)]
        if not wanted:
            break
        t = time.perf_counter()
        ref = logits(reference, ids)
        ref_seconds += time.perf_counter() - t
        for cand in wanted:
            t = time.perf_counter()
            theirs = logits(cand, ids)
            seconds[cand.name] += time.perf_counter() - t
            scores[cand.name].append(score_window(ref, theirs, ids))
            used[cand.name] += len(ids)
        if number % 10 == 0 or number == len(cut):
            log.info("corpus: %d of %d windows scored", number, len(cut))
    result: dict[str, dict[str, Any]] = {}
    widest = max(scores.values(), key=len)
    if widest:  # the reference's own perplexity, over the windows the widest candidate ran
        count = sum(s.scored for s in widest)
        result[reference.name] = {
            "perplexity": round(math.exp(sum(s.reference_nll for s in widest) / count), 4),
            "windows": len(widest), "tokens": sum(len(w) for w in cut[:len(widest)]),
            "seconds": round(ref_seconds, 2),
        }
    for cand in candidates:
        if not scores[cand.name]:
            continue
        result[cand.name] = {
            **summarize_windows(scores[cand.name]).to_json(),
            "windows": len(scores[cand.name]), "tokens": used[cand.name],
            "seconds": round(seconds[cand.name], 2),
        }
    return CorpusResult(reference.name, sum(len(w) for w in cut), len(cut), result)
