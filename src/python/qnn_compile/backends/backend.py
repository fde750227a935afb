"""What the compile stage does differently per backend (`CompileBackend`): the one type every
backend module provides, apart from the lookup of those modules (`qnn_compile.backends`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from qnn_common.config import CompileConfig
from qnn_compile.backends.lowering import BackendLowering


class LoweringProvider(Protocol):
    """A backend's lowering for `config`'s target and recipe."""

    def __call__(self, config: CompileConfig) -> BackendLowering: ...


def _no_tools() -> Mapping[str, str]:
    # The Python stack (torch, executorch) is covered by the code version already.
    return {}


def _nothing_to_check() -> None:
    # Kernels linked into ExecuTorch's runtime need nothing from the host.
    return None


@dataclass(frozen=True)
class CompileBackend:
    """One backend's part of compilation.

    `lowering` builds what ExecuTorch needs to lower (`BackendLowering`). `toolchain_digests`
    names the tools outside the Python stack that shape the program's bytes (a cache key and
    the sealed manifest cover them). `preflight` checks, before any stage runs, what the host
    must have for this backend, raising an error that says what is missing and what to do.
    """

    lowering: LoweringProvider
    toolchain_digests: Callable[[], Mapping[str, str]] = _no_tools
    preflight: Callable[[], None] = _nothing_to_check
