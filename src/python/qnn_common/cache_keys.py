"""Cache keys: a digest of everything that determines a stage's output.

Same config + same inputs + same code and tool versions => same key, so the pipeline may reuse an
artifact instead of recomputing it. The manifest records the key and its basis (`key_basis_of`),
so that a later run can recompute the key from the manifest alone (`key_from`) and refuse an
artifact whose record does not reproduce it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import platform
import sys
import types
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from qnn_common.manifest import SCHEMA_VERSION, to_jsonable

# Versions recorded in every manifest (distribution names, looked up without importing them).
TRACKED_DISTRIBUTIONS = ("torch", "executorch", "torchao", "transformers", "numpy")


@functools.cache
def code_version(package: types.ModuleType) -> str:
    """`package.__version__` plus a digest of its own modules' source.

    Cache keys use this instead of the bare version, so that changed code invalidates cached
    artifacts even before anyone bumps the version (which is what happens during development).
    """
    root = Path(str(package.__file__)).parent
    h = hashlib.sha256()
    for f in sorted(root.glob("*.py")):
        if not f.name.endswith("_test.py"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return f"{package.__version__}+{h.hexdigest()[:12]}"


# Cache key -> its basis, for every key this process computed: write_manifest records the basis
# of the key it is given, which a later run needs to recompute the key from the manifest.
_KEY_BASES: dict[str, dict[str, Any]] = {}


def cache_key(
    stage: str, config: Any, input_digests: Mapping[str, str], package_version: str
) -> str:
    """A digest of everything that determines a stage's output.

    Same config + same inputs + same package version => same key, so the pipeline may reuse the
    artifact instead of recomputing it. Tool versions are part of the key too: a torch or
    executorch upgrade invalidates every cached artifact.
    """
    basis = {
        "package_version": package_version,
        "contracts_version": code_version(sys.modules[__package__ or "qnn_common"]),
        "tools": tool_versions(),
        "schema_version": SCHEMA_VERSION,
    }
    key = key_from(stage, config, input_digests, basis)
    _KEY_BASES[key] = basis
    return key


# Field metadata of a setting that changes how a run is shown, not what it computes (printing
# tokens as they come): left out of cache keys, so flipping it reuses the artifact.
NOT_IN_CACHE_KEY: Mapping[str, bool] = types.MappingProxyType({"cache_key": False})


def keyed(value: Any) -> Any:
    """`to_jsonable(value)` less the dataclass fields marked `NOT_IN_CACHE_KEY`: what a cache key
    hashes of a config, and so what a manifest records of it (a config recorded with those fields
    would not reproduce its own key)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: keyed(getattr(value, f.name))
            for f in fields(value) if f.metadata.get("cache_key", True)
        }
    if isinstance(value, Mapping):
        return {str(k): keyed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [keyed(v) for v in value]
    return to_jsonable(value)


def key_from(
    stage: str, config: Any, input_digests: Mapping[str, str], basis: Mapping[str, Any]
) -> str:
    """The key of `stage` from its config, input digests and the rest of its basis."""
    payload = {
        "stage": stage,
        "config": keyed(config),
        "inputs": dict(sorted(input_digests.items())),
        **basis,
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def tool_versions(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Python and the ML stack's versions (`not installed` where absent), plus `extra` (QNN)."""
    versions = {"python": platform.python_version()}
    for dist in TRACKED_DISTRIBUTIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    versions.update(extra or {})
    return versions


def key_basis_of(key: str) -> dict[str, Any]:
    """The basis of `key` if this process computed it (`cache_key`), else {}."""
    return _KEY_BASES.get(key, {})
