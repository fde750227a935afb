"""Opening a zip archive from outside: names and sizes are checked from its headers first.

A zip's central directory declares every member's name, where its bytes lie, how many are stored
and how many they inflate to. `open_bounded_zip` refuses, before a byte is inflated:

- a name that is not canonical (empty, `.` or `..` parts, `//`, a leading `/`, a backslash, NUL),
  not under the archive's one top folder, or equal to another's (case aside: some readers look
  names up case-insensitively). Two names for one member let a checker see one copy while a
  reader that looks the exact name up gets the other.
- members whose stored bytes overlap or run past the end of the file (the overlapping-entries
  zip bomb), a stored member whose inflated size differs from its stored size, a compression
  method other than deflate, and encryption.
- compressed members that would inflate to more than `INFLATED_BUDGET` in all. A stored member is
  at most the file's own size; with this budget, reading an archive never takes more memory than
  its file plus the budget, whatever the headers claim.

Reading a member afterwards (`BoundedZip.read`) verifies its CRC, and every way a corrupt archive
fails becomes an ArtifactError naming the file and the member.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from qnn_common.errors import ArtifactError

# torch.export.save and torch.save store every member uncompressed; this leaves room for a
# re-zipped archive's deflated JSON while bounding what a deflated member can cost.
INFLATED_BUDGET = 64 * 2**20
_LOCAL_HEADER_SIZE = 30  # fixed part of a local file header, before its name and extra field
_ENCRYPTED = 0x1 | 0x40  # traditional and strong encryption
_UTF8_NAME = 0x800
# What zipfile raises on bytes that are not a well-formed archive: its own BadZipFile for what it
# checks, and the errors of the parsing and inflating underneath for what it does not.
_CORRUPT = (zipfile.BadZipFile, zlib.error, EOFError, struct.error, ValueError, OverflowError,
            NotImplementedError)


def gib(size: int) -> str:
    """`size` bytes for a message: GiB, MiB or bytes."""
    if size >= 2**30:
        return f"{size / 2**30:.1f} GiB"
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    return f"{size} bytes"


@dataclass
class BoundedZip:
    """An archive whose headers passed the checks above; `members` maps each member's name below
    the top folder to its header. Close it with `close()` or use it as a context manager."""

    path: Path
    root: str
    members: dict[str, zipfile.ZipInfo]
    _archive: zipfile.ZipFile

    def read(self, name: str) -> bytes:
        """The member's bytes, CRC verified (at most its declared size is ever inflated)."""
        try:
            return self._archive.read(self.members[name])
        except (*_CORRUPT, OSError) as err:
            raise ArtifactError(
                self.path, f"{name}: cannot be read ({err}); the archive is corrupt"
            ) from None

    def close(self) -> None:
        self._archive.close()

    def __enter__(self) -> BoundedZip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_bounded_zip(
    path: Path, file: BinaryIO, size: int, *, what: str, remedy: str
) -> BoundedZip:
    """Open the zip in `file` (`size` bytes; `path` names it in messages) after the header checks.

    `what` names what the archive must be and `remedy` how to make one, for the messages: the
    archive is refused with ArtifactError(path, ...) saying which member, why, and the remedy.
    """
    try:
        archive = zipfile.ZipFile(file)
    except (*_CORRUPT, OSError) as err:
        raise ArtifactError(
            path, f"is not {what} (not a zip archive: {err}); {remedy}"
        ) from None
    try:
        root, members = _check_headers(path, archive, size, what, remedy)
    except BaseException:
        archive.close()
        raise
    return BoundedZip(path, root, members, archive)


def _check_headers(
    path: Path, archive: zipfile.ZipFile, size: int, what: str, remedy: str
) -> tuple[str, dict[str, zipfile.ZipInfo]]:
    infos = archive.infolist()
    if not infos:
        raise ArtifactError(path, f"is not {what} (an empty archive); {remedy}")
    root = infos[0].filename.split("/", 1)[0]
    members: dict[str, zipfile.ZipInfo] = {}
    seen: dict[str, str] = {}
    inflated = 0
    for info in infos:
        name = info.filename
        inner = _inner_name(name, root)
        if inner is None:
            raise ArtifactError(
                path,
                f"member name {name!r} is not a plain path below the archive's one top "
                f"folder {root!r}, as in {what}; {remedy}",
            )
        folded = name.casefold()
        if folded in seen:
            raise ArtifactError(
                path,
                f"{inner}: two members are named {seen[folded]!r} and {name!r}, so readers "
                f"disagree on which one it is; {remedy}",
            )
        seen[folded] = name
        if info.flag_bits & _ENCRYPTED:
            raise ArtifactError(path, f"{inner}: is encrypted; {remedy}")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise ArtifactError(
                    path,
                    f"{inner}: is stored uncompressed in {info.compress_size} bytes but "
                    f"declares {info.file_size}; the archive is corrupt",
                )
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            inflated += info.file_size
            if inflated > INFLATED_BUDGET:
                raise ArtifactError(
                    path,
                    f"{inner}: inflates to {gib(info.file_size)} from "
                    f"{gib(info.compress_size)}; compressed members may inflate to "
                    f"{gib(INFLATED_BUDGET)} in all; {remedy}",
                )
        else:
            raise ArtifactError(
                path, f"{inner}: uses compression method {info.compress_type}; {remedy}"
            )
        if not name.endswith("/"):  # a directory entry holds nothing to read
            members[inner] = info
    _check_extents(path, infos, size)
    return root, members


def _inner_name(name: str, root: str) -> str | None:
    """`name` below `root/` if it is canonical there (a directory entry keeps its '/'), else
    None."""
    if "\\" in name or "\x00" in name or not name.startswith(f"{root}/"):
        return None
    inner = name[len(root) + 1 :]
    parts = (inner[:-1] if inner.endswith("/") else inner).split("/")
    if not root or root in (".", "..") or any(p in ("", ".", "..") for p in parts):
        return None
    return inner


def _check_extents(path: Path, infos: list[zipfile.ZipInfo], size: int) -> None:
    """Each member's local header and stored bytes lie inside the file, apart from the others."""
    end = 0
    previous = ""
    for info in sorted(infos, key=lambda i: i.header_offset):
        start = info.header_offset
        encoding = "utf-8" if info.flag_bits & _UTF8_NAME else "cp437"  # as zipfile decoded it
        extent = _LOCAL_HEADER_SIZE + len(info.filename.encode(encoding)) + info.compress_size
        if start < end:
            raise ArtifactError(
                path,
                f"members {previous!r} and {info.filename!r} overlap in the file (a zip bomb's "
                "layout, or a corrupt archive); refused",
            )
        end = start + extent
        previous = info.filename
        if end > size:
            raise ArtifactError(
                path,
                f"{info.filename}: its {gib(info.compress_size)} run past the end of the "
                f"{gib(size)} file; the archive is truncated or corrupt",
            )
