"""The operator catalogue: every case, by family, in one tuple; names are unique."""

from __future__ import annotations

import dataclasses

from qnn_testing.cases import (
    activations,
    arithmetic,
    conv,
    indexing,
    linalg,
    misc,
    norms,
    pooling,
    reductions,
    shape,
)
from qnn_testing.cases.base import SEED, OpCase
from qnn_testing.cases.delegation import delegation_rules

_CASES: tuple[OpCase, ...] = (
    *arithmetic.CASES,
    *activations.CASES,
    *conv.CASES,
    *pooling.CASES,
    *norms.CASES,
    *linalg.CASES,
    *reductions.CASES,
    *indexing.CASES,
    *shape.CASES,
    *misc.CASES,
)
# Each case with its measured partial-delegation rules (cases.delegation) after its own rules.
CATALOGUE: tuple[OpCase, ...] = tuple(
    dataclasses.replace(c, rules=(*c.rules, *delegation_rules(c.name))) for c in _CASES
)
BY_NAME: dict[str, OpCase] = {case.name: case for case in CATALOGUE}

if len(BY_NAME) != len(CATALOGUE):
    raise RuntimeError("op case names must be unique")

__all__ = ["BY_NAME", "CATALOGUE", "SEED", "OpCase"]
