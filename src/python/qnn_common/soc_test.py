"""The SoC table must match ExecuTorch's `QcomChipset` ids and the HTP arch of each part."""

from __future__ import annotations

import pytest

from qnn_common.errors import ConfigValidationError
from qnn_common.soc import SOCS, HtpArch, Soc, lookup_soc, soc_names


def _executorch_table() -> dict[str, tuple[int, HtpArch, int, str | None]]:
    """ExecuTorch's own SoC table (qc_schema._soc_info_table), the one its compiler uses."""
    from executorch.backends.qualcomm.serialization import qc_schema

    table = {}
    for chipset, info in qc_schema._soc_info_table.items():
        lpai = info.lpai_info.lpai_hardware_version.name if info.lpai_info is not None else None
        table[chipset.name] = (
            int(chipset), HtpArch[info.htp_info.htp_arch.name], info.htp_info.vtcm_size_in_mb, lpai
        )
    return table


def test_table_matches_executorchs_own() -> None:
    expected = _executorch_table()
    ours = {s.name: (s.chipset_id, s.htp_arch, s.vtcm_mb, s.lpai) for s in SOCS.values()}
    assert len(expected) == 21  # executorch 1.5.1; a new release may add SoCs: add them here too
    assert ours == expected


@pytest.mark.parametrize("name", ["SM8650", "SM8850", "SC8380XP", "QCM6490"])
def test_soc_entry(name: str) -> None:
    soc = SOCS[name]
    chipset_id, arch, vtcm_mb, lpai = _executorch_table()[name]
    assert soc == Soc(name, chipset_id, arch, vtcm_mb, lpai)
    assert soc.htp_arch is arch


def test_only_sm8850_and_sar2230p_have_lpai() -> None:
    assert {s.name for s in SOCS.values() if s.lpai is not None} == {"SM8850", "SAR2230P"}


def test_chipset_ids_are_unique() -> None:
    ids = [s.chipset_id for s in SOCS.values()]
    assert len(ids) == len(set(ids))


def test_htp_arch_is_ordered_and_prints_its_name() -> None:
    assert sorted(HtpArch) == list(HtpArch)
    assert HtpArch.V68 < HtpArch.V69 < HtpArch.V73 < HtpArch.V75 < HtpArch.V79 < HtpArch.V81
    assert str(HtpArch.V73) == "V73"
    assert f"{HtpArch.V81}" == "V81"


@pytest.mark.parametrize("spelling", ["SM8650", "sm8650", "Sm8650", "  sm8650\n"])
def test_lookup_is_case_insensitive_and_strips(spelling: str) -> None:
    assert lookup_soc(spelling) is SOCS["SM8650"]


@pytest.mark.parametrize("name", soc_names())
def test_lookup_every_soc_lowercase(name: str) -> None:
    assert lookup_soc(name.lower()).name == name


def test_unknown_soc_suggests_closest_match() -> None:
    with pytest.raises(ConfigValidationError) as info:
        lookup_soc("SM8655")
    err = info.value
    assert err.field == "soc"
    assert err.value == "SM8655"
    assert "unknown SoC" in str(err)
    assert "did you mean SM8650" in str(err)
    assert err.allowed == soc_names()


def test_unknown_soc_lowercase_still_suggests() -> None:
    with pytest.raises(ConfigValidationError, match="did you mean SXR2330P"):
        lookup_soc("sxr2330")


def test_unknown_soc_without_close_match_lists_all() -> None:
    with pytest.raises(ConfigValidationError) as info:
        lookup_soc("nothing-like-it")
    msg = str(info.value)
    assert "did you mean" not in msg
    for name in soc_names():
        assert name in msg


def test_unknown_soc_error_uses_the_given_field_path() -> None:
    with pytest.raises(ConfigValidationError) as info:
        lookup_soc("SM0000", field="pipeline.soc")
    assert info.value.field == "pipeline.soc"
    assert str(info.value).startswith("pipeline.soc: 'SM0000' is invalid")


def test_unknown_soc_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        lookup_soc("")
