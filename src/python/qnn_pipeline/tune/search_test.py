"""The search's logic on stand-in scores (the real quantizations: tests/llm/tune_test.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import Recipe
from qnn_pipeline.tune.front import pipeline_toml
from qnn_pipeline.tune.groups import LayerGroup
from qnn_pipeline.tune.scoring import Score
from qnn_pipeline.tune.search import Budget, Verify, pareto, plan, search
from qnn_pipeline.tune.sensitivity import GroupGain, Sensitivity


def _score(kl: float) -> Score:
    return Score(kl, kl * 0.9, kl * 1.1, 90.0, 1.0, 1024)


def _sensitivity(gains: dict[str, tuple[int, float]], cheap_kl: float = 1.0) -> Sensitivity:
    """Groups by name: (weights, KL gained when promoted alone)."""
    return Sensitivity(_score(cheap_kl), tuple(
        GroupGain(LayerGroup(name, f"{name}$", (name,), weights), _score(cheap_kl - gain))
        for name, (weights, gain) in gains.items()), 0.0)


GAINS = {"a": (100, 0.05), "b": (100, 0.4), "c": (400, 0.4), "d": (100, 0.1)}


def _additive(sens: Sensitivity, calls: list[tuple[str, ...]]) -> Verify:
    """A verifier whose KL is the cheap one minus the promoted groups' gains (what the pass
    predicts), recording each table it was asked for."""
    gain = {g.group.pattern: sens.gain(g) for g in sens.gains}

    def verify(table: tuple[LayerRecipe, ...]) -> tuple[Score, Path | None]:
        calls.append(tuple(e.pattern for e in table))
        return _score(sens.cheap.kl - sum(gain[e.pattern] for e in table)), None
    return verify


def test_groups_are_promoted_by_gain_per_weight() -> None:
    p = plan(_sensitivity(GAINS), Recipe.A16W4, Recipe.A16W8)
    assert [g.group.name for g in p.order] == ["b", "c", "d", "a"]
    assert p.weight_bytes(0) == 700 * 4 // 8
    assert p.weight_bytes(1) == 100 * 8 // 8 + 600 * 4 // 8
    assert p.table(2) == (LayerRecipe("b$", Recipe.A16W8), LayerRecipe("c$", Recipe.A16W8))


def test_the_fewest_promotions_within_the_kl_budget_are_found_and_verified() -> None:
    sens = _sensitivity(GAINS)
    calls: list[tuple[str, ...]] = []
    found = search(sens, Recipe.A16W4, Recipe.A16W8, Budget(max_kl=0.25), _additive(sens, calls))
    assert found.winner is not None and found.winner.promoted == 2  # 1.0 - 0.4 - 0.4
    assert found.verified[1].score.kl > 0.25  # the one before it verified to miss
    assert len(calls) == len(set(calls)) <= 4  # each candidate quantized once
    assert pareto(list(found.verified.values()))[-1].promoted == 4


def test_a_budget_nothing_meets_has_no_winner_and_a_front() -> None:
    sens = _sensitivity(GAINS)
    found = search(sens, Recipe.A16W4, Recipe.A16W8, Budget(max_kl=0.01), _additive(sens, []))
    assert found.winner is None and sorted(found.verified) == [0, 4]  # both ends of the front


def test_a_byte_budget_takes_the_richest_that_fits() -> None:
    sens = _sensitivity(GAINS)
    cap = plan(sens, Recipe.A16W4, Recipe.A16W8).weight_bytes(2)
    found = search(sens, Recipe.A16W4, Recipe.A16W8, Budget(max_weight_bytes=cap),
                   _additive(sens, []))
    assert found.winner is not None and found.winner.promoted == 2


def test_a_budget_needs_a_bound_and_a_richer_recipe() -> None:
    with pytest.raises(ConfigValidationError, match="--max-kl"):
        Budget()
    with pytest.raises(ConfigValidationError, match="no more weight bits"):
        plan(_sensitivity(GAINS), Recipe.A16W8, Recipe.A16W4)


def test_the_winners_toml_reads_back_as_written() -> None:
    table = (LayerRecipe(r"hf\.model\.layers\.1\.mlp\.[^.]+$", Recipe.A16W8),)
    text = pipeline_toml({"pipeline": {"model": "m", "recipe": Recipe.A16W4, "soc": None},
                          "quantize": {"layer_recipes": list(table), "per_channel": True}},
                         "a header\nline two")
    data = tomllib.loads(text)
    assert data["pipeline"] == {"model": "m", "recipe": "16a4w"}
    assert data["quantize"]["layer_recipes"] == [
        {"pattern": table[0].pattern, "recipe": "16a8w"}]
    assert data["quantize"]["per_channel"] is True
