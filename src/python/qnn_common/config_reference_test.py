"""docs/configuration.md is what the config dataclasses render to."""

from __future__ import annotations

from pathlib import Path

from qnn_common.config import CompileConfig, InferConfig, PrepareConfig, QuantizeConfig
from qnn_common.config_reference import field_notes, render

DOC = Path("docs/configuration.md")


def test_the_committed_page_is_what_the_dataclasses_render() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: ./pants run src/python/qnn_common/config_reference.py "
        "-- docs/configuration.md"
    )


def test_every_key_a_user_sets_is_on_the_page_with_a_note() -> None:
    page = render()
    for cls in (PrepareConfig, QuantizeConfig, CompileConfig, InferConfig):
        notes = field_notes(cls)
        for name in ("num_shards", "kv_cache", "group_size", "runs", "seq_len"):
            if name in notes:
                assert f"| `{name}` |" in page and notes[name], (cls.__name__, name)
    assert "| `model` |" not in page  # set by [pipeline], not by a stage table
