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


def _flatbuffer_part(pte_path: Path) -> bytes:
    """The program's flatbuffer (its size is in the extended header), without the segments:
    deserializing the whole program would mean copying every constant of a large model."""
    with pte_path.open("rb") as fh:
        head = fh.read(_HEAD_BYTES)
        size = len(head)
        if head[8:12] == _EXT_HEADER_MAGIC and len(head) >= 24:
            size = int.from_bytes(head[16:24], "little")
        fh.seek(0)
        return fh.read(size) if size > len(head) else fh.read()


class _Reader:
    """Tables of the program flatbuffer (schema: executorch/exir/_serialize/program.fbs).

    Every offset comes from the file: a corrupt one raises IndexError, ValueError or
    UnicodeDecodeError, which callers treat as "not a layout this reader knows".
    """

    def __init__(self, buf: bytes) -> None:
        self.buf = buf

    def u32(self, pos: int) -> int:
        if pos < 0 or pos + 4 > len(self.buf):
            raise IndexError(pos)
        return int.from_bytes(self.buf[pos : pos + 4], "little")

    def field(self, table: int, index: int) -> int | None:
        """Absolute position of the offset-typed field `index` of the table at `table`."""
        buf = self.buf
        vtable = table - int.from_bytes(buf[table : table + 4], "little", signed=True)
        vt_size = int.from_bytes(buf[vtable : vtable + 2], "little")
        slot = 4 + 2 * index
        if slot + 2 > vt_size:
            return None
        off = int.from_bytes(buf[vtable + slot : vtable + slot + 2], "little")
        if off == 0:
            return None
        pos = table + off
        return pos + self.u32(pos)

    def string(self, pos: int | None) -> str | None:
        if pos is None:
            return None
        return self.buf[pos + 4 : pos + 4 + self.u32(pos)].decode("utf-8")

    def tables(self, vector: int | None) -> list[int]:
        """The tables a vector-of-tables field points to."""
        if vector is None:
            return []
        count = self.u32(vector)
        if count > len(self.buf) // 4:
            raise ValueError(f"a vector of {count} entries in a {len(self.buf)}-byte buffer")
        return [vector + 4 + 4 * i + self.u32(vector + 4 + 4 * i) for i in range(count)]

    def plans(self) -> dict[str, int]:
        """Method name -> its ExecutionPlan table (Program.execution_plan, field 1)."""
        plans = self.tables(self.field(self.u32(0), 1))
        return {self.string(self.field(plan, 0)) or "": plan for plan in plans}


def _encoded_out_spec(pte_path: Path, method: str) -> str | None:
    """Program.execution_plan[method].container_meta_type.encoded_out_str, read straight from
    the flatbuffer."""
    reader = _Reader(_flatbuffer_part(pte_path))
    try:
        plan = reader.plans().get(method)
        if plan is None:
            return None
        meta = reader.field(plan, 1)  # ExecutionPlan.container_meta_type
        return None if meta is None else reader.string(reader.field(meta, 1))  # .encoded_out_str
    except (IndexError, ValueError, UnicodeDecodeError):
        return None  # not a layout this reader knows: treat every output as a user output


def program_contents(pte_path: Path) -> tuple[dict[str, list[str]], set[str]]:
    """(method -> its delegates' backend ids, in order; every operator name the program calls),
    read from the flatbuffer without the runtime.

    Raises ArtifactError if the flatbuffer cannot be read (a corrupt or foreign file).
    """
    reader = _Reader(_flatbuffer_part(pte_path))
    delegates: dict[str, list[str]] = {}
    operators: set[str] = set()
    try:
        for name, plan in reader.plans().items():
            # ExecutionPlan.delegates (7): BackendDelegate.id (0); .operators (6): Operator.name
            delegates[name] = [reader.string(reader.field(d, 0)) or ""
                               for d in reader.tables(reader.field(plan, 7))]
            operators.update(reader.string(reader.field(op, 0)) or ""
                             for op in reader.tables(reader.field(plan, 6)))
    except (IndexError, ValueError, UnicodeDecodeError) as err:
        raise ArtifactError(pte_path, f"its program table cannot be read ({err})") from None
    return delegates, operators


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
