"""The partitions a backend preprocesses share their weights with the program instead of copying
them.

Before any backend preprocesses, ExecuTorch deep-copies every partition of every method, all at
once (`BackendDetails.copy_exported_program_for_preprocess`, "in case backends change graph
inside preprocess"): the graph, its metadata and every weight. For a decoder that is one more
copy of all its weights alive while the backend builds its delegates, at the compile's peak.
Neither QNN's nor XNNPACK's preprocess writes into a tensor: their passes rewrite the graph and
put any new constant (a fused batch norm's weights, a transposed kernel) in the copy's own
tables. So the copy here is deep for the graph and the tables and shares the tensors. Checked by
`tests/qnn/qnn_shared_weights_test.py` (the program's constants unchanged after a lowering, the
outputs those of the stock copy) and `shared_constants_test.py` (XNNPACK: the same .pte bytes).
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


def _qnn() -> list[Replacement]:
    from executorch.backends.qualcomm.qnn_preprocess import QnnBackend

    return [(QnnBackend, "copy_exported_program_for_preprocess",
             classmethod(_copy_for_preprocess))]


def _xnnpack() -> list[Replacement]:
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    return [(XnnpackBackend, "copy_exported_program_for_preprocess",
             classmethod(_copy_for_preprocess))]


def _replacements() -> list[Replacement]:
    """Every replacement this module makes (`upstream_patches` indexes them); each backend's
    lowering installs only its own, so an XNNPACK compile never imports QNN's backend."""
    return [*_qnn(), *_xnnpack()]


_QNN, _XNNPACK = ScopedPatch(_qnn), ScopedPatch(_xnnpack)


def sharing_weights_with_qnn() -> AbstractContextManager[None]:
    """While inside, QNN preprocesses partitions that share the program's weights."""
    return _QNN.active()


def sharing_weights_with_xnnpack() -> AbstractContextManager[None]:
    """While inside, XNNPACK preprocesses partitions that share the program's weights."""
    return _XNNPACK.active()
