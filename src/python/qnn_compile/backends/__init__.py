"""One module per backend, each providing its `CompileBackend` (`backend.py`): the lowering of a
`CompileConfig` into what ExecuTorch needs, the toolchain digests, and the host's preflight.

A backend's `lowering(config)` returns a `BackendLowering`: ExecuTorch's own `LoweringRecipe`
(partitioners, edge transform passes, edge compile config) plus what the recipe type does not hold:
ATen-level passes run before edge conversion, the `ExecutorchBackendConfig` for serialization, a
context the lowering must run inside, and the tool versions to record. `lower.py` drives any of
them the same way. Modelled on executorch's `backends/qualcomm/recipes/qnn_recipe_provider.py`.
A new backend's module is registered in `_LOADERS` below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from qnn_common.config import CompileConfig
from qnn_common.errors import BackendNotAvailableError
from qnn_common.recipes import Backend
from qnn_compile.backends.backend import CompileBackend, LoweringProvider
from qnn_compile.backends.lowering import BackendLowering

# Each module is imported on first use: a backend's module pulls in its ExecuTorch backend.


def _xnnpack() -> CompileBackend:
    from qnn_compile.backends import xnnpack

    return xnnpack.BACKEND


def _portable() -> CompileBackend:
    from qnn_compile.backends import portable

    return portable.BACKEND


def _qnn() -> CompileBackend:
    from qnn_compile.backends import qnn

    return qnn.BACKEND


_LOADERS: dict[Backend, Callable[[], CompileBackend]] = {
    Backend.XNNPACK: _xnnpack,
    Backend.PORTABLE: _portable,
    Backend.QNN: _qnn,
}


def compile_backend(backend: Backend) -> CompileBackend:
    """What compilation does for `backend`."""
    load = _LOADERS.get(backend)
    if load is None:
        raise BackendNotAvailableError(f"no lowering for backend {backend!r}")
    return load()


def lowering_for(config: CompileConfig) -> BackendLowering:
    """The lowering of `config.backend`, for `config`'s target and recipe."""
    return compile_backend(config.backend).lowering(config)


def toolchain_digests(backend: Backend) -> Mapping[str, str]:
    """Tools outside the Python stack that shape `backend`'s programs (for QNN, the SDK)."""
    return compile_backend(backend).toolchain_digests()


def preflight(backend: Backend) -> None:
    """Check what the host needs for `backend` before any stage runs; raise saying what to do."""
    compile_backend(backend).preflight()


__all__ = [
    "BackendLowering",
    "CompileBackend",
    "LoweringProvider",
    "compile_backend",
    "lowering_for",
    "preflight",
    "toolchain_digests",
]
