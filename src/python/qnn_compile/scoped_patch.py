"""Upstream attributes replaced by ours while any lowering runs, nestable and thread-safe.

Each speed-up of lowering (`provenance`, `partition_merge`, `partition_recompile`) swaps a few
attributes of a torch / ExecuTorch class or module for its own while `lower_program` runs. The
attributes are process-wide, so the swap is reference-counted: installed when the first lowering
starts, put back when the last one ends, even on error; outside a lowering the stock code runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# (owner, attribute name, replacement)
Replacement = tuple[object, str, object]
_MISSING = object()


class ScopedPatch:
    """Replacements (resolved on first use: they import upstream modules) held while any
    `active()` block is open."""

    def __init__(self, replacements: Callable[[], Sequence[Replacement]]) -> None:
        self._replacements = replacements
        self._lock = threading.Lock()
        self._active = 0
        # (owner, attribute name, the owner's own entry before), in installation order.
        self._saved: list[tuple[object, str, object]] = []
        # Attribute name -> the attribute as looked up on its first owner, before the patch.
        self._originals: dict[str, Any] = {}

    def original(self, name: str) -> Any:
        """The attribute `name` as it was looked up before the patch (only while active). Where
        several owners' `name` are replaced (a function and the modules that imported it), the
        first owner's."""
        return self._originals[name]

    def installed(self) -> bool:
        """Whether any replacement is in place now."""
        with self._lock:
            return bool(self._saved)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with self._lock:
            if self._active == 0:
                for owner, name, new in self._replacements():
                    # vars(): the owner's own entry (a plain function for a method), so that
                    # setting it back restores the class exactly as it was.
                    self._saved.append((owner, name, vars(owner).get(name, _MISSING)))
                    self._originals.setdefault(name, getattr(owner, name, None))
                    # setattr: mypy rejects assigning over a method, class or module function.
                    setattr(owner, name, new)
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    for owner, name, old in reversed(self._saved):
                        if old is _MISSING:
                            delattr(owner, name)
                        else:
                            setattr(owner, name, old)
                    self._saved.clear()
                    self._originals.clear()
