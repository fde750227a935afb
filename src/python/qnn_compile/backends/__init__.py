"""One module per backend, each turning a `CompileConfig` into what ExecuTorch needs to lower.

A backend's `lowering(config)` returns a `BackendLowering`: ExecuTorch's own `LoweringRecipe`
(partitioners, edge transform passes, edge compile config) plus what the recipe type does not hold:
ATen-level passes run before edge conversion, the `ExecutorchBackendConfig` for serialization, a
context the lowering must run inside, and the tool versions to record. `lower.py` drives any of
them the same way. Modelled on executorch's `backends/qualcomm/recipes/qnn_recipe_provider.py`.
"""

from __future__ import annotations

from typing import Protocol

from qnn_common.config import CompileConfig
from qnn_common.errors import BackendNotAvailableError
from qnn_common.recipes import Backend
from qnn_compile.backends.lowering import BackendLowering


class LoweringProvider(Protocol):
    """A backend module's entry point."""

    def __call__(self, config: CompileConfig) -> BackendLowering: ...


def _provider(backend: Backend) -> LoweringProvider:
    # Imported lazily: a backend's module pulls in its ExecuTorch backend (QNN: an SDK check).
    # Returned as a LoweringProvider, so mypy checks each module's entry point against it.
    if backend is Backend.XNNPACK:
        from qnn_compile.backends import xnnpack

        return xnnpack.lowering
    if backend is Backend.PORTABLE:
        from qnn_compile.backends import portable

        return portable.lowering
    if backend is Backend.QNN:
        from qnn_compile.backends import qnn

        return qnn.lowering
    raise BackendNotAvailableError(f"no lowering for backend {backend!r}")


def lowering_for(config: CompileConfig) -> BackendLowering:
    """The lowering of `config.backend`, for `config`'s target and recipe."""
    return _provider(config.backend)(config)
