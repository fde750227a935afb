"""qnn_common's top level and its config/ and store/ subpackages import with the standard library
alone (issue 22; issue 51: every top-level module, found on disk, not a hand list): a tool that
reads a manifest, validates a config or lists SoCs and recipes does not need torch. Pants enforces
the same by dependency rule (qnn_common/BUILD: the top level and config/ may depend on each other
and store/ only); this checks it without Pants.

Run in a child interpreter that refuses the heavy packages, since this process has torch
imported already."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import qnn_common
from qnn_common import config, store
from qnn_common.causal_lm import steps


def _modules(package: ModuleType) -> list[str]:
    """The modules (not subpackages, not tests) directly in `package`, found without importing."""
    prefix = f"{package.__name__}."
    return sorted(
        m.name for m in pkgutil.iter_modules(package.__path__, prefix)
        if not m.ispkg and not m.name.endswith("_test") and not m.name.endswith(".conftest")
    )


# The top level (the package itself included), then the subpackages the rule lets it use.
CONTRACTS = (
    qnn_common.__name__, *_modules(qnn_common),
    config.__name__, *_modules(config),
    store.__name__, *_modules(store),
)
HEAVY = ("torch", "numpy", "executorch", "torchao", "transformers", "onnxruntime")

_CHILD = """
import importlib, sys
heavy = set(sys.argv[2].split(","))
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in heavy:
            raise ImportError(f"{name} is not allowed here")
        return None
sys.meta_path.insert(0, Refuse())
importlib.import_module(sys.argv[1])
"""


@pytest.mark.parametrize("module", CONTRACTS)
def test_contract_module_imports_without_heavy_packages(module: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, module, ",".join(HEAVY)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_refusal_is_real() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, steps.__name__, ",".join(HEAVY)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode != 0 and "torch is not allowed here" in done.stderr


def test_the_contracts_are_found() -> None:
    """The discovery sees the top level's modules (a wrong path would make the checks vacuous)."""
    for name in ("manifest", "stages", "artifact", "llm_spec", "reports", "sealing"):
        assert f"qnn_common.{name}" in CONTRACTS
    assert "qnn_common.config.quantize" in CONTRACTS and "qnn_common.store.atomic" in CONTRACTS
