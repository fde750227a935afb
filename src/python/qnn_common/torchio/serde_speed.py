"""Loading a .pt2 without recomputing the same type hints ten thousand times.

torch.export.load turns the archive's JSON into torch's serde schema dataclasses in
`torch._export.serde.serialize._dict_to_dataclass`, which calls `typing.get_type_hints(cls,
globalns=vars(schema))` for every object it builds: 10,369 calls for MiniLM's 8a8w program, half
of the load under cProfile (torch 2.11). The schema classes never change while a process runs,
so their hints are computed once per class here and shared; any other call goes to
`typing.get_type_hints` unchanged. Callers only read the returned dict. Measured without the
profiler, 12 alternating loads of that 71 MB program on a quiet machine: median 0.63 s -> 0.49 s.

`install()` points the serde module's `typing` name at a stand-in module that carries the cached
function and forwards every other attribute to `typing`; nothing else in the process sees a
difference.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

_installed = False


class _TypingWithCachedHints(types.ModuleType):
    """`typing`, except `get_type_hints` on the serde schema's classes is computed once."""

    def __init__(self, schema_namespace: dict[str, Any]) -> None:
        super().__init__("typing")
        self._schema_namespace = schema_namespace

        @functools.cache
        def schema_hints(cls: type) -> dict[str, Any]:
            return typing.get_type_hints(cls, globalns=schema_namespace)

        self._schema_hints = schema_hints

    def get_type_hints(self, obj: Any, globalns: Any = None, localns: Any = None,
                       include_extras: bool = False) -> dict[str, Any]:
        if globalns is self._schema_namespace and localns is None and not include_extras:
            return self._schema_hints(obj)
        return typing.get_type_hints(obj, globalns, localns, include_extras)

    def __getattr__(self, name: str) -> Any:
        return getattr(typing, name)


def install() -> None:
    """Cache the serde schema's type hints for torch.export.load (idempotent)."""
    global _installed
    if _installed:
        return
    from torch._export.serde import schema, serialize

    # Through vars(): `typing` is a name serialize imported, not one it exports.
    namespace = vars(serialize)
    if namespace.get("typing") is typing:  # the layout this was measured on
        namespace["typing"] = _TypingWithCachedHints(vars(schema))
    _installed = True
