"""decoder_coverage: survey results merged into one table, with upstream's decoders as rows."""

from __future__ import annotations

from typing import Any

from decoder_coverage import UPSTREAM, coverage
from decoder_survey import ARCHITECTURES
from tables import render


def _survey(backend: str, recipe: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"bench": "decoder_survey", "settings": {"backend": backend, "recipe": recipe},
            "rows": rows, "date": "2026-12-07"}


def test_every_upstream_decoder_is_an_architecture_the_survey_builds() -> None:
    assert set(UPSTREAM.values()) <= set(ARCHITECTURES)


def test_surveys_merge_by_architecture_and_render() -> None:
    runs = {"architecture": "llama", "status": "generates", "kl_mean": 0.00012}
    refused = {"architecture": "gpt2", "status": "refused", "reason": "no | rotary"}
    result = coverage([
        _survey("xnnpack", "8a8w", [runs, {**refused, "architecture": "gemma"}]),
        _survey("qnn", "16a8w", [runs, refused]),
    ])
    assert result["columns"] == ["xnnpack 8a8w", "qnn 16a8w"]
    assert [r["architecture"] for r in result["rows"]] == ["llama", "gemma", "gpt2"]
    lines = render(result).splitlines()
    assert lines[0] == "| architecture | upstream's decoders | xnnpack 8a8w | qnn 16a8w |"
    assert lines[2] == ("| llama | Llama 3.2 (1B, 3B), SmolLM 2 | runs (KL 0.0001) | "
                        "runs (KL 0.0001) |")
    assert lines[3] == "| gemma | Gemma | refused: no / rotary | not surveyed |"
    assert lines[4] == "| gpt2 |  | not surveyed | refused: no / rotary |"
    assert len(lines) == 2 + len(result["rows"])
