"""Progress of a long lowering on the log: each method's partitioning, then each partition compiled.

ExecuTorch prints nothing between partitioning a program and serializing it, which on a
30-layer decoder is most of the compile stage: hundreds of delegate partitions, each through a
backend's preprocess (XNNPACK: its graph passes and a flatbuffer). Before partitioning, `lower`
logs the edge conversion's start, its longest silent step. `logged_partitioner`
wraps a partitioner class so that each method's partitioning logs its node and partition counts
and seconds; `logging_partitions` wraps a backend's `preprocess`, while a lowering runs, so that
partitions log as they are compiled: every one at DEBUG, and at INFO the first, the last and
one at least every `INFO_EVERY_S` seconds in between (a line per partition would flood a
terminal).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

INFO_EVERY_S = 10.0

_lock = threading.Lock()
_active: dict[type, int] = {}
_stock: dict[type, Any] = {}


class _Counter:
    """Partitions compiled so far, and when an INFO line was last written."""

    def __init__(self) -> None:
        self.done = 0
        self.started = time.perf_counter()
        self.last_info = 0.0


_counter = _Counter()


def _logged_preprocess(backend: type[Any]) -> Any:
    stock = backend.preprocess  # a staticmethod (XNNPACK) or a classmethod: (program, specs)

    def preprocess(program: Any, compile_specs: Any) -> Any:
        t = time.perf_counter()
        result = stock(program, compile_specs)
        now = time.perf_counter()
        _counter.done += 1
        nodes = sum(1 for n in program.graph.nodes if n.op == "call_function")
        level = logging.DEBUG
        if _counter.done == 1 or now - _counter.last_info >= INFO_EVERY_S:
            level, _counter.last_info = logging.INFO, now
        log.log(
            level, "%s: partition %d compiled (%d ops) in %.1f s, %.0f s into the lowering",
            backend.__name__, _counter.done, nodes, now - t, now - _counter.started,
        )
        return result

    return staticmethod(preprocess)


@contextlib.contextmanager
def logging_partitions(backend: type[Any]) -> Iterator[None]:
    """While inside, each partition `backend` (a BackendDetails class) compiles is logged."""
    global _counter
    with _lock:
        if _active.get(backend, 0) == 0:
            _stock[backend] = vars(backend)["preprocess"]
            # setattr: mypy rejects assigning over a class's method.
            setattr(backend, "preprocess", _logged_preprocess(backend))  # noqa: B010
            _counter = _Counter()
        _active[backend] = _active.get(backend, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _active[backend] -= 1
            if _active[backend] == 0:
                setattr(backend, "preprocess", _stock.pop(backend))  # noqa: B010
                if _counter.done:
                    log.info("%s: %d partition(s) compiled in %.1f s", backend.__name__,
                             _counter.done, time.perf_counter() - _counter.started)


def logged_partitioner(base: type[Any]) -> type[Any]:
    """A subclass of partitioner class `base` whose `partition` logs what it found and when."""

    def partition(self: Any, exported_program: Any) -> Any:
        nodes = sum(1 for n in exported_program.graph.nodes if n.op == "call_function")
        log.info("partitioning %d ops for %s", nodes, base.__name__)
        t = time.perf_counter()
        result = base.partition(self, exported_program)
        log.info("%s: %d partition(s) in %.1f s", base.__name__,
                 len(result.partition_tags), time.perf_counter() - t)
        return result

    return type(f"Logged{base.__name__}", (base,), {"partition": partition})
