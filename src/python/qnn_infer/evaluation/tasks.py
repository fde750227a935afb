"""Task accuracy by log-likelihood, as lm-eval scores multiple choice: each choice's summed
log-probability as the continuation of the item's context; `acc` picks the highest sum,
`acc_norm` the highest sum per character of the choice."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from qnn_common.llm import StepLm
from qnn_common.lm_metrics import log_softmax
from qnn_infer.evaluation.data import TaskItem
from qnn_infer.evaluation.lm import logits

log = logging.getLogger(__name__)


def continuation(encode: Callable[[str], list[int]], context: str, choice: str
                 ) -> tuple[list[int], list[int]]:
    """(context ids, choice ids) as lm-eval splits them: the whole text encoded once and the
    context's own encoding cut off its front, so a merge across the boundary is the model's."""
    whole = encode(context + choice)
    ctx = encode(context)
    if whole[:len(ctx)] != ctx or len(whole) <= len(ctx):
        # The boundary merged into the context's last token: score the choice encoded alone.
        return ctx, encode(choice)
    return ctx, whole[len(ctx):]


def choice_loglikelihood(lm: StepLm, ctx: Sequence[int], cont: Sequence[int]) -> float:
    """log P(cont | ctx) under `lm`, teacher-forced."""
    ids = [*ctx, *cont]
    logp = log_softmax(logits(lm, ids))
    # Position i's logits score token i + 1: the continuation's tokens from the context's last.
    start = len(ctx) - 1
    return float(sum(logp[start + i, t] for i, t in enumerate(cont)))


def score_item(lm: StepLm, item: TaskItem, encode: Callable[[str], list[int]]
               ) -> tuple[int, int]:
    """(acc's pick, acc_norm's pick) for one item."""
    sums = []
    for choice in item.choices:
        ctx, cont = continuation(encode, item.context, choice)
        sums.append(choice_loglikelihood(lm, ctx, cont))
    scores = np.asarray(sums)
    per_char = scores / np.asarray([max(1, len(c)) for c in item.choices])
    return int(np.argmax(scores)), int(np.argmax(per_char))


def run_tasks(
    models: Sequence[StepLm], items: Sequence[TaskItem], encode: Callable[[str], list[int]],
    limits: dict[str, int] | None = None,
) -> dict[str, Any]:
    """acc and acc_norm per model, overall and per task, and how often each model picks what
    the first (the reference) picks. A model named in `limits` scores that many items."""
    limits = limits or {}
    picks: dict[str, list[tuple[int, int]]] = {m.name: [] for m in models}
    for number, item in enumerate(items, 1):
        for model in models:
            if number <= limits.get(model.name, len(items)):
                picks[model.name].append(score_item(model, item, encode))
        if number % 50 == 0 or number == len(items):
            log.info("tasks: %d of %d items scored", number, len(items))
    reference = models[0].name
    out: dict[str, Any] = {}
    for name, chosen in picks.items():
        if not chosen:
            continue
        scored = items[:len(chosen)]
        ref = picks[reference][:len(chosen)]
        out[name] = {
            "items": len(chosen),
            "acc": _percent(sum(p[0] == it.answer for p, it in zip(chosen, scored, strict=True)),
                            len(chosen)),
            "acc_norm": _percent(
                sum(p[1] == it.answer for p, it in zip(chosen, scored, strict=True)), len(chosen)),
            "same_pick_as_reference": _percent(
                sum(p[0] == r[0] for p, r in zip(chosen, ref, strict=True)), len(chosen)),
            "reference_acc": _percent(
                sum(r[0] == it.answer for r, it in zip(ref, scored, strict=True)), len(chosen)),
            "by_task": _by_task(chosen, scored),
        }
    return {"reference": reference, "models": out}


def _percent(hits: int, total: int) -> float:
    return round(100.0 * hits / total, 2) if total else 0.0


def _by_task(chosen: Sequence[tuple[int, int]], items: Sequence[TaskItem]) -> dict[str, float]:
    tasks: dict[str, list[bool]] = {}
    for pick, item in zip(chosen, items, strict=True):
        tasks.setdefault(item.task, []).append(pick[0] == item.answer)
    return {task: _percent(sum(hits), len(hits)) for task, hits in sorted(tasks.items())}
