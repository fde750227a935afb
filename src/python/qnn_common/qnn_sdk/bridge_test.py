"""The bridge compiles from the packaged htp_bridge.c into what ExecuTorch's dlopen needs."""

from __future__ import annotations

import struct
from pathlib import Path

from qnn_common.qnn_sdk.bridge import BRIDGE_RESOURCE, compile_bridge, read_bridge_source
from qnn_common.qnn_sdk.layout import HTP_LIB

DT_NULL, DT_SONAME, DT_FLAGS_1, DF_1_NODELETE = 0, 14, 0x6FFFFFFB, 0x8
SHT_DYNAMIC = 6


def _elf_dynamic(path: Path) -> tuple[str | None, int]:
    """(DT_SONAME, DT_FLAGS_1) of a 64-bit little-endian ELF shared object."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not ELF64 LE"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    dynamic = next(s for s in sections if s[1] == SHT_DYNAMIC)
    strtab_offset = sections[dynamic[6]][4]
    soname: str | None = None
    flags_1 = 0
    for offset in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == DT_NULL:
            break
        if tag == DT_SONAME:
            start = strtab_offset + value
            soname = data[start : data.index(b"\0", start)].decode()
        elif tag == DT_FLAGS_1:
            flags_1 = value
    return soname, flags_1


def test_bridge_has_the_soname_and_nodelete(tmp_path: Path) -> None:
    source = tmp_path / BRIDGE_RESOURCE
    source.write_bytes(read_bridge_source())
    compiler = compile_bridge(source, tmp_path / HTP_LIB)
    assert Path(compiler).name in ("gcc", "cc")
    soname, flags_1 = _elf_dynamic(tmp_path / HTP_LIB)
    # The bare-name dlopen of libQnnHtp.so is satisfied by the preload only through the SONAME.
    assert soname == HTP_LIB
    # ExecuTorch dlcloses the library but keeps the interface pointers it handed out.
    assert flags_1 & DF_1_NODELETE
