"""A bench result names the CPU and the vector instructions its kernels chose by."""

from __future__ import annotations

from pathlib import Path

from host import cpu_model, describe_host, kernel_flags

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 fma avx f16c avx2

processor\t: 1
model name\t: AMD EPYC
"""
SAPPHIRE = (
    "model name\t: Intel(R) Xeon(R) Platinum 8488C\n"
    "flags\t: avx2 avx512f avx512_vnni amx_int8\n"
)


def test_the_model_and_the_kernel_flags_are_read() -> None:
    assert cpu_model(EPYC) == "AMD EPYC"
    assert kernel_flags(EPYC) == ("avx2",)
    assert kernel_flags(SAPPHIRE) == ("avx2", "avx512f", "avx512_vnni", "amx_int8")


def test_the_description_names_cpu_cores_and_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(SAPPHIRE)
    described = describe_host(info)
    assert described.startswith("Intel(R) Xeon(R) Platinum 8488C, ")
    assert described.endswith(" cores, avx2 avx512f avx512_vnni amx_int8")
    info.write_text("model name\t: Old\nflags\t: sse2\n")
    assert describe_host(info).endswith("none of avx2 avx512f avx512_vnni avx_vnni amx_int8")


def test_without_cpuinfo_it_still_names_the_machine(tmp_path: Path) -> None:
    assert "cores" in describe_host(tmp_path / "missing")
