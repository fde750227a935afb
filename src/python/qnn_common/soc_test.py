"""The SoC table must match ExecuTorch's `QcomChipset` ids and the HTP arch of each part."""

from __future__ import annotations

import pytest

from qnn_common.errors import ConfigValidationError
from qnn_common.soc import SOCS, HtpArch, Soc, lookup_soc, soc_names

# name, chipset id, HTP arch, VTCM MB, LPAI: the reference the table is checked against.
EXPECTED: tuple[tuple[str, int, HtpArch, int, str | None], ...] = (
    ("SM8350", 30, HtpArch.V68, 4, None),
    ("SM8450", 36, HtpArch.V69, 8, None),
    ("SM8475", 42, HtpArch.V69, 8, None),
    ("SM8550", 43, HtpArch.V73, 8, None),
    ("SM8650", 57, HtpArch.V75, 8, None),
    ("SM8750", 69, HtpArch.V79, 8, None),
    ("SM8850", 87, HtpArch.V81, 8, "V6"),
    ("SM8845", 97, HtpArch.V81, 8, None),
    ("SA8295", 39, HtpArch.V68, 8, None),
    ("SA8255", 52, HtpArch.V73, 8, None),
    ("SA8797", 72, HtpArch.V81, 16, None),
    ("QCS9100", 77, HtpArch.V73, 8, None),
    ("QCM6490", 93, HtpArch.V68, 2, None),
    ("SSG2115P", 46, HtpArch.V73, 2, None),
    ("SSG2125P", 58, HtpArch.V73, 2, None),
    ("SXR1230P", 45, HtpArch.V73, 2, None),
    ("SXR2230P", 53, HtpArch.V69, 8, None),
    ("SXR2330P", 75, HtpArch.V79, 8, None),
    ("SAR2230P", 95, HtpArch.V81, 4, "V6"),
    ("SW6100", 96, HtpArch.V81, 4, None),
)


def test_table_has_exactly_the_expected_socs_in_order() -> None:
    assert len(SOCS) == 20
    assert soc_names() == tuple(row[0] for row in EXPECTED)


@pytest.mark.parametrize(("name", "chipset_id", "arch", "vtcm_mb", "lpai"), EXPECTED)
def test_soc_entry(
    name: str, chipset_id: int, arch: HtpArch, vtcm_mb: int, lpai: str | None
) -> None:
    soc = SOCS[name]
    assert soc == Soc(name, chipset_id, arch, vtcm_mb, lpai)
    assert soc.chipset_id == chipset_id
    assert soc.htp_arch is arch
    assert soc.vtcm_mb == vtcm_mb
    assert soc.lpai == lpai


def test_only_sm8850_and_sar2230p_have_lpai() -> None:
    assert {s.name for s in SOCS.values() if s.lpai is not None} == {"SM8850", "SAR2230P"}


def test_chipset_ids_are_unique() -> None:
    ids = [s.chipset_id for s in SOCS.values()]
    assert len(ids) == len(set(ids))


def test_names_are_unique_and_keyed_by_name() -> None:
    for key, soc in SOCS.items():
        assert key == soc.name


def test_htp_arch_is_ordered_and_prints_its_name() -> None:
    assert sorted(HtpArch) == list(HtpArch)
    assert HtpArch.V68 < HtpArch.V69 < HtpArch.V73 < HtpArch.V75 < HtpArch.V79 < HtpArch.V81
    assert str(HtpArch.V73) == "V73"
    assert f"{HtpArch.V81}" == "V81"


def test_soc_is_frozen() -> None:
    soc = SOCS["SM8650"]
    with pytest.raises(AttributeError):
        soc.vtcm_mb = 16  # type: ignore[misc]


@pytest.mark.parametrize("spelling", ["SM8650", "sm8650", "Sm8650", "  sm8650\n"])
def test_lookup_is_case_insensitive_and_strips(spelling: str) -> None:
    assert lookup_soc(spelling) is SOCS["SM8650"]


@pytest.mark.parametrize("name", [row[0] for row in EXPECTED])
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
