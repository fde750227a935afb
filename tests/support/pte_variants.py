"""Corrupt ExecuTorch programs, made from a real one: the issue's abort and seeded fuzz variants."""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Iterator
from pathlib import Path

from executorch.exir._serialize._program import deserialize_pte_binary

from qnn_common.manifest import MANIFEST_NAME
from qnn_common.sealing import load_manifest
from qnn_common.store.hashing import sha256_file

# A .pte's extended header (after the 4-byte root offset and the "ETnn" identifier): magic
# "eh00", u32 header length, u64 program size, u64 segment base offset, u64 segment size.
_SEGMENT_BASE = slice(24, 32)


def segment_base(data: bytes) -> int:
    """Where the delegate segments start (the program's end when it has none)."""
    if data[8:12] != b"eh00":
        return len(data)
    return int.from_bytes(data[_SEGMENT_BASE], "little") or len(data)


def aborting_variant(data: bytes) -> bytes:
    """The issue's abort, made deterministic: one byte of a constant's name inside the XNNPACK
    delegate made not UTF-8. The delegate's compiler logs the name it cannot find, and the
    runtime's Python log bridge (executorch 1.5.1) throws through pybind11: std::terminate."""
    at = data.index(b"scale_", segment_base(data))
    corrupt = bytearray(data)
    corrupt[at + 1] = 0xFF
    return bytes(corrupt)


def memory_bomb_variant(data: bytes, ask: int) -> bytes:
    """The issue's allocation bomb, made deterministic: the first method's largest planned buffer
    made `ask` bytes. Loading the method allocates (and zeroes) that much."""
    sizes = deserialize_pte_binary(data).program.execution_plan[0].non_const_buffer_sizes
    packed = struct.pack("<q", max(sizes))
    at = data.find(packed, 0, segment_base(data))
    assert at >= 0 and data.find(packed, at + 1, segment_base(data)) < 0, "not one place"
    return data[:at] + struct.pack("<q", ask) + data[at + len(packed):]


def fuzz_variants(
    data: bytes, *, seed: int, flips: int, segment_flips: int, truncations: int
) -> Iterator[tuple[str, bytes]]:
    """(label, bytes): `flips` random bytes replaced anywhere, `segment_flips` inside the delegate
    segments (where the aborts were found), and `truncations` random prefixes."""
    rng = random.Random(seed)
    base = segment_base(data)
    for kind, count, low in (("flip", flips, 0), ("segment-flip", segment_flips, base)):
        for _ in range(count):
            at = rng.randrange(low, len(data))
            value = rng.choice([b for b in range(256) if b != data[at]])
            corrupt = bytearray(data)
            corrupt[at] = value
            yield f"{kind}@{at}={value:#04x}", bytes(corrupt)
    for _ in range(truncations):
        size = rng.randrange(len(data))
        yield f"truncate@{size}", data[:size]


def reseal(artifact: Path, name: str) -> None:
    """Re-seal `artifact` after `name` was replaced, as anyone can: the manifest's digest is a
    plain sha256 of its content, integrity against accidents, not a signature."""
    manifest = load_manifest(artifact, verify=False)
    path = artifact / name
    files = tuple(
        dataclasses.replace(f, sha256=sha256_file(path), size=path.stat().st_size)
        if f.path == name else f
        for f in manifest.files
    )
    sealed = dataclasses.replace(manifest, files=files).sealed()
    (artifact / MANIFEST_NAME).write_text(sealed.to_json())
