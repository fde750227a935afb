"""Tests of qnn_prepare.provenance: which files define a module:function model."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from qnn_common.config import PrepareConfig
from qnn_prepare.api import prepare_cache_key
from qnn_prepare.models import load_model
from qnn_prepare.provenance import factory_digest, factory_files


@pytest.fixture()
def package(tmp_path: Path) -> Iterator[Path]:
    """prov_pkg/{__init__,factory,layers}.py plus a weights file, on sys.path."""
    pkg = tmp_path / "prov_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Head(torch.nn.Module):
                def forward(self, x):
                    return x * 2
            """
        )
    )
    (pkg / "factory.py").write_text(
        textwrap.dedent(
            """
            import json
            from pathlib import Path

            import torch

            from .layers import Head

            def make():
                scale = json.loads((Path(__file__).parent / "scale.json").read_text())
                return Head(), (torch.full((1, 4), float(scale)),)
            """
        )
    )
    (pkg / "scale.json").write_text("3")
    sys.path.insert(0, str(tmp_path))
    try:
        yield pkg
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("prov_pkg")]:
            del sys.modules[name]


def test_files_are_the_module_its_first_party_imports_and_named_data(package: Path) -> None:
    files = factory_files("prov_pkg.factory")
    assert files == sorted(
        p.resolve() for p in (package / "factory.py", package / "layers.py",
                              package / "__init__.py", package / "scale.json")
    )
    # Third-party and standard-library modules (torch, json, pathlib) are not digested.
    assert all("site-packages" not in f.parts for f in files)


@pytest.mark.parametrize(
    ("file", "old", "new"),
    [("layers.py", "x * 2", "x * 5"), ("scale.json", "3", "4"), ("factory.py", "float", "int")],
)
def test_digest_follows_each_file(package: Path, file: str, old: str, new: str) -> None:
    before = factory_digest("prov_pkg.factory:make")
    assert factory_digest("prov_pkg.factory:make") == before
    path = package / file
    path.write_text(path.read_text().replace(old, new))
    assert factory_digest("prov_pkg.factory:make") != before


def test_unknown_module_is_keyed_by_name() -> None:
    assert factory_files("no_such_module_xyz") == []
    assert factory_digest("no_such_module_xyz:f") != factory_digest("no_such_module_xyz:g")


def test_cache_key_changes_and_the_edit_is_loaded(package: Path) -> None:
    config = PrepareConfig(model="prov_pkg.factory:make")
    key = prepare_cache_key(config)
    model = load_model(config.model)
    assert torch.equal(model.module(*model.example_inputs), torch.full((1, 4), 6.0))
    factory = package / "factory.py"
    # Same size, same second: only re-executing the source sees this edit.
    factory.write_text(factory.read_text().replace("(1, 4)", "(1, 5)"))
    assert prepare_cache_key(config) != key
    assert load_model(config.model).example_inputs[0].shape == (1, 5)
