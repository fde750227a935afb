"""The partitions QNN preprocesses share their weights with the program instead of copying them.

Before any backend preprocesses, ExecuTorch deep-copies every partition of every method, all at
once (`BackendDetails.copy_exported_program_for_preprocess`, "in case backends change graph
inside preprocess"): the graph, its metadata and every weight. For a decoder that is one more
copy of all its weights alive while QNN builds its contexts, at the compile's peak. QNN's
preprocess passes rewrite the graph and put any new constant in the copy's own tables; none
writes into a tensor. So the copy here is deep for the graph and the tables and shares the
tensors (`tests/qnn/qnn_shared_weights_test.py` checks the program's constants are unchanged after a
lowering and the outputs are those of the stock copy).
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager
from typing import Any

import torch

from qnn_compile.scoped_patch import Replacement, ScopedPatch


def copy_sharing_weights(edge_program: torch.export.ExportedProgram) -> Any:
    """A deep copy of `edge_program` whose state dict and constants hold the same tensors."""
    tensors = [*edge_program.state_dict.values(), *edge_program.constants.values()]
    memo: dict[int, Any] = {id(t): t for t in tensors if isinstance(t, torch.Tensor)}
    return copy.deepcopy(edge_program, memo)


def _copy_for_preprocess(
    cls: type, edge_program: torch.export.ExportedProgram, compile_specs: list[Any]
) -> Any:
    return copy_sharing_weights(edge_program)


def _replacements() -> list[Replacement]:
    from executorch.backends.qualcomm.qnn_preprocess import QnnBackend

    return [(QnnBackend, "copy_exported_program_for_preprocess",
             classmethod(_copy_for_preprocess))]


_PATCH = ScopedPatch(_replacements)


def sharing_weights_with_qnn() -> AbstractContextManager[None]:
    """While inside, QNN preprocesses partitions that share the program's weights."""
    return _PATCH.active()
