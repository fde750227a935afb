"""Qualcomm SoCs and their HTP (Hexagon Tensor Processor) architectures.

The table mirrors ExecuTorch's Qualcomm backend (`QcomChipset` ids), so a name here maps one to one
onto the `soc_model` its compiler spec takes.
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass

from qnn_common.errors import ConfigValidationError


class HtpArch(enum.IntEnum):
    """HTP architecture generations, ordered: `arch >= HtpArch.V69` reads as it should."""

    V68 = 68
    V69 = 69
    V73 = 73
    V75 = 75
    V79 = 79
    V81 = 81

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Soc:
    """One SoC: its ExecuTorch `QcomChipset` id, HTP arch, VTCM size and optional LPAI core."""

    name: str
    chipset_id: int
    htp_arch: HtpArch
    vtcm_mb: int
    lpai: str | None = None


_SOCS: tuple[Soc, ...] = (
    Soc("SM8350", 30, HtpArch.V68, 4),
    Soc("SM8450", 36, HtpArch.V69, 8),
    Soc("SM8475", 42, HtpArch.V69, 8),
    Soc("SM8550", 43, HtpArch.V73, 8),
    Soc("SM8650", 57, HtpArch.V75, 8),
    Soc("SM8750", 69, HtpArch.V79, 8),
    Soc("SM8850", 87, HtpArch.V81, 8, lpai="V6"),
    Soc("SM8845", 97, HtpArch.V81, 8),
    Soc("SA8295", 39, HtpArch.V68, 8),
    Soc("SC8380XP", 60, HtpArch.V73, 8),  # Snapdragon X Elite (Windows on Arm laptops)
    Soc("SA8255", 52, HtpArch.V73, 8),
    Soc("SA8797", 72, HtpArch.V81, 16),
    Soc("QCS9100", 77, HtpArch.V73, 8),
    Soc("QCM6490", 93, HtpArch.V68, 2),
    Soc("SSG2115P", 46, HtpArch.V73, 2),
    Soc("SSG2125P", 58, HtpArch.V73, 2),
    Soc("SXR1230P", 45, HtpArch.V73, 2),
    Soc("SXR2230P", 53, HtpArch.V69, 8),
    Soc("SXR2330P", 75, HtpArch.V79, 8),
    Soc("SAR2230P", 95, HtpArch.V81, 4, lpai="V6"),
    Soc("SW6100", 96, HtpArch.V81, 4),
)

SOCS: dict[str, Soc] = {soc.name: soc for soc in _SOCS}


def soc_names() -> tuple[str, ...]:
    """All known SoC names, in table order."""
    return tuple(SOCS)


def lookup_soc(name: str, field: str = "soc") -> Soc:
    """Find a SoC by name, case-insensitively; an unknown name lists the closest matches."""
    soc = SOCS.get(name.strip().upper())
    if soc is not None:
        return soc
    close = difflib.get_close_matches(name.strip().upper(), SOCS, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigValidationError(
        field, name, f"unknown SoC; {hint}known SoCs follow", allowed=soc_names()
    )
