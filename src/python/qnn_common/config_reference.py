"""docs/configuration.md, generated from the stage config dataclasses: every TOML key of every
table, its type, its default, and the comment written above the field in `qnn_common/config/`.

    ./pants run src/python/qnn_common/config_reference.py -- docs/configuration.md

`config_reference_test.py` fails when the committed file is not what this renders, so a field
added, renamed or re-defaulted without regenerating the page does not go unnoticed.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from qnn_common.config import CompileConfig, InferConfig, PrepareConfig, QuantizeConfig

TABLES: tuple[tuple[str, type[Any]], ...] = (
    ("prepare", PrepareConfig),
    ("quantize", QuantizeConfig),
    ("compile", CompileConfig),
    ("infer", InferConfig),
)
_FIELD = re.compile(r"^    (\w+):")
_COMMENT = re.compile(r"^    # ?(.*)$")
# Keys the pipeline fills in itself: a [<table>] entry for them is refused or overridden.
_SET_BY_PIPELINE = {"prepare": {"model"}, "quantize": {"backend", "recipe", "soc"},
                    "compile": {"backend", "recipe", "soc"}}


def field_notes(cls: type[Any]) -> dict[str, str]:
    """Field name -> the comment block right above its line in the class body (trailing comments
    and docstrings are not read), joined into one line."""
    notes: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        comment, declared = _COMMENT.match(line), _FIELD.match(line)
        if comment:
            pending.append(comment.group(1).strip())
        elif declared:
            notes[declared.group(1)] = " ".join(pending)
            pending = []
        else:
            pending = []
    return notes


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    return "`" + (repr(value) if not isinstance(value, bool) else str(value).lower()) + "`"


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the config dataclasses in `src/python/qnn_common/config/` by",
        "`./pants run src/python/qnn_common/config_reference.py -- docs/configuration.md`; do not",
        "edit by hand. Each table of a pipeline TOML file (`--config`) takes these keys; flags",
        "override them. The `[pipeline]` table and a commented example are in",
        "[stages.md](stages.md#configuration).",
    ]
    for table, cls in TABLES:
        notes = field_notes(cls)
        lines += ["", f"## [{table}]", "", (inspect.getdoc(cls) or "").split("\n")[0], "",
                  "| key | type | default | what |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            if f.name in _SET_BY_PIPELINE.get(table, ()):
                continue
            note = notes.get(f.name, "").replace("|", "\\|")
            kind = str(f.type).replace("|", "\\|")
            lines.append(f"| `{f.name}` | `{kind}` | {_default(f)} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: config_reference.py OUT.md", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
