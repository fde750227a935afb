"""One module per backend, each turning a `CompileConfig` into what ExecuTorch needs to lower.

A backend's `lowering(config)` returns a `BackendLowering`: ExecuTorch's own `LoweringRecipe`
(partitioners, edge transform passes, edge compile config) plus what the recipe type does not hold:
ATen-level passes run before edge conversion, the `ExecutorchBackendConfig` for serialization, a
context the lowering must run inside, and the tool versions to record. `lower.py` drives any of
them the same way. Modelled on executorch's `backends/qualcomm/recipes/qnn_recipe_provider.py`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torch.export import ExportedProgram

from qnn_common.config import CompileConfig
from qnn_common.errors import BackendNotAvailableError
from qnn_common.recipes import Backend
from qnn_common.target import Target
from qnn_compile.context_cache import ContextRecord


def _no_context() -> AbstractContextManager[None]:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class BackendLowering:
    """Everything one backend contributes to `to_edge_transform_and_lower` and `to_executorch`.

    `target` is what it lowers for; `recipe` is an `executorch.export.LoweringRecipe`;
    `aten_passes` run on the exported program before edge conversion; `executorch_config` is an
    `ExecutorchBackendConfig` (None: defaults); `context` wraps the whole lowering; `tools` are
    extra versions for the manifest and `record` what the manifest says about the target and
    toolchain.
    """

    target: Target
    recipe: Any
    aten_passes: tuple[Callable[[ExportedProgram], ExportedProgram], ...] = ()
    executorch_config: Any = None
    context: Callable[[], AbstractContextManager[None]] = _no_context
    tools: Mapping[str, str] = field(default_factory=dict)
    record: Mapping[str, Any] = field(default_factory=dict)
    # An accelerator that should take the whole graph: ops left outside are worth a warning
    # (each one is a round trip to the CPU). XNNPACK leaves some ops out by design.
    expect_full_delegation: bool = False
    # Ops the lowering itself leaves outside (op_name form, e.g. "llama.fallback.default"): not
    # warned about, even with expect_full_delegation.
    outside_by_design: frozenset[str] = frozenset()
    # A backend whose payloads are worth keeping across compiles (QNN: its context binaries):
    # given a cache directory, a context inside which payloads built before are reused and new
    # ones stored; it yields the record of each payload (qnn_compile.context_cache).
    payload_cache: Callable[[Path], AbstractContextManager[list[ContextRecord]]] | None = None


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
