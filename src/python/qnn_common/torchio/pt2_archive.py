"""Checking a `.pt2` archive before torch sees it: refuse anything that would unpickle objects.

`torch.export.load` is not safe on files from outside: it unpickles the sample inputs with
`weights_only=True` but silently retries with `weights_only=False` when that fails; weights and
constants marked `use_pickle` (tensor subclasses) are loaded with `weights_only=False`; custom and
opaque objects go through `pickle.loads`; an AOTInductor package carries native code. A
`__reduce__` payload in any of them runs on load.

The program's JSON is no pickle but is not inert either: torch evaluates its symbolic sizes with
sympy, `exec`s its guards and resolves its node targets by name (`program_json`).

`check_pt2_archive` opens the archive through `bounded_zip` (canonical, unique names;
sizes bounded by the headers before anything is inflated) and accepts only what
torch.export.save writes for a plain program: weights and constants stored as raw tensor bytes,
sample inputs that load with `weights_only=True`, program JSON whose every evaluated string fits
`program_json`'s grammar (its guards dropped). Everything else is refused with the member and the
reason.

Torch never reads the file itself. It gets `CheckedPt2.archive`, written here from the members
just checked, under the names checked (so no second name can reach another copy), holding only
what torch's loader reads for the program `torch.export.load` returns, and with the sample inputs
emptied: torch reads empty sample inputs as none without unpickling anything, so its
`weights_only=False` retry is unreachable. The sample inputs come back from our own weights-only
load (`CheckedPt2.example_inputs`).
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from qnn_common.errors import ArtifactError
from qnn_common.torchio.bounded_zip import BoundedZip, open_bounded_zip
from qnn_common.torchio.program_json import checked_program_json
from qnn_common.torchio.tensor_file import load_tensor_stream

_PRODUCE = "produce one with torch.export.save(torch.export.export(model, inputs), path)"
_WHAT = "an exported program"
# torch.export.save stores every member uncompressed, under plain names.
_REMEDY = f"torch.export.save writes no such archive; {_PRODUCE}"
_HOW_TO_FIX = (
    "only programs whose weights, constants and sample inputs are plain tensors are loaded; "
    "re-export it with torch.export.save from a model without tensor subclasses or custom objects"
)
MODEL = "model"  # the one program torch.export.load returns from an archive
_SAMPLE_INPUTS = f"data/sample_inputs/{MODEL}.pt"
# Records torch's archive reader and load_pt2 read besides the program's own members.
_ROOT_RECORDS = ("archive_format", "archive_version", "byteorder", ".data/version",
                 ".data/serialization_id")

ExampleInputs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class CheckedPt2:
    """What passed the check: `archive`, the bytes torch's loader is given, and the sample inputs
    torch is not given (None when the program carries none)."""

    archive: bytes
    example_inputs: ExampleInputs | None


def check_pt2_archive(path: Path, file: BinaryIO) -> CheckedPt2:
    """Raise ArtifactError unless `file` (open on `path`) is a .pt2 that loads without unpickling
    anything but plain tensors and containers; else what torch may load of it."""
    size = file.seek(0, io.SEEK_END)
    file.seek(0)
    with open_bounded_zip(path, file, size, what=_WHAT, remedy=_REMEDY) as archive:
        members = archive.members
        if "archive_format" not in members or archive.read("archive_format") != b"pt2":
            raise ArtifactError(
                path,
                "is not an exported program in the current .pt2 format (no archive_format 'pt2'; "
                f"archives from older torch versions are not read); {_PRODUCE}",
            )
        for name in members:
            if name.startswith("data/aotinductor/"):
                raise ArtifactError(path, f"{name}: holds AOTInductor native code; {_HOW_TO_FIX}")
        program = f"models/{MODEL}.json"
        if program not in members:
            raise ArtifactError(path, f"is not an exported program (no {program}); {_PRODUCE}")
        # Written as read, one member at a time: the checked copy is the only full copy held
        # (a 1B decoder's weights are 5 GB; its second method loads beside the first's).
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as out:
            for name in _ROOT_RECORDS:
                if name in members:
                    out.writestr(f"{archive.root}/{name}", archive.read(name))
            out.writestr(
                f"{archive.root}/{program}",
                checked_program_json(path, program, archive.read(program)),
            )
            for kind in ("weights", "constants"):
                for name, data in _payload(path, archive, kind):
                    out.writestr(f"{archive.root}/{name}", data)
            example_inputs = _sample_inputs(path, archive)
            out.writestr(f"{archive.root}/{_SAMPLE_INPUTS}", b"")
    return CheckedPt2(buffer.getvalue(), example_inputs)


def _payload(path: Path, archive: BoundedZip, kind: str) -> Iterator[tuple[str, bytes]]:
    """The payload config of `kind` (weights / constants), then the raw tensor files it names,
    each read as it is reached; every entry of the config is checked before any is read."""
    directory = f"data/{kind}/"
    if f"{directory}{MODEL}.pt" in archive.members:  # an older layout: one pickle of everything
        raise ArtifactError(path, f"{directory}{MODEL}.pt: legacy pickled {kind}; {_HOW_TO_FIX}")
    name = f"{directory}{MODEL}_{kind}_config.json"
    if name not in archive.members:
        raise ArtifactError(path, f"is not an exported program ({name} is missing); {_PRODUCE}")
    raw = archive.read(name)
    try:
        config: Any = json.loads(raw)
        entries = config["config"].items()
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise ArtifactError(
            path, f"{name} is not a payload config ({type(err).__name__}: {err})"
        ) from None
    members = {name: None}  # in order, once each
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
        member = os.path.join(directory, file)  # the record name torch's loader looks up
        if member not in archive.members:
            raise ArtifactError(
                path, f"{kind[:-1]} {fqn!r} names {member!r}, which the archive does not hold; "
                f"{_PRODUCE}",
            )
        members[member] = None
    yield name, raw
    for member in list(members)[1:]:
        yield member, archive.read(member)


def _sample_inputs(path: Path, archive: BoundedZip) -> ExampleInputs | None:
    name = _SAMPLE_INPUTS
    if name not in archive.members:
        raise ArtifactError(path, f"is not an exported program ({name} is missing); {_PRODUCE}")
    data = archive.read(name)
    if not data:
        return None  # torch reads b"" as no sample inputs
    # A torch.save archive of its own, bounded and its pickle's shape checked the same way as
    # every sample file before torch.load reads it (a shared-children key would hang that load).
    try:
        value = load_tensor_stream(path, io.BytesIO(data), what=f"{_WHAT}'s sample inputs")
    except ArtifactError as err:
        raise ArtifactError(path, f"{name}: {err.reason}") from None
    if not (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], tuple)
        and isinstance(value[1], dict)
    ):
        raise ArtifactError(
            path, f"{name}: sample inputs are a {type(value).__name__}, not (args, kwargs); "
            f"{_PRODUCE}",
        )
    return value[0], value[1]
