"""eval_peer's table: every row's figures as lm_metrics writes them, rendered from the JSON."""

from __future__ import annotations

from tables import render


def _figures(kl: float, top: float, ratio: tuple[float, float, float]) -> dict[str, object]:
    return {
        "kl_divergence": {"mean": kl, "p99": kl * 5},
        "same_top_percent": top, "flips": 10, "near_tie_flips": 4,
        "perplexity": {"value": 61.5, "low": 50.0, "high": 70.0},
        "perplexity_ratio": dict(zip(("value", "low", "high"), ratio, strict=True)),
    }


def test_the_table_has_a_row_per_model_with_its_interval() -> None:
    result = {
        "bench": "eval_peer", "reference": "8da4w", "tokens": 4096, "windows": 9, "window": 512,
        "rows": [
            {"model": "8da4w: program", "seconds": 15.0,
             "figures": _figures(0.0188, 90.8, (1.010, 1.004, 1.016))},
            {"model": "llama.cpp Q4_1", "seconds": 117.0,
             "figures": _figures(0.0032, 96.4, (1.006, 1.002, 1.009))},
        ],
    }
    table = render(result).splitlines()
    assert len(table) == 2 + 2 and len({line.count("|") for line in table}) == 1
    # Where fp32 decided, from the counts (a record without the figure): 4,090 of 4,096.
    assert table[2] == ("| 8da4w: program | 4096 | 0.0188 | 0.094 | 90.8 | 99.9 | 10 (4) | "
                        "61.500 | +1.0 % [+0.4 %, +1.6 %] | 15 |")
    assert table[3].startswith("| llama.cpp Q4_1 | 4096 | 0.0032 | 0.016 | 96.4 |")
