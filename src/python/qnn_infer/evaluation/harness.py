"""One evaluation: the corpus, the prompt suite and the tasks, the first model the reference for
the others, sized by a `Suite` (and, for a slow model, by `limits`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from qnn_common.causal_lm.steps import StepLm
from qnn_common.errors import ConfigValidationError
from qnn_infer.evaluation.blocks import Tap, block_errors
from qnn_infer.evaluation.corpus import MAX_WINDOW, score_corpus, windows
from qnn_infer.evaluation.data import EvalData, spread
from qnn_infer.evaluation.prompts import run_prompts
from qnn_infer.evaluation.tasks import run_tasks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Suite:
    """How much of the data one evaluation reads (None: all of it)."""

    name: str
    corpus_tokens: int | None
    prompts: int | None
    tasks: int | None
    new_tokens: int = 32
    # Corpus tokens (the first windows) over which each decoder block's error is traced.
    block_tokens: int = 512

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


SUITES = {
    "quick": Suite("quick", corpus_tokens=2048, prompts=10, tasks=40),
    "full": Suite("full", corpus_tokens=None, prompts=None, tasks=None, block_tokens=2048),
}
# What a slow program (the HTP emulator's) reads of a suite, the references reading it all.
# The emulator takes seconds per decode step and per prefill window (docs/eval.md): 2,048 corpus
# tokens are what a perplexity interval needs, while every prompt costs up to new_tokens decode
# steps and every task item a prefill and a decode step per choice token, so those are few.
SLOW_PROGRAM = Suite("slow program", corpus_tokens=2048, prompts=4, tasks=10)


def suite_named(name: str) -> Suite:
    if name not in SUITES:
        raise ConfigValidationError("eval", name, "is not a suite", allowed=tuple(SUITES))
    return SUITES[name]


@dataclass(frozen=True)
class Text:
    """How text becomes tokens and back: `encode` for the corpus and tasks (no special
    tokens), `prompt` for a prompt suite's prompt (through the chat template where the model
    has one), `decode` for a reply."""

    encode: Callable[[str], list[int]]
    prompt: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]


def evaluate(
    models: Sequence[StepLm], data: EvalData, suite: Suite, text: Text,
    slow: Mapping[str, Suite] | None = None, taps: Mapping[str, Tap] | None = None,
) -> dict[str, Any]:
    """The three measurements, every model after the first against the first (the float
    model). A model named in `slow` reads that suite's share where it is smaller. With `taps`
    for the reference and another model (by name), each decoder block's error of that model
    too (`blocks.block_errors`), over the suite's `block_tokens`."""
    if len(models) < 2:
        raise ValueError("an evaluation needs a reference and at least one model to compare")
    slow = slow or {}
    spec = models[0].spec
    length = min(MAX_WINDOW, spec.context)
    out: dict[str, Any] = {"suite": suite.to_json(), "sources": dict(data.sources),
                           "models": [m.name for m in models]}
    seconds: dict[str, float] = {}

    t = time.perf_counter()
    cut = windows(data.documents, text.encode, length, suite.corpus_tokens)
    corpus = score_corpus(models[0], models[1:], cut, _limits(slow, "corpus_tokens", suite))
    out["corpus"] = {**corpus.to_json(), "window": length}
    seconds["corpus"] = time.perf_counter() - t

    taps = taps or {}
    traced = [m for m in models[1:] if m.name in taps]
    if models[0].name in taps and traced:
        t = time.perf_counter()
        first, total = [], 0
        for ids in cut:
            if total >= suite.block_tokens:
                break
            first.append(ids)
            total += len(ids)
        out["blocks"] = block_errors(models[0], taps[models[0].name], traced[0],
                                     taps[traced[0].name], first)
        seconds["blocks"] = time.perf_counter() - t

    t = time.perf_counter()
    prompts = spread(data.prompts, suite.prompts)
    out["prompts"] = run_prompts(models, prompts, text.prompt, text.decode, suite.new_tokens,
                                 _limits(slow, "prompts", suite))
    seconds["prompts"] = time.perf_counter() - t

    t = time.perf_counter()
    items = spread(data.tasks, suite.tasks)
    out["tasks"] = run_tasks(models, items, text.encode, _limits(slow, "tasks", suite))
    seconds["tasks"] = time.perf_counter() - t
    out["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    log.info("evaluation (%s) took %.0f s", suite.name, sum(seconds.values()))
    return out


def _limits(slow: Mapping[str, Suite], field: str, suite: Suite) -> dict[str, int]:
    """Per slow model, its share of `field` where smaller than the suite's."""
    out: dict[str, int] = {}
    for name, share in slow.items():
        limit = getattr(share, field)
        full = getattr(suite, field)
        if limit is not None and (full is None or limit < full):
            out[name] = limit
    return out
