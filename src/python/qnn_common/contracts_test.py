"""The contract types import with the standard library alone (issue 22): a tool that reads a
manifest, validates a config or lists SoCs and recipes does not need torch.

Run in a child interpreter that refuses the heavy packages, since this process has torch
imported already."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from qnn_common import (
    artifact,
    config,
    errors,
    gates,
    layer_recipes,
    llm_spec,
    manifest,
    recipes,
    reports,
    soc,
    target,
    weight_groups,
)
from qnn_common.causal_lm import steps

CONTRACTS = tuple(
    m.__name__ for m in (errors, soc, recipes, weight_groups, layer_recipes, target, gates,
                         manifest, llm_spec, config, reports, artifact)
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
