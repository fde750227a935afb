"""The environment for a child Python that must import what this process imports.

A child started as `sys.executable ...` (a benchmark's per-stage process, an op cell isolated from
a native crash, a local Ray's agents and workers) gets the interpreter, not this process's import
path. Under a plain venv or installed wheels the two are the same; under `./pants run` they are
not: a PEX assembles its path at start-up (zipapp PEXes from their own caches; Pants' runs of a
source file put first-party code on `PEX_EXTRA_SYS_PATH`, which a bare interpreter ignores), and
so does pytest in a Pants sandbox. The child then fails with `No module named qnn_prepare.cli`
or, for Ray, its agents exit at once and the node times out starting.

The fix is at the one place that knows the path: this process hands its `sys.path` to the child
as `PYTHONPATH`. A venv-mode PEX would only cover `pex_binary` targets; this covers every way the
code is launched, and costs nothing where the paths already agree.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping


def import_path() -> str:
    """This process's `sys.path` as a PYTHONPATH value: absolute (a child's cwd may differ),
    existing entries only, then whatever PYTHONPATH already held."""
    entries = [os.path.abspath(p) for p in sys.path if p and os.path.exists(p)]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    seen: dict[str, None] = dict.fromkeys([*entries, *inherited])
    return os.pathsep.join(seen)


def python_child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with PYTHONPATH set so that a child
    `sys.executable` imports what this process imports."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = import_path()
    return env


@contextlib.contextmanager
def path_exported() -> Iterator[None]:
    """While inside: this process's PYTHONPATH is its import path, for children started by code
    that takes no `env` (ray.init starts its node's agents with os.environ). Restored after."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = import_path()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
