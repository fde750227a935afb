"""A TOML config file, read bounded: its size checked before a byte is parsed.

tomllib holds the whole text and builds every value at once, so a 40 MB file (a prompt pasted
into one) costs hundreds of megabytes before a field is checked, and aborts under a memory
limit. Configs are kilobytes: one past `MAX_TOML_BYTES` is refused unread. Every way reading
fails is one ConfigValidationError naming the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from qnn_common.errors import ConfigValidationError

MAX_TOML_BYTES = 2 << 20  # room for a 1 MiB prompt (qnn_common.llm_spec.MAX_PROMPT_BYTES)


def read_toml(path: Path) -> dict[str, Any]:
    """`path` parsed as TOML, if it is a readable UTF-8 file of at most MAX_TOML_BYTES."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_TOML_BYTES + 1)
        if len(data) > MAX_TOML_BYTES:
            raise ConfigValidationError(
                "config", str(path),
                f"is larger than {MAX_TOML_BYTES >> 20} MiB, far past any config; shorten it "
                "(a prompt in it may be at most 1 MiB)",
            )
        return tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigValidationError("config", str(path), "file not found") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigValidationError("config", str(path), f"not valid TOML: {err}") from None
    except (OSError, UnicodeDecodeError) as err:  # a directory, no permission, not UTF-8
        raise ConfigValidationError("config", str(path), f"cannot read it: {err}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigValidationError(
            "config", str(path), "is nested too deeply to be a config"
        ) from None
