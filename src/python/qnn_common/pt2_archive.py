"""Checking a `.pt2` archive before torch sees it: refuse anything that would unpickle objects.

`torch.export.load` is not safe on files from outside: it unpickles the sample inputs with
`weights_only=True` but silently retries with `weights_only=False` when that fails; weights and
constants marked `use_pickle` (tensor subclasses) are loaded with `weights_only=False`; custom and
opaque objects go through `pickle.loads`; an AOTInductor package carries native code. A
`__reduce__` payload in any of them runs on load.

`check_pt2_archive` reads the archive from memory (the bytes checked are the bytes loaded) and
accepts only what torch.export.save writes for a plain program: weights and constants stored as
raw tensor bytes, sample inputs that load with `weights_only=True`, JSON, and nothing else that
torch would unpickle. Everything else is refused with the member and the reason.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from qnn_common.errors import ArtifactError

_PRODUCE = "produce one with torch.export.save(torch.export.export(model, inputs), path)"
_HOW_TO_FIX = (
    "only programs whose weights, constants and sample inputs are plain tensors are loaded; "
    "re-export it with torch.export.save from a model without tensor subclasses or custom objects"
)


def check_pt2_archive(path: Path, data: bytes) -> None:
    """Raise ArtifactError unless `data` (the contents of `path`) is a .pt2 that loads without
    unpickling anything but plain tensors and containers."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as err:
        raise ArtifactError(
            path, f"is not an exported program (not a zip archive: {err}); {_PRODUCE}"
        ) from None
    with archive:
        members = _members(path, archive)
        if members.get("archive_format") != b"pt2":
            raise ArtifactError(
                path,
                "is not an exported program in the current .pt2 format (no archive_format 'pt2'; "
                f"archives from older torch versions are not read); {_PRODUCE}",
            )
        for name in members:
            if name.startswith("data/aotinductor/"):
                raise ArtifactError(path, f"{name}: holds AOTInductor native code; {_HOW_TO_FIX}")
        models = [
            n[len("models/") : -len(".json")]
            for n in members
            if n.startswith("models/") and n.endswith(".json")
        ]
        if not models:
            raise ArtifactError(path, f"is not an exported program (no models/*.json); {_PRODUCE}")
        for model in models:
            for kind in ("weights", "constants"):
                _check_payload_config(path, members, model, kind)
            _check_weights_only(path, members, f"data/sample_inputs/{model}.pt")


def _members(path: Path, archive: zipfile.ZipFile) -> dict[str, bytes]:
    """Member name (without the archive's top folder) -> bytes."""
    out: dict[str, bytes] = {}
    for info in archive.infolist():
        parts = PurePosixPath(info.filename).parts
        if info.is_dir() or len(parts) < 2:
            continue
        out["/".join(parts[1:])] = archive.read(info)
    if not out:
        raise ArtifactError(path, f"is not an exported program (an empty archive); {_PRODUCE}")
    return out


def _check_payload_config(path: Path, members: dict[str, bytes], model: str, kind: str) -> None:
    directory = f"data/{kind}/"
    if f"{directory}{model}.pt" in members:  # an older layout: one pickle of everything
        raise ArtifactError(path, f"{directory}{model}.pt: legacy pickled {kind}; {_HOW_TO_FIX}")
    name = f"{directory}{model}_{kind}_config.json"
    if name not in members:
        raise ArtifactError(path, f"is not an exported program ({name} is missing); {_PRODUCE}")
    try:
        config: Any = json.loads(members[name])
        entries = config["config"].items()
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ArtifactError(path, f"{name} is not a payload config ({err})") from None
    for fqn, meta in entries:
        file = str(meta.get("path_name", "")) if isinstance(meta, dict) else ""
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise ArtifactError(
                path,
                f"{kind[:-1]} {fqn!r} is stored as a pickle, which could run code when "
                f"loaded; {_HOW_TO_FIX}",
            )
        if kind == "constants" and not file.startswith("tensor_"):
            raise ArtifactError(
                path,
                f"constant {fqn!r} is a custom or opaque object ({file}), unpickled when "
                f"loaded; {_HOW_TO_FIX}",
            )


def _check_weights_only(path: Path, members: dict[str, bytes], name: str) -> None:
    if name not in members:
        raise ArtifactError(path, f"is not an exported program ({name} is missing); {_PRODUCE}")
    if not members[name]:
        return  # no sample inputs: torch reads b"" as {} without unpickling
    try:
        # If this loads, torch's own weights_only attempt on the same bytes does too, so its
        # weights_only=False fallback is never reached.
        torch.load(io.BytesIO(members[name]), weights_only=True, map_location="cpu")
    except Exception as err:  # unpickling errors share no base class
        # torch's message suggests weights_only=False, exactly what must not happen here.
        raise ArtifactError(
            path,
            f"{name}: sample inputs that only an unrestricted unpickler would load "
            f"({type(err).__name__}), which could run code; {_HOW_TO_FIX}",
        ) from None
