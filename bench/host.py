"""What a bench result says about the machine it ran on.

The ratios against other runtimes depend on the CPU's vector instructions more than on anything
in this repository: XNNPACK and llama.cpp each pick kernels by them at run time (AVX2 only, or
AVX-512 with VNNI, or AMX), so a result names the CPU and which of those it has.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The instruction-set flags (as /proc/cpuinfo spells them) the int8 / int4 kernels choose by.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_model(cpuinfo: str) -> str:
    """The first "model name" of a /proc/cpuinfo text ("" if none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return ""


def kernel_flags(cpuinfo: str) -> tuple[str, ...]:
    """Which of KERNEL_FLAGS the first CPU of a /proc/cpuinfo text has, in that order."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            have = set(value.split())
            return tuple(f for f in KERNEL_FLAGS if f in have)
    return ()


def describe_host(cpuinfo_path: Path = Path("/proc/cpuinfo")) -> str:
    """E.g. "AMD EPYC, x86_64, 2 cores, avx2": the CPU, its cores and its kernel flags."""
    try:
        cpuinfo = cpuinfo_path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux: the architecture and core count only
        cpuinfo = ""
    parts = [cpu_model(cpuinfo), platform.machine(), f"{os.cpu_count()} cores"]
    flags = kernel_flags(cpuinfo)
    if cpuinfo:
        parts.append(" ".join(flags) if flags else "none of " + " ".join(KERNEL_FLAGS))
    return ", ".join(p for p in parts if p)
