from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
from importlib.metadata import version
from pathlib import Path

import pytest

from qnn_common.upstream_patches import PATCHES as COMMON_PATCHES
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


def _resolve(dotted: str) -> tuple[object, str]:
    """The owner (module or class) of an upstream attribute named "package.module[.Class].name",
    imported, and the attribute's name."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1]
    raise AssertionError(f"no module of {dotted} imports")


SCOPED = tuple(p for p in PATCHES if p.module.startswith("qnn_compile."))


def _dotted(owner: object, name: str) -> str:
    if isinstance(owner, types.ModuleType):
        return f"{owner.__name__}.{name}"
    assert isinstance(owner, type), owner
    return f"{owner.__module__}.{owner.__qualname__}.{name}"


def test_every_scoped_patch_is_in_the_index_once() -> None:
    listed = [p.module for p in PATCHES]
    assert len(listed) == len(set(listed))
    assert {p.module.removeprefix("qnn_compile.") for p in SCOPED} == _patched_here()
    # The rest are qnn_common's (torch.export's loader), indexed there.
    assert set(listed) - {p.module for p in SCOPED} == {p.module for p in COMMON_PATCHES}


@pytest.mark.parametrize("patch", PATCHES, ids=[p.module for p in PATCHES])
def test_every_replaced_attribute_is_upstream(patch: UpstreamPatch) -> None:
    """For every patch, qnn_common's included: what it replaces is still there, what it adds is
    not yet, and its module names each attribute it patches."""
    for dotted in patch.replaces:
        owner, name = _resolve(dotted)
        assert hasattr(owner, name), f"upstream no longer has {dotted}"
    for dotted in patch.adds:
        owner, name = _resolve(dotted)
        assert name not in vars(owner), f"upstream now defines {dotted}: drop the patch"
    source = inspect.getsource(importlib.import_module(patch.module))
    for dotted in patch.replaces | patch.adds:
        assert dotted.rsplit(".", 1)[1] in source, (patch.module, dotted)
    assert patch.test.endswith("_test.py") and patch.why


@pytest.mark.parametrize("patch", SCOPED, ids=[p.module for p in SCOPED])
def test_the_index_names_what_each_patch_replaces(patch: UpstreamPatch) -> None:
    module = importlib.import_module(patch.module)
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
        f"{package} is {version(package)}, the patches in qnn_compile/upstream_patches.py "
        f"(qnn_common's too) were written for {WRITTEN_FOR[package]}: read each against the new "
        "upstream code (and run its test), then update WRITTEN_FOR"
    )
