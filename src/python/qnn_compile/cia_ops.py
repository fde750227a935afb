"""torch's preservable CompositeImplicitAutograd (CIA) ops, materialized once per query.

Every `ExportedProgram.run_decompositions` (torch 2.11 `export/exported_program.py`), and each
decomposition table ExecuTorch builds for a partitioner (`export/decomp_utils.py`), asks
`torch._export.utils._collect_all_valid_cia_ops()` which CIA ops may be kept whole. That walks
every op namespace in `torch.ops` (some forty once ExecuTorch's and torchao's libraries are
loaded), and for each one `_collect_all_valid_cia_ops_for_namespace` first calls
`_materialize_cpp_cia_ops()`, which asks the C++ dispatcher for the CIA registrations of *every*
namespace and touches each through `torch.ops`. One query materializes the same few hundred ops
once per namespace; a lowering asks several times. On small programs (the op suite's) that
repetition is the larger part of `to_edge_transform_and_lower`.

Upstream does not cache the set, for a reason that stands: the custom-op API can add
registrations at any time. So nothing is cached here either: inside `materializing_once()`
each query still materializes, at its start, and the namespace walk that follows in the same
thread skips the repeats. Materializing is idempotent (attribute lookups that populate
`torch.ops`), so the query returns the same set, and a lowering the same bytes
(`cia_ops_test.py`). Reference-counted and installed only while a lowering runs, like
`qnn_compile.partition_merge`.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from qnn_compile.scoped_patch import Replacement, ScopedPatch

_MATERIALIZE = "_materialize_cpp_cia_ops"
_COLLECT = "_collect_all_valid_cia_ops"


class _Walk(threading.local):
    """Whether this thread is inside a query that has already materialized."""

    materialized = False


_WALK = _Walk()


def _materialize_cpp_cia_ops() -> None:
    if not _WALK.materialized:
        _PATCH.original(_MATERIALIZE)()


def _collect_all_valid_cia_ops() -> Any:
    _PATCH.original(_MATERIALIZE)()
    outer = _WALK.materialized
    _WALK.materialized = True
    try:
        return _PATCH.original(_COLLECT)()
    finally:
        _WALK.materialized = outer


def _replacements() -> list[Replacement]:
    from torch._export import utils
    from torch.export import decomp_utils, exported_program

    # The two modules that call the query import it by name: each has its own reference.
    return [
        (utils, _MATERIALIZE, _materialize_cpp_cia_ops),
        (utils, _COLLECT, _collect_all_valid_cia_ops),
        (exported_program, _COLLECT, _collect_all_valid_cia_ops),
        (decomp_utils, _COLLECT, _collect_all_valid_cia_ops),
    ]


_PATCH = ScopedPatch(_replacements)


def materializing_once() -> AbstractContextManager[None]:
    """While inside, a query for the preservable CIA ops materializes them once, not once per
    op namespace."""
    return _PATCH.active()
