"""Hostile sample files (`--inputs`, `--calibration-file`, an artifact's eval inputs): small
`.pt` files whose structure or declared sizes cost unbounded work, and pickles built opcode by
opcode where torch.save would not write them."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import torch

_PROTO = b"\x80\x02"
_STOP = b"."


def torch_bytes(obj: object) -> bytes:
    """`obj` as torch.save writes it."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def shared_lists(path: Path, levels: int) -> Path:
    """The issue's file: ``a = [t]``, then `levels` times ``a = [a, a]``: each list is stored
    once (the pickle's memo), yet a tree walk of the result visits 2^levels tensors."""
    value: list[object] = [torch.zeros(2)]
    for _ in range(levels):
        value = [value, value]
    path.write_bytes(torch_bytes(value))
    return path


def with_pickle(path: Path, pickle_body: bytes) -> Path:
    """A torch.save archive whose data.pkl is `pickle_body` (between the protocol and STOP
    opcodes), hand-written: what no pickler writes."""
    with zipfile.ZipFile(io.BytesIO(torch_bytes(torch.zeros(1)))) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for name, data in members.items():
            out.writestr(name, _PROTO + pickle_body + _STOP if name.endswith("/data.pkl") else data)
    return path


def shared_tuple_key(path: Path, levels: int) -> Path:
    """``{k: 1}`` where k is ``(1,)`` paired with itself `levels` times: unpickling hashes the
    key, and a tuple's hash walks every path (building it here would hash it too)."""
    body = b"}" + b"K\x01\x85q\x00"  # EMPTY_DICT; key = (1,), put in memo 0
    body += b"h\x00\x86q\x00" * levels  # key = (key, memo 0), put in memo 0
    body += b"K\x01s"  # SETITEM key: 1
    return with_pickle(path, body)


def self_containing_list(path: Path) -> Path:
    """A list appended to itself (pickle's memo allows it)."""
    return with_pickle(path, b"]q\x00h\x00a")


def deep_lists(path: Path, depth: int) -> Path:
    """`depth` lists, each the only item of the one before."""
    return with_pickle(path, b"]" * depth + b"a" * (depth - 1))


def deflated_storage(path: Path, size: int) -> Path:
    """One float32 tensor of `size` bytes of zeros whose storage member is deflated: a few MB
    that torch would inflate in full before anything could look at the tensor."""
    numel, honest = size // 4, 70_000  # stored as 4-byte BININTs, so the numbers can be swapped
    data = torch_bytes(torch.zeros(honest))
    old, new = b"J" + struct.pack("<i", honest), b"J" + struct.pack("<i", numel)
    chunk = bytes(2**22)
    with (
        zipfile.ZipFile(io.BytesIO(data)) as archive,
        zipfile.ZipFile(path, "w", compresslevel=1) as out,
    ):
        for info in archive.infolist():
            if info.filename.endswith("/data/0"):
                member = zipfile.ZipInfo(info.filename)
                member.compress_type = zipfile.ZIP_DEFLATED
                with out.open(member, "w", force_zip64=True) as blob:
                    for start in range(0, size, len(chunk)):
                        blob.write(chunk[: min(len(chunk), size - start)])
            else:
                body = archive.read(info)
                if info.filename.endswith("/data.pkl"):
                    body = body.replace(old, new)
                out.writestr(info.filename, body)
    return path
