"""Reading ExecuTorch program files (.pte) without the runtime: is it one, and what it returns.

The runtime trusts its input; these readers run first, so a random or truncated file is refused
with a reason, and the user-output structure a program records is known before it runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from qnn_common.errors import ArtifactError

# A .pte is a flatbuffer: 4 bytes root offset, then the file identifier "ET" + 2-digit version.
_PTE_IDENTIFIER = re.compile(rb"ET\d\d")
# Optional extended header right after the identifier: magic, length, then uint64 fields.
_EXT_HEADER_MAGIC = b"eh00"
_HEAD_BYTES = 64


def user_output_count(pte_path: Path, method: str = "forward") -> int | None:
    """How many user outputs `method` of the .pte has (leaves of its output pytree spec), or
    None when the program records no spec."""
    spec = _encoded_out_spec(Path(pte_path), method)
    if not spec:
        return None
    try:
        # torch.utils._pytree.treespec_dumps format: [protocol, node]; a leaf has type null.
        _protocol, root = json.loads(spec)
    except (ValueError, TypeError):
        return None

    def leaves(node: dict[str, Any]) -> int:
        if node.get("type") is None:
            return 1
        return sum(leaves(child) for child in node.get("children_spec") or [])

    return leaves(root) if isinstance(root, dict) else None


def _encoded_out_spec(pte_path: Path, method: str) -> str | None:
    """Program.execution_plan[method].container_meta_type.encoded_out_str, read straight from
    the flatbuffer (schema: executorch/exir/_serialize/program.fbs) without deserializing the
    whole program, which for a large model means copying every constant."""
    with pte_path.open("rb") as fh:
        head = fh.read(_HEAD_BYTES)
        size = len(head)
        if head[8:12] == _EXT_HEADER_MAGIC and len(head) >= 24:
            # Only the flatbuffer part (program size in the extended header), not the segments.
            size = int.from_bytes(head[16:24], "little")
        fh.seek(0)
        buf = fh.read(size) if size > len(head) else fh.read()
    try:
        return _read_out_spec(buf, method)
    except (IndexError, ValueError, UnicodeDecodeError):
        return None  # not a layout this reader knows: treat every output as a user output


def _read_out_spec(buf: bytes, method: str) -> str | None:
    def u32(pos: int) -> int:
        return int.from_bytes(buf[pos : pos + 4], "little")

    def field(table: int, index: int) -> int | None:
        """Absolute position of the offset-typed field `index` of the table at `table`."""
        vtable = table - int.from_bytes(buf[table : table + 4], "little", signed=True)
        vt_size = int.from_bytes(buf[vtable : vtable + 2], "little")
        slot = 4 + 2 * index
        if slot + 2 > vt_size:
            return None
        off = int.from_bytes(buf[vtable + slot : vtable + slot + 2], "little")
        if off == 0:
            return None
        pos = table + off
        return pos + u32(pos)

    def string(pos: int | None) -> str | None:
        return None if pos is None else buf[pos + 4 : pos + 4 + u32(pos)].decode("utf-8")

    root = u32(0)
    plans = field(root, 1)  # Program.execution_plan
    if plans is None:
        return None
    for i in range(u32(plans)):
        elem = plans + 4 + 4 * i
        plan = elem + u32(elem)
        if string(field(plan, 0)) != method:  # ExecutionPlan.name
            continue
        meta = field(plan, 1)  # ExecutionPlan.container_meta_type
        return None if meta is None else string(field(meta, 1))  # .encoded_out_str
    return None


def check_pte_header(path: Path) -> None:
    """Reject files that are not (complete) ExecuTorch programs before the runtime sees them.

    Not just for a nicer message: the runtime logs the file identifier it found, and the Python
    log bridge of executorch 1.5.1 aborts the whole process (std::terminate on a
    UnicodeDecodeError) when those bytes are not UTF-8, as in a random file.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except FileNotFoundError:
        raise ArtifactError(path, "does not exist") from None
    except OSError as exc:
        raise ArtifactError(path, f"cannot be read: {exc}") from exc
    if size < 8:
        raise ArtifactError(path, f"is {size} bytes, too short to be an ExecuTorch program")
    identifier = head[4:8]
    if not _PTE_IDENTIFIER.fullmatch(identifier):
        raise ArtifactError(
            path,
            f"is not an ExecuTorch program: its file identifier is {identifier!r}, "
            "expected b'ET' and a 2-digit version",
        )
    if head[8:12] != _EXT_HEADER_MAGIC or len(head) < 40:
        return
    # Fields (little-endian): u32 header length, u64 program size (header included),
    # u64 segment base offset, and, if the header is longer than 24 bytes, u64 segment size.
    header_length = int.from_bytes(head[12:16], "little")
    program_size = int.from_bytes(head[16:24], "little")
    segment_base = int.from_bytes(head[24:32], "little")
    segment_size = int.from_bytes(head[32:40], "little") if header_length > 24 else 0
    expected = max(program_size, segment_base + segment_size if segment_base else 0)
    if expected > size:
        raise ArtifactError(
            path, f"is truncated: its header says {expected} bytes, the file has {size}"
        )
