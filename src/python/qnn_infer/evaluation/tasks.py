"""Task accuracy by log-likelihood, as lm-eval scores multiple choice: each choice's summed
log-probability as the continuation of the item's context; `acc` picks the highest sum,
`acc_norm` the highest sum per character of the choice."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qnn_common.causal_lm.steps import StepLm
from qnn_common.numerics.lm_metrics import log_softmax
from qnn_infer.evaluation.data import TaskItem, spread
from qnn_infer.evaluation.lm import continued, logits

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


@dataclass(frozen=True)
class EncodedItem:
    """An item's context ids and each choice's continuation ids (`continuation`), encoded once
    for every model that scores it."""

    context: list[int]
    choices: list[list[int]]

    def longest(self) -> int:
        return len(self.context) + max(len(c) for c in self.choices)


def encode_item(item: TaskItem, encode: Callable[[str], list[int]]) -> EncodedItem:
    return EncodedItem(encode(item.context),
                       [continuation(encode, item.context, choice)[1] for choice in item.choices])


def score_item(lm: StepLm, item: TaskItem, encoded: EncodedItem) -> tuple[int, int]:
    """(acc's pick, acc_norm's pick) for one item: the context fed once, each choice continued
    from it (the cache past the context is rewritten by every choice)."""
    ctx = encoded.context
    last = log_softmax(logits(lm, ctx))[-1]  # scores each choice's first token
    sums = []
    for cont in encoded.choices:
        total = float(last[cont[0]])
        if len(cont) > 1:
            # Position i's logits score token i + 1: the choice's own tokens but its last.
            logp = log_softmax(continued(lm, cont[:-1], len(ctx)))
            total += float(sum(logp[i, t] for i, t in enumerate(cont[1:])))
        sums.append(total)
    scores = np.asarray(sums)
    per_char = scores / np.asarray([max(1, len(c)) for c in item.choices])
    return int(np.argmax(scores)), int(np.argmax(per_char))


def run_tasks(
    models: Sequence[StepLm], items: Sequence[TaskItem], encode: Callable[[str], list[int]],
    limits: dict[str, int] | None = None,
) -> dict[str, Any]:
    """acc and acc_norm per model, overall and per task, and how often each model picks what
    the first (the reference) picks. A model named in `limits` scores that many items, spread
    over the suite."""
    limits = limits or {}
    reference = models[0].name
    # An item whose context and longest choice pass the context cannot be scored: skipped.
    context = models[0].spec.context
    encoded = [encode_item(item, encode) for item in items]
    fitting = [i for i, e in enumerate(encoded) if e.longest() <= context]
    if len(fitting) < len(items):
        log.warning("tasks: %d of %d items skipped, longer than the context of %d tokens",
                    len(items) - len(fitting), len(items), context)
    picked = {m.name: {fitting[k] for k in spread(range(len(fitting)), limits.get(m.name))}
              for m in models}
    picked[reference] = set(fitting)
    picks: dict[str, dict[int, tuple[int, int]]] = {m.name: {} for m in models}
    for index, item in enumerate(items):
        if index not in picked[reference]:
            continue
        for model in models:
            if index in picked[model.name]:
                picks[model.name][index] = score_item(model, item, encoded[index])
        if (index + 1) % 50 == 0 or index + 1 == len(items):
            log.info("tasks: %d of %d items scored", index + 1, len(items))
    out: dict[str, Any] = {}
    for name, chosen in picks.items():
        if not chosen:
            continue
        at = sorted(chosen)
        mine = [chosen[i] for i in at]
        scored = [items[i] for i in at]
        ref = [picks[reference][i] for i in at]
        out[name] = {
            "items": len(at),
            "acc": _percent(sum(p[0] == it.answer for p, it in zip(mine, scored, strict=True)),
                            len(at)),
            "acc_norm": _percent(
                sum(p[1] == it.answer for p, it in zip(mine, scored, strict=True)), len(at)),
            "same_pick_as_reference": _percent(
                sum(p[0] == r[0] for p, r in zip(mine, ref, strict=True)), len(at)),
            "reference_acc": _percent(
                sum(r[0] == it.answer for r, it in zip(ref, scored, strict=True)), len(at)),
            "by_task": _by_task(mine, scored),
        }
    return {"reference": reference, "skipped_too_long": len(items) - len(fitting), "models": out}


def _percent(hits: int, total: int) -> float:
    return round(100.0 * hits / total, 2) if total else 0.0


def _by_task(chosen: Sequence[tuple[int, int]], items: Sequence[TaskItem]) -> dict[str, float]:
    tasks: dict[str, list[bool]] = {}
    for pick, item in zip(chosen, items, strict=True):
        tasks.setdefault(item.task, []).append(pick[0] == item.answer)
    return {task: _percent(sum(hits), len(hits)) for task, hits in sorted(tasks.items())}
