"""Regenerate the docs' benchmark tables from the JSON the benches wrote.

Run: `./pants run bench/docs_tables.py` (rewrites docs/*.md in place; `--check` only says which
table is stale and exits 1).

A table in the docs sits between two markers naming its JSON (relative to the repository root):

    <!-- bench-table docs/bench/pipeline-qnn.json -->
    | model | ... |
    <!-- /bench-table -->

and is `tables.render` of that JSON. To update one: rerun the bench with `--json
docs/bench/<name>.json`, then run this.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tables import render

BLOCK = re.compile(
    r"(?P<open><!-- bench-table (?P<source>\S+) -->\n)(?P<table>.*?)"
    r"(?P<close><!-- /bench-table -->)",
    re.DOTALL,
)


def regenerate(text: str, root: Path) -> str:
    """`text` with every marked table replaced by the rendering of its JSON."""

    def replace(match: re.Match[str]) -> str:
        source = root / match["source"]
        if not source.is_file():
            raise FileNotFoundError(
                f"{match['source']}: named by a bench-table marker but missing; rerun its bench "
                "with --json to that path"
            )
        table = render(json.loads(source.read_text(encoding="utf-8")))
        return f"{match['open']}{table}\n{match['close']}"

    return BLOCK.sub(replace, text)


def stale(docs: list[Path], root: Path) -> list[Path]:
    """The docs whose marked tables differ from their JSON's rendering."""
    return [d for d in docs if regenerate(d.read_text(encoding="utf-8"), root) != d.read_text(
        encoding="utf-8")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path.cwd(),
                        help="the repository root (default: the current directory)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a table is stale")
    args = parser.parse_args()
    docs = sorted((args.root / "docs").glob("*.md"))
    if not docs:
        parser.error(f"no docs/*.md under {args.root}: run from the repository root or pass --root")
    out_of_date = stale(docs, args.root)
    if args.check:
        for doc in out_of_date:
            print(f"{doc}: a bench table differs from its JSON; run bench/docs_tables.py")
        return 1 if out_of_date else 0
    for doc in out_of_date:
        doc.write_text(regenerate(doc.read_text(encoding="utf-8"), args.root), encoding="utf-8")
        print(f"updated {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
