"""What every stage config's validation shares: integer bounds, regex lists, enum coercion, the
SoC lookup, and the limits past which a setting is a typo rather than a wish."""

from __future__ import annotations

import re

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Backend, Recipe, parse_enum
from qnn_common.soc import Soc, lookup_soc

# Upper bounds on work and disk a config may ask for: past these, a typo (--runs 10**9) would run
# for days or fill a disk (every calibration / eval sample is stored in the prepare artifact).
MAX_SEQ_LEN = 8192
MAX_CALIBRATION_SAMPLES = 1024
MAX_EVAL_SAMPLES = 256
MAX_WARMUP = 1000
MAX_RUNS = 100_000


def positive(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigValidationError(name, value, f"must be an integer >= {minimum}")


def regex_list(name: str, value: object) -> tuple[str, ...] | None:
    """`value` (None, or a list of regular expressions) as a tuple, each pattern compiled once."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple) or not all(
        isinstance(p, str) for p in value
    ):
        raise ConfigValidationError(name, value, "must be a list of regexes")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigValidationError(
                name, pattern, f"not a regular expression: {err}"
            ) from None
    return tuple(value)


def bounded(name: str, value: int, minimum: int, maximum: int, why: str) -> None:
    """An integer in minimum..maximum; `why` says what the upper bound protects, for the message."""
    positive(name, value, minimum)
    if value > maximum:
        raise ConfigValidationError(name, value, f"must be at most {maximum:,}: {why}")


def normalize_enums(config: object, section: str) -> None:
    """Accept "qnn" for Backend.QNN (and so on) from Python callers; reject anything else."""
    for name, kind in (("backend", Backend), ("recipe", Recipe)):
        value = getattr(config, name)
        if not isinstance(value, kind):
            object.__setattr__(config, name, parse_enum(kind, str(value), f"{section}.{name}"))


def soc_or_none(name: str | None, path: str) -> Soc | None:
    return None if name is None else lookup_soc(name, path)

