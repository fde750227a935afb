from __future__ import annotations

import importlib
import pkgutil
import types
from importlib.metadata import version
from pathlib import Path

import pytest

from qnn_compile import api
from qnn_compile.scoped_patch import ScopedPatch
from qnn_compile.upstream_patches import PATCHES, WRITTEN_FOR, UpstreamPatch


def _patched_here() -> set[str]:
    """Our modules that hold a ScopedPatch (their `_PATCH`): every module the compile stage's
    API reaches, hence in the test's sandbox."""
    found = set()
    for info in pkgutil.iter_modules([str(Path(api.__file__).parent)]):
        if info.name.endswith("_test"):
            continue
        module = importlib.import_module(f"qnn_compile.{info.name}")
        if any(isinstance(v, ScopedPatch) for v in vars(module).values()):
            found.add(info.name)
    return found


def _dotted(owner: object, name: str) -> str:
    if isinstance(owner, types.ModuleType):
        return f"{owner.__name__}.{name}"
    assert isinstance(owner, type), owner
    return f"{owner.__module__}.{owner.__qualname__}.{name}"


def test_every_scoped_patch_is_in_the_index_once() -> None:
    listed = [p.module for p in PATCHES]
    assert len(listed) == len(set(listed))
    assert set(listed) == _patched_here()


@pytest.mark.parametrize("patch", PATCHES, ids=[p.module for p in PATCHES])
def test_the_index_names_what_each_patch_replaces(patch: UpstreamPatch) -> None:
    module = importlib.import_module(f"qnn_compile.{patch.module}")
    replacements = module._replacements()
    replaced = {_dotted(owner, name) for owner, name, _ in replacements}
    # An added attribute is left out where upstream came to define it itself.
    assert patch.replaces <= replaced <= patch.replaces | patch.adds
    for owner, name, _ in replacements:
        dotted = _dotted(owner, name)
        if dotted in patch.replaces:
            assert hasattr(owner, name), f"upstream no longer has {dotted}"
        else:
            assert name not in vars(owner), f"upstream now defines {dotted}: drop the patch"
    assert patch.test.endswith("_test.py") and patch.why


@pytest.mark.parametrize("package", sorted(WRITTEN_FOR))
def test_the_patches_were_read_against_the_installed_upstream(package: str) -> None:
    installed = ".".join(version(package).split("+")[0].split(".")[:2])
    assert installed == WRITTEN_FOR[package], (
        f"{package} is {version(package)}, the patches in qnn_compile/upstream_patches.py were "
        f"written for {WRITTEN_FOR[package]}: read each against the new upstream code (and run "
        "its test), then update WRITTEN_FOR"
    )
