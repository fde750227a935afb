"""What a backend contributes to the lowering (`BackendLowering`): the one type every backend
module returns, apart from the lookup of those modules (`qnn_compile.backends`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.export import ExportedProgram

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
