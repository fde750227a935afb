"""Cutting a program into its delegate partitions without regenerating its code per partition.

ExecuTorch's `_create_partitions_in_graph_module` (1.5.1 `exir/backend/backend_api.py`) moves
each partition's nodes into a submodule with `create_submodule_from_nodes`, which ends in
`legalize_graph(gm)`: a topological re-sort that assigns `gm.graph`, and the `graph` setter
calls `gm.recompile()`, Python code generation and `compile()` of the whole program's forward.
With P partitions of a program of N nodes that is P code generations of N nodes each, both
growing with a decoder's depth: quadratic, and the larger part of cutting a deep decoder.

Nothing reads the top-level module's generated code while it is being cut: the partitions are
found by tags on the graph's nodes, moved by graph edits, and each submodule is recompiled by
its own graph setter. So inside `recompiling_once()` the module being cut has its `recompile`
shadowed by a no-op for the length of that call, and recompiles once when it returns: the same
graph, hence the same code as the stock path's last recompile, and the same .pte
(`tests/llm/fast_partitioning_test.py`). Reference-counted and installed only while a lowering
runs, like `qnn_compile.partition_merge`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch.fx

from qnn_compile.scoped_patch import Replacement, ScopedPatch


def _no_recompile() -> None:
    """What `recompile` does on the module being cut, until the cut is over."""


def _create_partitions_in_graph_module(
    tagged_graph_module: torch.fx.GraphModule, *args: Any, **kwargs: Any
) -> Any:
    gm = tagged_graph_module
    # An instance attribute shadows GraphModule.recompile for this module only (its
    # submodules keep theirs); the graph setter calls self.recompile().
    object.__setattr__(gm, "recompile", _no_recompile)
    try:
        return _PATCH.original("_create_partitions_in_graph_module")(gm, *args, **kwargs)
    finally:
        object.__delattr__(gm, "recompile")
        gm.recompile()


def _replacements() -> list[Replacement]:
    from executorch.exir.backend import backend_api

    return [(backend_api, "_create_partitions_in_graph_module", _create_partitions_in_graph_module)]


_PATCH = ScopedPatch(_replacements)


def recompiling_once() -> AbstractContextManager[None]:
    """While inside, a program cut into partitions regenerates its code once, not per cut."""
    return _PATCH.active()
