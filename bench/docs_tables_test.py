"""The docs' bench tables are the rendering of the JSON beside them (issue 22: tables generated
from bench JSON, never typed by hand), and the regeneration says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from docs_tables import regenerate, stale
from tables import RENDERERS, render

ROOT = Path.cwd()  # Pants runs tests from the sandbox's root, where //:bench_docs puts docs/


def _sources() -> list[Path]:
    return sorted((ROOT / "docs" / "bench").glob("*.json"))


def test_every_docs_table_matches_its_json() -> None:
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs, "docs/*.md not in the sandbox"
    assert stale(docs, ROOT) == [], "run ./pants run bench/docs_tables.py"


def test_every_bench_json_is_shown_somewhere() -> None:
    text = "".join(d.read_text() for d in (ROOT / "docs").glob("*.md"))
    assert _sources(), "docs/bench/*.json not in the sandbox"
    for source in _sources():
        assert f"<!-- bench-table docs/bench/{source.name} -->" in text, source.name


@pytest.mark.parametrize("source", _sources(), ids=lambda p: p.name)
def test_each_row_has_the_header_s_columns(source: Path) -> None:
    result = json.loads(source.read_text())
    # A rendering is one table a row each, or that and more tables after blank lines (the
    # pipeline bench's latency rounds); each table's lines have its header's columns.
    first, *more = (t.splitlines() for t in render(result).split("\n\n"))
    assert len(first) == 2 + len(result["rows"])
    for lines in (first, *more):
        assert len(lines) >= 3 and set(lines[1]) <= {"|", "-", ":"}, lines
        widths = {line.count("|") for line in lines}
        assert len(widths) == 1, lines


def test_a_hand_edited_table_is_stale_and_regenerated(tmp_path: Path) -> None:
    source = _sources()[0]
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    (tmp_path / "docs" / "bench" / source.name).write_bytes(source.read_bytes())
    doc = tmp_path / "docs" / "page.md"
    marker = f"<!-- bench-table docs/bench/{source.name} -->"
    doc.write_text(f"# Page\n\n{marker}\n| typed | by hand |\n<!-- /bench-table -->\n\nafter\n")
    assert stale([doc], tmp_path) == [doc]
    fresh = regenerate(doc.read_text(), tmp_path)
    assert render(json.loads(source.read_text())) in fresh
    assert "typed" not in fresh and fresh.endswith("\n\nafter\n") and marker in fresh
    doc.write_text(fresh)
    assert stale([doc], tmp_path) == []


def test_a_missing_json_and_an_unknown_bench_say_what_to_do(tmp_path: Path) -> None:
    text = "<!-- bench-table docs/bench/nope.json -->\n<!-- /bench-table -->\n"
    with pytest.raises(FileNotFoundError, match="rerun its bench with --json"):
        regenerate(text, tmp_path)
    with pytest.raises(ValueError, match="known: " + ", ".join(sorted(RENDERERS))):
        render({"bench": "nope", "rows": []})
