"""Each package's version is written twice: in its BUILD (the wheel) and in `__version__` (the
manifests). They must agree, or artifacts would record a version no wheel has."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

import qnn_common
import qnn_compile
import qnn_infer
import qnn_pipeline
import qnn_prepare
import qnn_quant

PACKAGES = (qnn_common, qnn_prepare, qnn_quant, qnn_compile, qnn_infer, qnn_pipeline)


def _build_version(package: str) -> str:
    text = Path("src/python", package, "BUILD").read_text()
    match = re.search(r'python_artifact\([^)]*?version="([^"]+)"', text, re.S)
    assert match, f"no python_artifact version in src/python/{package}/BUILD"
    return match.group(1)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda m: m.__name__)
def test_build_version_matches_dunder_version(package: ModuleType) -> None:
    name = package.__name__
    assert package.__version__ == _build_version(name), (
        f"bump both src/python/{name}/BUILD and {name}/__init__.py"
    )
