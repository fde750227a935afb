from __future__ import annotations

from tune_bench import summary


def test_the_record_names_the_winner_and_the_cost() -> None:
    front = {"plan": {"cheap": "16a4w", "rich": "16a8w", "order": ["a", "b", "c"]},
             "tokens": 1024, "sensitivity_seconds": 3.1, "winner": 1, "program_bytes": None,
             "candidates": [{"promoted": 0, "kl": 0.02}, {"promoted": 1, "kl": 0.006}]}
    record = summary(front, 57.04, 812.34, ["--model", "m"])
    assert record["winner"] == {"promoted": 1, "kl": 0.006}
    assert (record["groups"], record["verified"], record["wall_s"], record["peak_rss_mb"]) == (
        3, 2, 57.0, 812.3)
    assert summary({**front, "winner": None}, 1.0, 1.0, [])["winner"] is None
