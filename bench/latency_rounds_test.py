"""Interleaved rounds: every contender timed each round, the order rotated, ratios per round."""

from __future__ import annotations

import time

import pytest
from latency_rounds import p50_ms, ratio, spread, summary, timed_rounds


def test_every_contender_runs_every_round_in_a_rotated_order() -> None:
    order: list[str] = []

    def call(name: str) -> None:
        order.append(name)

    p50s = timed_rounds({"a": lambda: call("a"), "b": lambda: call("b")}, rounds=2, runs=1)
    assert {n: len(v) for n, v in p50s.items()} == {"a": 2, "b": 2}
    # Round 0 times a then b, round 1 b then a (each: 3 untimed calls, then 1 timed).
    assert order == ["a"] * 4 + ["b"] * 4 + ["b"] * 4 + ["a"] * 4
    with pytest.raises(ValueError, match="at least 1"):
        timed_rounds({"a": lambda: None}, rounds=0, runs=1)


def test_a_slower_call_reads_slower() -> None:
    slow = p50_ms(lambda: time.sleep(0.004), runs=3, warmup=0)
    fast = p50_ms(lambda: None, runs=3, warmup=0)
    assert slow >= 4.0 > fast


def test_ratios_are_taken_within_a_round() -> None:
    # The host slowed both in round 1: the ratio holds where the raw times doubled.
    p50s = {"pte": [1.0, 2.0, 1.1], "eager": [2.0, 4.0, 2.0]}
    assert ratio(p50s, "pte", "eager") == {"median": 0.5, "min": 0.5, "max": 0.55}
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    s = summary({"8a8w": [1.0, 1.0], "fp32": [2.0, 2.0], "eager": [4.0, 4.0]}, "eager",
                pairs=[("8a8w", "fp32")])
    assert s["rounds"] == 2
    assert set(s["vs"]) == {"8a8w / eager", "fp32 / eager", "8a8w / fp32"}
    assert s["vs"]["8a8w / fp32"]["median"] == 0.5
