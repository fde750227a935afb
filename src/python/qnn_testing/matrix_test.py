"""The matrix: targets, precisions per arch, modes, and no cell resolving to nothing."""

from __future__ import annotations

import enum

import pytest

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import HtpArch
from qnn_testing.cases import CATALOGUE
from qnn_testing.expect import Crashes, Measure, Raises, Rule, XFail, resolve
from qnn_testing.matrix import (
    DEFAULT_ARCH,
    PRECISIONS,
    TARGETS,
    TARGETS_BY_NAME,
    Mode,
    Shard,
    _dealt,
    cells,
    dealt_to,
    mode_from_env,
    shard_from_env,
    soc_for_arch,
    targets_from_env,
)


def test_catalogue_size_and_unique_names() -> None:
    assert len(CATALOGUE) >= 150
    assert len({c.name for c in CATALOGUE}) == len(CATALOGUE)


def test_one_target_per_arch_with_its_soc_from_the_table() -> None:
    names = [t.name for t in TARGETS]
    assert names == [
        "xnnpack",
        "portable",
        "qnn-v68",
        "qnn-v69",
        "qnn-v73",
        "qnn-v75",
        "qnn-v79",
        "qnn-v81",
    ]
    assert soc_for_arch(HtpArch.V75).name == "SM8650"
    for target in TARGETS:
        if target.arch is not None:
            soc = target.target.soc
            assert soc is not None and soc.htp_arch is target.arch


def test_precisions_follow_the_arch_floors() -> None:
    by = TARGETS_BY_NAME
    assert by["xnnpack"].precisions == (Recipe.FP32, Recipe.A8W8)
    assert by["qnn-v68"].precisions == (Recipe.A8W8, Recipe.A16W8, Recipe.A16W4)
    assert Recipe.A16W16 not in by["qnn-v69"].precisions
    assert by["qnn-v75"].precisions == tuple(p for p in PRECISIONS if p is not Recipe.FP32)


class _UpstreamQuantDtype(enum.IntEnum):
    """ExecuTorch's QuantDtype numbering: use_16a16w is 0."""

    use_16a16w = 0
    use_16a8w = 1


def test_a_zero_valued_recipe_enum_is_not_read_as_no_recipe() -> None:
    # The upstream bug: `if dtype := getattr(QuantDtype, name)` skipped 16a16w (value 0).
    assert not _UpstreamQuantDtype.use_16a16w  # falsy: the trap is real
    # Here 16a16w is a cell on every arch from V73 on, in both modes, and resolves to checks.
    for mode in Mode:
        got = {(c.target.name, c.precision) for c in cells(CATALOGUE, TARGETS, mode)}
        for name in ("qnn-v73", "qnn-v75", "qnn-v79", "qnn-v81"):
            assert (name, Recipe.A16W16) in got, (mode, name)
    # A rule whose outcome is falsy-looking still wins: resolution tests `is None`.
    rule = Rule(precisions="16a16w", outcome=Measure(()))
    outcome, _ = resolve((rule,), "qnn-v75", Backend.QNN, Recipe.A16W16)
    assert outcome == Measure(())


def test_default_mode_deals_the_catalogue_across_backends_and_subsets_on_other_archs() -> None:
    default = list(cells(CATALOGUE, TARGETS, Mode.DEFAULT))
    per_target: dict[str, list[tuple[str, Recipe]]] = {}
    for cell in default:
        per_target.setdefault(cell.target.name, []).append((cell.case, cell.precision))
    v75_target = TARGETS_BY_NAME[f"qnn-{DEFAULT_ARCH.name.lower()}"]
    catalogue_targets = [TARGETS_BY_NAME["xnnpack"], v75_target, TARGETS_BY_NAME["portable"]]
    # Every case of the catalogue runs, each dealt to one of the three in turn: about a third each.
    shares = {t.name: {c.name for c in dealt_to(t, CATALOGUE)} for t in catalogue_targets}
    assert sorted(n for names in shares.values() for n in names) == sorted(
        c.name for c in CATALOGUE)
    assert all(len(names) >= len(CATALOGUE) // 3 for names in shares.values()), shares
    assert {c.case for c in default} == {c.name for c in CATALOGUE}
    # XNNPACK: the smoke subset at fp32 and 8a8w, every other case dealt to it once, the two
    # precisions dealt in turn.
    xnnpack = per_target["xnnpack"]
    smoke_names = {c.name for c in CATALOGUE if c.smoke}
    assert {case for case, _ in xnnpack} == smoke_names | shares["xnnpack"]
    assert len(xnnpack) == len(shares["xnnpack"] - smoke_names) + 2 * len(smoke_names)
    for name in smoke_names:
        assert {p for case, p in xnnpack if case == name} == {Recipe.FP32, Recipe.A8W8}
    # A dealt case keeps the precision the deal over the whole catalogue (every case on this
    # target, precisions in turn) gives it: the cells that run are ones those runs measured.
    whole = {c.case: c.precision for c in _dealt(
        TARGETS_BY_NAME["xnnpack"], [c for c in CATALOGUE if not c.smoke], lpbq_needs_linear=False)}
    assert {(case, p) for case, p in xnnpack if case not in smoke_names} == {
        (case, p) for case, p in whole.items() if case in shares["xnnpack"]}
    assert abs(list(whole.values()).count(Recipe.FP32) - list(whole.values()).count(
        Recipe.A8W8)) <= 1
    # Portable: each case dealt to it once, at its precision in the whole-catalogue deal.
    portable = per_target["portable"]
    assert sorted(case for case, _ in portable) == sorted(shares["portable"])
    whole = {c.case: c.precision for c in _dealt(
        TARGETS_BY_NAME["portable"], CATALOGUE, lpbq_needs_linear=False)}
    assert set(portable) == {(case, p) for case, p in whole.items() if case in shares["portable"]}
    assert {p for _, p in portable} == {Recipe.FP32, Recipe.A8W8}
    for target in TARGETS:
        if target.backend is not Backend.QNN:
            continue
        run = per_target[target.name]
        assert len({case for case, _ in run}) >= 15, target
        assert {p for _, p in run} == set(target.precisions), target  # every precision
        assert len(run) == len(set(run))  # no cell twice
    v75 = per_target[v75_target.name]
    qnn_cases = [c for c in CATALOGUE if c.qnn]
    assert len(qnn_cases) >= 10
    for case in qnn_cases:
        assert {p for name, p in v75 if name == case.name} == set(v75_target.precisions)
    # Every other case dealt to V75 exactly once, the precisions dealt round-robin, LPBQ only to
    # cases with a linear layer (a case without one would only show the refusal).
    others = [c for c in CATALOGUE if not c.qnn and c.name in shares[v75_target.name]]
    dealt = {name: p for name, p in v75 if name not in {c.name for c in qnn_cases}}
    assert len(v75) == len(qnn_cases) * len(v75_target.precisions) + len(others)
    assert set(dealt) == {c.name for c in others}
    whole = {c.case: c.precision for c in _dealt(
        v75_target, [c for c in CATALOGUE if not c.qnn], lpbq_needs_linear=True)}
    assert dealt == {case: p for case, p in whole.items() if case in dealt}
    counts = [sum(1 for p in whole.values() if p is q) for q in v75_target.precisions]
    # Round-robin over the whole catalogue: no precision gets more than one extra turn, save
    # LPBQ, whose turns the cases without a linear layer pass on.
    lpbq = v75_target.precisions.index(Recipe.A16W4_BLOCK)
    rest = counts[:lpbq] + counts[lpbq + 1 :]
    assert max(rest) - min(rest) <= 1 and 0 < counts[lpbq] <= min(rest), counts
    assert all(c.linear for c in others if dealt[c.name] is Recipe.A16W4_BLOCK)
    # The other archs: the smoke subset, plain round-robin, one cell per case.
    smoke = [c for c in CATALOGUE if c.smoke]
    for target in TARGETS:
        if target.backend is Backend.QNN and target.arch is not DEFAULT_ARCH:
            ps = target.precisions
            assert per_target[target.name] == [
                (c.name, ps[i % len(ps)]) for i, c in enumerate(smoke)
            ], target
    full = list(cells(CATALOGUE, TARGETS, Mode.FULL))
    assert len(full) == sum(len(t.precisions) for t in TARGETS) * len(CATALOGUE)


def test_every_cell_resolves_to_exactly_one_outcome() -> None:
    index = {c.name: c for c in CATALOGUE}
    for cell in cells(CATALOGUE, TARGETS, Mode.FULL):
        case = index[cell.case]
        outcome, _ = resolve(case.all_rules, cell.target.name, cell.target.backend, cell.precision)
        assert isinstance(outcome, Measure | XFail | Raises | Crashes)
        if isinstance(outcome, Measure):
            assert outcome.checks, cell.id  # no test that asserts nothing
        else:
            assert outcome.reason, cell.id  # every expected failure says why


def test_ids_select_as_people_expect() -> None:
    ids = [c.id for c in cells(CATALOGUE, TARGETS, Mode.DEFAULT)]
    assert "conv2d-qnn-v75-8a8w" in ids and "conv2d-xnnpack-fp32" in ids


def test_environment_selects_mode_and_targets() -> None:
    assert mode_from_env({}) is Mode.DEFAULT
    assert mode_from_env({"QNN_OP_SUITE": "FULL"}) is Mode.FULL
    with pytest.raises(ConfigValidationError, match="QNN_OP_SUITE"):
        mode_from_env({"QNN_OP_SUITE": "everything"})
    assert targets_from_env({}) == TARGETS
    assert [t.name for t in targets_from_env({"QNN_OP_TARGETS": "qnn-v73, xnnpack"})] == [
        "qnn-v73",
        "xnnpack",
    ]
    with pytest.raises(ConfigValidationError, match="qnn-v99"):
        targets_from_env({"QNN_OP_TARGETS": "qnn-v99"})


@pytest.mark.parametrize("mode", list(Mode))
def test_shards_split_the_cells_by_case_without_loss_or_overlap(mode: Mode) -> None:
    whole = list(cells(CATALOGUE, TARGETS, mode))
    shares = [list(cells(CATALOGUE, TARGETS, mode, Shard(k, 2))) for k in (1, 2)]
    assert sorted(c.id for s in shares for c in s) == sorted(c.id for c in whole)
    assert not {c.case for c in shares[0]} & {c.case for c in shares[1]}
    assert min(len(s) for s in shares) > len(whole) // 3  # about even


def test_the_shard_comes_from_the_environment() -> None:
    assert shard_from_env({}) == Shard(1, 1)
    assert shard_from_env({"QNN_OP_SHARD": "2/3"}) == Shard(2, 3)
    for bad in ("3/2", "0/2", "1", "a/b"):
        with pytest.raises(ConfigValidationError, match="QNN_OP_SHARD"):
            shard_from_env({"QNN_OP_SHARD": bad})
