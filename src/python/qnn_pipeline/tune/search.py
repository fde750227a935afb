"""The search: layer groups promoted from the cheap recipe to the rich one in the order of what
each buys per byte it costs (the sensitivity pass), and the fewest promotions that meet the
budget found by bisection, each candidate it stops at verified: quantized for real with its
per-layer recipe table and scored (`verify`), never taken from the sensitivity pass's sums.

KL divergence falls as groups are promoted and the weight bytes rise, so a bisection over the
number promoted finds the cheapest verified candidate within the KL budget in about log2(groups)
quantizations; the first guess is where the pass's sums cross the budget."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import Recipe
from qnn_pipeline.tune.scoring import Score
from qnn_pipeline.tune.sensitivity import GroupGain, Sensitivity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """What the winner must meet: mean KL divergence from the float model at most `max_kl`
    (nats per token, on the search's tokens), its searched layers' weights at most
    `max_weight_bytes`. Either may be None (not bounded); not both."""

    max_kl: float | None = None
    max_weight_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_kl is None and self.max_weight_bytes is None:
            raise ConfigValidationError(
                "tune budget", None,
                "give at least one bound: --max-kl (e.g. 0.02) and / or --max-weight-mb")
        if self.max_kl is not None and self.max_kl < 0:
            raise ConfigValidationError("--max-kl", self.max_kl, "must be >= 0")
        if self.max_weight_bytes is not None and self.max_weight_bytes <= 0:
            raise ConfigValidationError("--max-weight-mb", self.max_weight_bytes, "must be > 0")

    def met(self, score: Score, weight_bytes: int) -> bool:
        return ((self.max_kl is None or score.kl <= self.max_kl)
                and (self.max_weight_bytes is None or weight_bytes <= self.max_weight_bytes))

    def to_json(self) -> dict[str, Any]:
        return {"max_kl": self.max_kl, "max_weight_bytes": self.max_weight_bytes}


@dataclass(frozen=True)
class Candidate:
    """The first `promoted` groups of the order at the rich recipe, verified."""

    promoted: int
    table: tuple[LayerRecipe, ...]
    weight_bytes: int
    predicted_kl: float
    score: Score
    artifact: Path | None = None  # its quantize artifact

    def to_json(self) -> dict[str, Any]:
        return {"promoted": self.promoted, "weight_bytes": self.weight_bytes,
                "predicted_kl": round(self.predicted_kl, 6), **self.score.to_json(),
                "artifact": None if self.artifact is None else str(self.artifact),
                "layer_recipes": [e.to_text() for e in self.table]}


@dataclass(frozen=True)
class Plan:
    """The promotion order, and each prefix's weight bytes and predicted KL."""

    order: tuple[GroupGain, ...]
    cheap: Recipe
    rich: Recipe
    fixed: tuple[GroupGain, ...] = ()  # same weights at both recipes: never promoted

    def table(self, k: int) -> tuple[LayerRecipe, ...]:
        return tuple(LayerRecipe(g.group.pattern, self.rich) for g in self.order[:k])

    def weight_bytes(self, k: int) -> int:
        cheap, rich = _bits(self.cheap), _bits(self.rich)
        fixed = sum(g.group.weight_bytes(cheap) for g in self.fixed)
        return fixed + sum(
            g.group.weight_bytes(rich if i < k else cheap) for i, g in enumerate(self.order))


def _bits(recipe: Recipe) -> int:
    return recipe.traits.weight_bits or 32  # fp32 layers keep 32-bit weights


def plan(sensitivity: Sensitivity, cheap: Recipe, rich: Recipe) -> Plan:
    """Groups by KL gained per extra weight byte, the most first; ties (and no gain) by size,
    the smallest first."""
    extra_bits = _bits(rich) - _bits(cheap)
    if extra_bits <= 0:
        raise ConfigValidationError(
            "--promote-to", rich.value,
            f"has no more weight bits than {cheap.value}: nothing to buy with bytes")
    moved = [g for g in sensitivity.gains if g.changed]
    fixed = tuple(g for g in sensitivity.gains if not g.changed)
    order = sorted(moved, key=lambda g: (-sensitivity.gain(g) / max(g.group.weights, 1),
                                         g.group.weights))
    return Plan(tuple(order), cheap, rich, fixed)


@dataclass
class Search:
    """The candidates verified so far (by number promoted) and the chosen one."""

    plan: Plan
    budget: Budget
    cheap_kl: float
    verified: dict[int, Candidate] = field(default_factory=dict)
    winner: Candidate | None = None

    def predicted_kl(self, k: int) -> float:
        gained = sum(max(0.0, self.cheap_kl - g.score.kl) for g in self.plan.order[:k])
        return max(0.0, self.cheap_kl - gained)


# A candidate's table -> its score, and the quantize artifact it was scored from.
Verify = Callable[[tuple[LayerRecipe, ...]], tuple[Score, Path | None]]


def search(
    sensitivity: Sensitivity, cheap: Recipe, rich: Recipe, budget: Budget, verify: Verify,
) -> Search:
    """The fewest promotions meeting `budget`, verified (module docstring). `winner` is None
    when no candidate within the byte budget meets the KL one (the front shows how close)."""
    p = plan(sensitivity, cheap, rich)
    state = Search(p, budget, sensitivity.cheap.kl)
    n = len(p.order)
    top = n
    if budget.max_weight_bytes is not None:
        within = [k for k in range(n + 1) if p.weight_bytes(k) <= budget.max_weight_bytes]
        if not within:
            log.warning("no candidate fits %d weight bytes: the cheapest takes %d",
                        budget.max_weight_bytes, p.weight_bytes(0))
            return state
        top = max(within)

    def check(k: int) -> Candidate:
        if k not in state.verified:
            table = p.table(k)
            log.info("verifying %d of %d groups promoted to %s", k, n, rich.value)
            score, artifact = verify(table)
            state.verified[k] = Candidate(k, table, p.weight_bytes(k), state.predicted_kl(k),
                                          score, artifact)
        return state.verified[k]

    if budget.max_kl is None:  # bytes only: the most accurate that fits
        state.winner = check(top)
        return state
    if check(top).score.kl > budget.max_kl:
        check(0)  # the other end of the front: how much the promotions bought, if anything
        return state  # not even the richest that fits meets it
    if check(0).score.kl <= budget.max_kl:
        state.winner = state.verified[0]
        return state
    fail, ok = 0, top
    guess = next((k for k in range(1, top) if state.predicted_kl(k) <= budget.max_kl), None)
    while ok - fail > 1:
        mid = guess if guess is not None and fail < guess < ok else (fail + ok) // 2
        guess = None
        if check(mid).score.kl <= budget.max_kl:
            ok = mid
        else:
            fail = mid
    state.winner = state.verified[ok]
    return state


def pareto(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates no other beats on both weight bytes and KL divergence, by bytes."""
    ordered = sorted(candidates, key=lambda c: (c.weight_bytes, c.score.kl))
    front: list[Candidate] = []
    for c in ordered:
        if not front or c.score.kl < front[-1].score.kl:
            front.append(c)
    return front
