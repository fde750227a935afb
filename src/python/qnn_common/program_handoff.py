"""A chained run hands each saved program to the next stage in memory instead of reloading it.

Every stage saves its programs (`.pt2`): the artifact on disk is the contract, and a stage run
alone reads it from there. In a chained run the next stage used to load the file straight back,
rebuilding an object the process still held: for MiniLM 8a8w, torch.export.load of the 91 MB
fp32 and the 60 MB quantized program, 0.8-1.2 s of a ~27 s run (timed around load_program).

Inside `handing_over()` (the orchestrator wraps a run in it), `offer` keeps each program that
`tensorio.save_program` writes, with the file's identity and the sha256 of the bytes written; the
first `take` of that file returns the program if the file is still the one written: same inode,
size, mtime and ctime (what `qnn_common.hashing` trusts), and its content's sha256 (memoized: the
stage's manifest check has just hashed it) equal to the bytes saved. A replaced, edited or unknown
file gets None, and the caller loads it from disk as before. A program is taken once: the taker
owns it and may change it (lowering does), so it is never handed out twice.

Programs saved from one model share its tensors: a causal LM's prefill and decode methods hold
the same weights and KV-cache buffers, which calibrating one of them mutates. Loaded from their
files they are independent, so a program that shares a tensor with another one offered in the
run is never handed over; both are loaded from disk (measured: otherwise the quantized decode
program's saved KV cache differed from a standalone run's).

The state is per context (a ContextVar): pipelines in other threads, and stages run alone, never
see it. Quantizing and compiling a chained run's files alone, each a fresh load, give the same
bytes as the chained run (`tests/reliability/artifacts_test.py`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from qnn_common.hashing import FileState, file_state, sha256_file


@dataclass(frozen=True)
class _Offer:
    state: FileState
    sha256: str
    program: torch.export.ExportedProgram | None  # None: shares state, never handed over
    storages: frozenset[int]


# (device, inode) -> offer: a file's identity survives the staging directory's rename on seal.
_offers: contextvars.ContextVar[dict[tuple[int, int], _Offer] | None] = contextvars.ContextVar(
    "program_offers", default=None
)


@contextlib.contextmanager
def handing_over() -> Iterator[None]:
    """Within this block, programs saved are handed to the next load of their file."""
    token = _offers.set({})
    try:
        yield
    finally:
        _offers.reset(token)


def offer(path: Path, program: torch.export.ExportedProgram, data: bytes) -> None:
    """Keep `program`, just saved to `path` as `data`, for the next `take` (no-op outside
    `handing_over`)."""
    offers = _offers.get()
    if offers is None:
        return
    storages = _storages(program)
    shared = [key for key, other in offers.items() if other.storages & storages]
    for key in shared:  # and that program, saved before, shares its tensors with this one
        offers[key] = dataclasses.replace(offers[key], program=None)
    st = os.stat(path)
    offers[(st.st_dev, st.st_ino)] = _Offer(
        file_state(st), hashlib.sha256(data).hexdigest(), None if shared else program, storages
    )


def _storages(program: torch.export.ExportedProgram) -> frozenset[int]:
    """Where the program's weights, buffers and constants live in memory."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    return frozenset(
        t.untyped_storage().data_ptr() for t in tensors
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() != 0
    )


def take(path: Path) -> torch.export.ExportedProgram | None:
    """The program saved to `path` in this run, if the file is still exactly what was saved;
    else None (load it from disk)."""
    offers = _offers.get()
    if not offers:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    entry = offers.pop((st.st_dev, st.st_ino), None)
    if entry is None or entry.program is None or entry.state != file_state(st):
        return None
    if sha256_file(path) != entry.sha256:
        return None
    return entry.program


def discard() -> None:
    """Drop every program not taken (a stage was cached: its input will not be loaded)."""
    offers = _offers.get()
    if offers is not None:
        offers.clear()
