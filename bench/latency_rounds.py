"""Latency told from noise: programs and eager fp32 timed side by side in repeated rounds.

On a shared machine one p50 moves with the host (docs/benchmarks.md: MiniLM's 8a8w program
read 5.0 ms one day and 25.5 ms another, eager with it), so a ratio from two separate timings
cannot tell a regression from a busy neighbour. Here every contender is timed in every round,
the order rotated from round to round, and a ratio is taken within each round (where both saw
the same host): its median is the figure, its smallest and largest the spread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def p50_ms(call: Callable[[], object], runs: int, warmup: int = 3) -> float:
    """The median of `runs` timed calls after `warmup` untimed ones, in ms."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def timed_rounds(contenders: Mapping[str, Callable[[], object]], rounds: int,
                 runs: int) -> dict[str, list[float]]:
    """Each contender's p50 per round; round r starts at the r-th contender (no fixed order
    lends one of them the warm caches every time)."""
    if rounds < 1 or runs < 1:
        raise ValueError(f"rounds and runs must be at least 1 (got {rounds}, {runs})")
    names = list(contenders)
    p50s: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            p50s[name].append(p50_ms(contenders[name], runs))
    return p50s


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    """Median, smallest and largest."""
    return {"median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits)}


def ratio(p50s: Mapping[str, Sequence[float]], over: str, under: str) -> dict[str, float]:
    """`over` / `under` within each round: the median and spread of those ratios."""
    return spread([a / b for a, b in zip(p50s[over], p50s[under], strict=True)])


def summary(p50s: Mapping[str, Sequence[float]], eager: str,
            pairs: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """What a bench records: each contender's p50 spread, each against `eager`, and `pairs`."""
    return {
        "rounds": len(next(iter(p50s.values()))),
        "p50_ms": {n: spread(v) for n, v in p50s.items()},
        "vs": {f"{n} / {eager}": ratio(p50s, n, eager) for n in p50s if n != eager}
        | {f"{a} / {b}": ratio(p50s, a, b) for a, b in pairs},
    }
