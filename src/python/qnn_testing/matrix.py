"""The op suite's targets and precisions, and which (case, target, precision) cells run when.

Targets are named as the Pants test targets and coverage columns are: ``xnnpack``, ``portable``
and ``qnn-v68`` ... ``qnn-v81``, one per HTP arch, each compiled for the first SoC of that arch
in qnn_common's SoC table. Precisions are the suite's seven recipes, restricted to what the
target can run by qnn_common's recipe rules (XNNPACK: fp32 and 8a8w; fp16 and LPBQ from V69,
16a16w from V73).

Modes (environment variable `QNN_OP_SUITE`): ``default`` runs the whole catalogue once, each case
on one of xnnpack, V75 (`DEFAULT_ARCH`) and portable (`CATALOGUE_BACKENDS`, dealt in turn by the
case's place in the catalogue), as one program at a precision dealt round-robin (every precision
exercised; a cell costs CI seconds), plus a subset at every precision: on xnnpack the `smoke`
subset (fp32 and int8 are different XNNPACK kernels), on V75 the `qnn` subset; portable has none
(the reference kernels: a case's fp32 and 8a8w programs call mostly the same ones). Every other
HTP arch runs the `smoke` subset, precisions dealt the same way. ``full`` runs every cell: each
case on every target at every precision (weekly in CI: .github/workflows/op-matrix.yml).

V75's catalogue deal skips 16a4w_block for a case without a linear layer: LPBQ blocks linear
weights only, so that cell could only show the refusal and the case would never reach the HTP.
(The smoke deal keeps plain round-robin: its cells are the ones measured on every arch.)
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Backend, Recipe, recipes_for
from qnn_common.soc import SOCS, HtpArch, Soc
from qnn_common.target import Target

ENV_MODE = "QNN_OP_SUITE"
# Set per Pants test target (`extra_env_vars` in tests/op/BUILD): the targets it runs, and which
# share of the cases (`K/N`: every N-th case from the K-th; unset: all of them).
ENV_TARGETS = "QNN_OP_TARGETS"
ENV_SHARD = "QNN_OP_SHARD"

# The precisions the suite covers, in table order. 8a4w and 16a2w exist as recipes but are
# not part of the operator matrix (the list); adding one here adds a column.
PRECISIONS: tuple[Recipe, ...] = (
    Recipe.FP32,
    Recipe.FP16,
    Recipe.A8W8,
    Recipe.A16W8,
    Recipe.A16W16,
    Recipe.A16W4,
    Recipe.A16W4_BLOCK,
)

# The HTP arch whose target shares the catalogue by default (and runs the `qnn` subset at every
# precision).
DEFAULT_ARCH = HtpArch.V75

# The backends that share the catalogue in the default mode: case i runs on the (i mod 3)-th.
# Each case once per commit, on every backend weekly: the whole catalogue on each of the three
# was two thirds of the op suite's CI time (every case on every backend is `full`).
CATALOGUE_BACKENDS: tuple[Backend, ...] = (Backend.XNNPACK, Backend.QNN, Backend.PORTABLE)


class Mode(enum.StrEnum):
    """How much of the matrix to run."""

    DEFAULT = "default"
    FULL = "full"


def mode_from_env(environ: dict[str, str] | None = None) -> Mode:
    """The suite mode from `QNN_OP_SUITE` (unset: default); an unknown value is an error."""
    value = (os.environ if environ is None else environ).get(ENV_MODE, "").strip().lower()
    if not value:
        return Mode.DEFAULT
    try:
        return Mode(value)
    except ValueError:
        raise ConfigValidationError(
            ENV_MODE, value, "unknown op suite mode", allowed=tuple(m.value for m in Mode)
        ) from None


def soc_for_arch(arch: HtpArch) -> Soc:
    """The first SoC of `arch` in the SoC table (table order puts the flagship phones first)."""
    for soc in SOCS.values():
        if soc.htp_arch is arch:
            return soc
    raise LookupError(f"no SoC of arch {arch} in the SoC table")


@dataclass(frozen=True)
class OpTarget:
    """One column group of the matrix: a backend, and for QNN the HTP arch."""

    backend: Backend
    arch: HtpArch | None = None

    @property
    def name(self) -> str:
        """``xnnpack``, ``portable``, ``qnn-v75``: the Pants target and coverage column name."""
        if self.arch is None:
            return self.backend.value
        return f"{self.backend.value}-{self.arch.name.lower()}"

    @property
    def target(self) -> Target:
        """The pipeline target (with the arch's SoC for QNN)."""
        return Target(self.backend, None if self.arch is None else soc_for_arch(self.arch))

    @property
    def precisions(self) -> tuple[Recipe, ...]:
        """The suite precisions this target can run, in table order."""
        allowed = recipes_for(self.backend, self.target.soc)
        return tuple(p for p in PRECISIONS if p in allowed)

    def __str__(self) -> str:
        return self.name


TARGETS: tuple[OpTarget, ...] = (
    OpTarget(Backend.XNNPACK),
    OpTarget(Backend.PORTABLE),
    *(OpTarget(Backend.QNN, arch) for arch in HtpArch),
)
TARGETS_BY_NAME: dict[str, OpTarget] = {t.name: t for t in TARGETS}


def targets_from_env(environ: dict[str, str] | None = None) -> tuple[OpTarget, ...]:
    """The targets named in `QNN_OP_TARGETS` (comma-separated); unset: all of them."""
    value = (os.environ if environ is None else environ).get(ENV_TARGETS, "").strip()
    if not value:
        return TARGETS
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS_BY_NAME]
    if unknown:
        raise ConfigValidationError(
            ENV_TARGETS,
            ",".join(unknown),
            "unknown op suite target",
            allowed=tuple(TARGETS_BY_NAME),
        )
    return tuple(TARGETS_BY_NAME[n] for n in names)


@dataclass(frozen=True)
class Shard:
    """The `index`-th of `count` shares of the catalogue (1-based): its cases are every
    `count`-th from the `index`-th, so each share holds as many slow cases as the next, and a
    case's cells (its precisions) stay together, sharing their export."""

    index: int = 1
    count: int = 1

    def takes(self, position: int) -> bool:
        return position % self.count == self.index - 1


def shard_from_env(environ: dict[str, str] | None = None) -> Shard:
    """The shard in `QNN_OP_SHARD` (``K/N``); unset: the whole catalogue."""
    value = (os.environ if environ is None else environ).get(ENV_SHARD, "").strip()
    if not value:
        return Shard()
    index, sep, count = value.partition("/")
    if not (sep and index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise ConfigValidationError(ENV_SHARD, value, "expected K/N with 1 <= K <= N, e.g. 1/2")
    return Shard(int(index), int(count))


class Selectable(Protocol):
    """What cell selection needs to know of a case."""

    @property
    def name(self) -> str: ...

    @property
    def smoke(self) -> bool: ...

    @property
    def qnn(self) -> bool: ...

    @property
    def linear(self) -> bool: ...


@dataclass(frozen=True)
class Cell:
    """One (case, target, precision) of the matrix."""

    case: str
    target: OpTarget
    precision: Recipe

    @property
    def id(self) -> str:
        """The pytest id: ``conv2d-qnn-v75-8a8w`` (so ``-k "conv2d and 8a8w"`` selects it)."""
        return f"{self.case}-{self.target.name}-{self.precision.value}"


def _dealt(
    target: OpTarget, cases: Sequence[Selectable], *, lpbq_needs_linear: bool
) -> Iterator[Cell]:
    """One cell per case, the target's precisions dealt round-robin; with `lpbq_needs_linear`,
    16a4w_block only to cases with a linear layer (see the module docstring)."""
    precisions = target.precisions
    turn = 0
    for case in cases:
        while (
            lpbq_needs_linear
            and not case.linear
            and precisions[turn % len(precisions)] is Recipe.A16W4_BLOCK
        ):
            turn += 1
        yield Cell(case.name, target, precisions[turn % len(precisions)])
        turn += 1


def dealt_to(target: OpTarget, cases: Sequence[Selectable]) -> list[Selectable]:
    """The catalogue's cases the default mode deals to `target` (see `CATALOGUE_BACKENDS`). Each
    keeps the precision the deal over the whole catalogue gives it, so the cells that run are
    among those each backend's whole-catalogue runs measured."""
    share = CATALOGUE_BACKENDS.index(target.backend)
    return [c for i, c in enumerate(cases) if i % len(CATALOGUE_BACKENDS) == share]


def _every_precision_then_dealt(
    target: OpTarget, cases: Sequence[Selectable], subset: Callable[[Selectable], bool],
    *, lpbq_needs_linear: bool,
) -> Iterator[Cell]:
    for case in (c for c in cases if subset(c)):
        yield from (Cell(case.name, target, p) for p in target.precisions)
    mine = {c.name for c in dealt_to(target, cases)}
    rest = [c for c in cases if not subset(c)]
    yield from (cell for cell in _dealt(target, rest, lpbq_needs_linear=lpbq_needs_linear)
                if cell.case in mine)


def _xnnpack_fast(target: OpTarget, cases: Sequence[Selectable]) -> Iterator[Cell]:
    return _every_precision_then_dealt(target, cases, lambda c: c.smoke, lpbq_needs_linear=False)


def _portable_fast(target: OpTarget, cases: Sequence[Selectable]) -> Iterator[Cell]:
    return _every_precision_then_dealt(target, cases, lambda c: False, lpbq_needs_linear=False)


def _qnn_fast(target: OpTarget, cases: Sequence[Selectable]) -> Iterator[Cell]:
    if target.arch is DEFAULT_ARCH:
        return _every_precision_then_dealt(target, cases, lambda c: c.qnn, lpbq_needs_linear=True)
    return _dealt(target, [c for c in cases if c.smoke], lpbq_needs_linear=False)


# The fast mode's cells per backend (the module docstring says why each).
_FAST: dict[Backend, Callable[[OpTarget, Sequence[Selectable]], Iterator[Cell]]] = {
    Backend.XNNPACK: _xnnpack_fast,
    Backend.PORTABLE: _portable_fast,
    Backend.QNN: _qnn_fast,
}


def cells(
    cases: Sequence[Selectable], targets: Sequence[OpTarget], mode: Mode,
    shard: Shard | None = None,
) -> Iterator[Cell]:
    """The cells `mode` runs, target by target, case by case, precision by precision; with
    `shard`, those of its cases only (the precisions dealt as over the whole catalogue)."""
    if shard is not None and shard.count > 1:
        mine = {c.name for i, c in enumerate(cases) if shard.takes(i)}
        yield from (c for c in cells(cases, targets, mode) if c.case in mine)
        return
    for target in targets:
        if mode is Mode.FULL:
            for case in cases:
                yield from (Cell(case.name, target, p) for p in target.precisions)
        else:
            yield from _FAST[target.backend](target, cases)
