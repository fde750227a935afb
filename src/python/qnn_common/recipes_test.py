"""Recipes, backends, and which backend / HTP arch can run which recipe."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qnn_common.config import CompileConfig, QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import (
    BACKENDS,
    RECIPES,
    Backend,
    Recipe,
    WeightGroups,
    WeightRounding,
    check_recipe,
    parse_enum,
    recipes_for,
)
from qnn_common.soc import SOCS, HtpArch, Soc
from qnn_common.weight_groups import DEFAULT_GROUP_SIZE

ALL_SOCS = tuple(SOCS.values())
QUANTIZED = tuple(r for r in Recipe if r.is_quantized)


def _oracle(backend: Backend, soc: Soc | None) -> set[Recipe]:
    """The rules, written out independently of the module under test."""
    if backend in (Backend.PORTABLE, Backend.XNNPACK):
        return {Recipe.FP32, Recipe.A8W8, Recipe.A8DW4}
    allowed = set(Recipe) - {Recipe.FP32, Recipe.A8DW4}
    if soc is not None:
        if soc.htp_arch < HtpArch.V69:
            allowed -= {Recipe.A16W4_BLOCK, Recipe.FP16}
        if soc.htp_arch < HtpArch.V73:
            allowed -= {Recipe.A16W16}
    return allowed


def _a_soc_for(backend: Backend, recipe: Recipe) -> str | None:
    """Some SoC on which `backend` runs `recipe` (None for the host backends)."""
    if backend is not Backend.QNN:
        return None
    return next(s.name for s in ALL_SOCS if recipe in recipes_for(backend, s))


def _supported_pairs() -> list[tuple[Backend, Recipe]]:
    """For every recipe, one backend that can run it."""
    pairs = []
    for recipe in Recipe:
        backend = next(
            b for b in (Backend.XNNPACK, Backend.QNN) if recipe in recipes_for(b, SOCS["SM8750"])
        )
        pairs.append((backend, recipe))
    return pairs


# --- the recipe enum and the 16a16w regression ------------------------------------------------


def test_16a16w_is_a_string_valued_member() -> None:
    assert Recipe.A16W16.value == "16a16w"
    assert Recipe("16a16w") is Recipe.A16W16
    # The upstream bug: an int-valued 16a16w equal to 0 was falsy. mypy knows str != int, hence
    # the ignore; the point is the runtime check.
    assert Recipe.A16W16 != 0  # type: ignore[comparison-overlap]


@pytest.mark.parametrize("recipe", list(Recipe))
def test_every_recipe_round_trips_through_parse_enum(recipe: Recipe) -> None:
    assert parse_enum(Recipe, recipe.value, "recipe") is recipe
    assert parse_enum(Recipe, recipe.value.upper(), "recipe") is recipe
    assert parse_enum(Recipe, f"  {recipe.value} ", "recipe") is recipe


def test_recipe_bits() -> None:
    assert Recipe.FP32.activation_bits is None and Recipe.FP32.weight_bits is None
    assert Recipe.FP16.activation_bits is None and Recipe.FP16.weight_bits is None
    bits = {r: (r.activation_bits, r.weight_bits) for r in QUANTIZED}
    assert bits == {
        Recipe.A8W8: (8, 8),
        Recipe.A8W4: (8, 4),
        Recipe.A16W8: (16, 8),
        Recipe.A16W16: (16, 16),
        Recipe.A16W4: (16, 4),
        Recipe.A16W4_BLOCK: (16, 4),
        Recipe.A16W2: (16, 2),
        Recipe.A8DW4: (8, 4),
    }
    assert {r for r in Recipe if r.is_dynamic} == {Recipe.A8DW4}


def test_is_quantized() -> None:
    assert {r for r in Recipe if not r.is_quantized} == {Recipe.FP32, Recipe.FP16}


# --- parse_enum -------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["qnn", "QNN", " Qnn "])
def test_parse_backend_case_insensitive(spelling: str) -> None:
    assert parse_enum(Backend, spelling, "backend") is Backend.QNN


def test_parse_enum_unknown_lists_allowed_values() -> None:
    with pytest.raises(ConfigValidationError) as info:
        parse_enum(Recipe, "9a9w", "pipeline.recipe")
    err = info.value
    assert err.field == "pipeline.recipe"
    assert err.value == "9a9w"
    assert err.allowed == tuple(r.value for r in Recipe)
    assert "unknown recipe" in str(err)
    assert "16a16w" in str(err)


def test_parse_enum_unknown_backend() -> None:
    with pytest.raises(ConfigValidationError, match=r"unknown backend.*xnnpack, qnn, portable"):
        parse_enum(Backend, "cuda", "backend")


# --- the rules --------------------------------------------------------------------------------


@pytest.mark.parametrize("soc", ALL_SOCS, ids=lambda s: s.name)
@pytest.mark.parametrize("backend", list(Backend))
def test_recipes_for_matches_the_rules(backend: Backend, soc: Soc) -> None:
    assert set(recipes_for(backend, soc)) == _oracle(backend, soc)


@pytest.mark.parametrize("backend", list(Backend))
def test_recipes_for_without_soc(backend: Backend) -> None:
    assert set(recipes_for(backend)) == _oracle(backend, None)


def test_recipes_for_keeps_enum_order() -> None:
    for backend in Backend:
        for soc in (None, *ALL_SOCS):
            got = recipes_for(backend, soc)
            assert list(got) == [r for r in Recipe if r in got]


@pytest.mark.parametrize("soc", ALL_SOCS, ids=lambda s: s.name)
def test_lpbq_needs_v69(soc: Soc) -> None:
    if soc.htp_arch >= HtpArch.V69:
        check_recipe(Backend.QNN, Recipe.A16W4_BLOCK, soc)
    else:
        with pytest.raises(ConfigValidationError, match=r"LPBQ \(16a4w_block\) needs HTP >= V69"):
            check_recipe(Backend.QNN, Recipe.A16W4_BLOCK, soc)


@pytest.mark.parametrize("soc", ALL_SOCS, ids=lambda s: s.name)
def test_16a16w_needs_v73(soc: Soc) -> None:
    if soc.htp_arch >= HtpArch.V73:
        check_recipe(Backend.QNN, Recipe.A16W16, soc)
    else:
        with pytest.raises(ConfigValidationError, match=r"16a16w\) needs HTP >= V73"):
            check_recipe(Backend.QNN, Recipe.A16W16, soc)


@pytest.mark.parametrize("soc", ALL_SOCS, ids=lambda s: s.name)
def test_fp16_needs_v69_on_qnn(soc: Soc) -> None:
    if soc.htp_arch >= HtpArch.V69:
        check_recipe(Backend.QNN, Recipe.FP16, soc)
    else:
        with pytest.raises(ConfigValidationError, match="float16 datapath starts at V69"):
            check_recipe(Backend.QNN, Recipe.FP16, soc)


def test_arch_error_says_why_and_lists_alternatives() -> None:
    soc = SOCS["SM8450"]  # V69
    with pytest.raises(ConfigValidationError) as info:
        check_recipe(Backend.QNN, Recipe.A16W16, soc, "compile.recipe")
    err = info.value
    msg = str(err)
    assert err.field == "compile.recipe"
    assert err.value == "16a16w"
    assert "SM8450 is V69" in msg
    assert "needs HTP >= V73" in msg
    assert "16a4w" in msg
    assert err.allowed == tuple(r.value for r in recipes_for(Backend.QNN, soc))
    assert "16a16w" not in (err.allowed or ())
    assert "(allowed: fp16, 8a8w," in msg


def test_arch_error_on_v68_lists_only_runnable_recipes() -> None:
    with pytest.raises(ConfigValidationError) as info:
        check_recipe(Backend.QNN, Recipe.A16W4_BLOCK, SOCS["SM8350"])
    assert info.value.allowed == ("8a8w", "8a4w", "16a8w", "16a4w", "16a2w")


HOST_RECIPES = (Recipe.FP32, Recipe.A8W8, Recipe.A8DW4)


@pytest.mark.parametrize("recipe", [r for r in Recipe if r not in HOST_RECIPES])
def test_xnnpack_runs_fp32_8a8w_and_8da4w_only(recipe: Recipe) -> None:
    for ok in HOST_RECIPES:
        check_recipe(Backend.XNNPACK, ok, None)
    with pytest.raises(ConfigValidationError) as info:
        check_recipe(Backend.XNNPACK, recipe, None)
    msg = str(info.value)
    assert "backend xnnpack cannot run it" in msg
    assert "XNNPACK runs fp32, 8a8w" in msg and "8da4w (int8 activations per token" in msg
    assert info.value.allowed == ("fp32", "8a8w", "8da4w")


@pytest.mark.parametrize("recipe", [r for r in Recipe if r not in HOST_RECIPES])
def test_portable_runs_fp32_8a8w_and_8da4w_only(recipe: Recipe) -> None:
    for ok in HOST_RECIPES:
        check_recipe(Backend.PORTABLE, ok, None)
    with pytest.raises(ConfigValidationError) as info:
        check_recipe(Backend.PORTABLE, recipe, None)
    assert "portable reference kernels run fp32, 8a8w and 8da4w" in str(info.value)
    assert info.value.allowed == ("fp32", "8a8w", "8da4w")


@pytest.mark.parametrize("soc", ["SM8350", "SM8650", "SM8850"])
def test_qnn_refuses_8da4w_saying_why_and_what_instead(soc: str) -> None:
    with pytest.raises(ConfigValidationError) as info:
        check_recipe(Backend.QNN, Recipe.A8DW4, SOCS[soc])
    msg = str(info.value)
    assert info.value.field == "recipe" and info.value.value == "8da4w"
    assert "per token at run time" in msg and "fixes every scale" in msg  # why not
    assert "use 16a4w" in msg  # what instead
    assert "xnnpack and portable" in msg  # where it runs
    allowed = info.value.allowed or ()
    assert "16a4w" in allowed and "8da4w" not in allowed
    with pytest.raises(ConfigValidationError, match="per token at run time"):
        CompileConfig(backend=Backend.QNN, recipe=Recipe.A8DW4, soc=soc)


def test_8da4w_group_size_rules() -> None:
    assert QuantizeConfig(recipe=Recipe.A8DW4).group_size == DEFAULT_GROUP_SIZE == 32
    assert QuantizeConfig(recipe=Recipe.A8DW4, group_size=128).group_size == 128
    # Portable takes any group that tiles the rows; XNNPACK's kernels want multiples of 32.
    assert QuantizeConfig(backend=Backend.PORTABLE, recipe=Recipe.A8DW4, group_size=16)
    with pytest.raises(ConfigValidationError, match="multiple of 32") as info:
        QuantizeConfig(recipe=Recipe.A8DW4, group_size=48)
    assert info.value.field == "quantize.group_size" and "portable takes any" in str(info.value)
    for bad in (0, 1, -32):
        with pytest.raises(ConfigValidationError, match="at least 2"):
            QuantizeConfig(backend=Backend.PORTABLE, recipe=Recipe.A8DW4, group_size=bad)
    with pytest.raises(ConfigValidationError, match="only 8da4w groups its weights"):
        QuantizeConfig(recipe=Recipe.A8W8, group_size=64)
    with pytest.raises(ConfigValidationError, match="blocks"):
        QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.A16W4_BLOCK,
                       group_size=64)


def test_8da4w_takes_no_calibration_choices() -> None:
    cfg = QuantizeConfig(recipe=Recipe.A8DW4)
    assert cfg.rounding is WeightRounding.NEAREST  # GPTQ would need calibration inputs
    with pytest.raises(ConfigValidationError, match="takes none") as info:
        QuantizeConfig(recipe=Recipe.A8DW4, weight_rounding=WeightRounding.GPTQ)
    assert "use weight_rounding nearest" in str(info.value)
    with pytest.raises(ConfigValidationError, match="at run time already"):
        QuantizeConfig(recipe=Recipe.A8DW4, dynamic_layers=("layers",))
    assert QuantizeConfig(recipe=Recipe.A8DW4, dynamic_layers=()).dynamic_layers == ()
    with pytest.raises(ConfigValidationError, match="one scale per group"):
        QuantizeConfig(recipe=Recipe.A8DW4, per_channel=False)


def test_qnn_refuses_fp32_and_points_at_fp16() -> None:
    with pytest.raises(ConfigValidationError) as info:
        check_recipe(Backend.QNN, Recipe.FP32, SOCS["SM8650"])
    assert "no fp32 datapath; use fp16" in str(info.value)
    assert "fp16" in (info.value.allowed or ())


@pytest.mark.parametrize("recipe", list(Recipe))
def test_qnn_needs_a_soc(recipe: Recipe) -> None:
    with pytest.raises(ConfigValidationError) as info:
        check_recipe(Backend.QNN, recipe, None)
    assert info.value.field == "soc"
    assert "compiles for one SoC" in str(info.value)


def test_host_backends_ignore_the_soc() -> None:
    check_recipe(Backend.XNNPACK, Recipe.A8W8, SOCS["SM8350"])
    check_recipe(Backend.PORTABLE, Recipe.FP32, SOCS["SM8350"])


# --- property: validation and configs agree with recipes_for ---------------------------------


@settings(max_examples=150, derandomize=True, deadline=None, database=None)
@given(
    backend=st.sampled_from(list(Backend)),
    recipe=st.sampled_from(list(Recipe)),
    soc=st.none() | st.sampled_from(ALL_SOCS),
)
def test_check_recipe_and_configs_agree_with_recipes_for(
    backend: Backend, recipe: Recipe, soc: Soc | None
) -> None:
    invalid = (backend is Backend.QNN and soc is None) or recipe not in recipes_for(backend, soc)
    needs_soc = backend is Backend.QNN and soc is None
    assert invalid == (needs_soc or recipe not in _oracle(backend, soc))

    raised = False
    try:
        check_recipe(backend, recipe, soc)
    except ConfigValidationError:
        raised = True
    assert raised == invalid

    soc_name = None if soc is None else soc.name.lower()
    # A target is a backend plus a SoC exactly when the backend compiles for one.
    if invalid or (backend is not Backend.QNN and soc is not None):
        with pytest.raises(ConfigValidationError):
            CompileConfig(backend=backend, recipe=recipe, soc=soc_name)
        with pytest.raises(ConfigValidationError):
            QuantizeConfig(backend=backend, recipe=recipe, soc=soc_name)
        return

    assert CompileConfig(backend=backend, recipe=recipe, soc=soc_name).recipe is recipe
    if recipe.is_quantized:
        assert QuantizeConfig(backend=backend, recipe=recipe, soc=soc_name).recipe is recipe
    else:
        with pytest.raises(ConfigValidationError, match="skip the quantize stage"):
            QuantizeConfig(backend=backend, recipe=recipe, soc=soc_name)
    assert CompileConfig(backend=backend, recipe=recipe, soc=soc_name).target.soc == soc


@pytest.mark.parametrize("backend", list(Backend))
def test_backend_traits_agree_with_the_recipe_rules(backend: Backend) -> None:
    traits = BACKENDS[backend]
    assert traits.float_recipe in traits.recipes
    soc = SOCS["SM8650"] if traits.needs_soc else None
    check_recipe(backend, traits.float_recipe, soc)  # the float default is always allowed
    # Run-time activation scales are what 8da4w is: a backend runs it exactly when it has them.
    assert (Recipe.A8DW4 in traits.recipes) is traits.dynamic_activations


@pytest.mark.parametrize("recipe", list(Recipe))
def test_recipe_traits_agree_with_the_recipe_and_the_backends(recipe: Recipe) -> None:
    traits = RECIPES[recipe]
    assert recipe.traits is traits
    # The name a user types spells the traits: "<a>[d]a<w>w[_block]", or a float.
    if traits.activation_bits is None:
        assert traits.weight_bits is None and recipe.value.startswith("fp")
        assert traits.qnn_dtype is None and traits.weight_groups is None and not traits.dynamic
    else:
        d = "d" if traits.dynamic else ""
        assert recipe.value.startswith(f"{traits.activation_bits}{d}a{traits.weight_bits}w")
        assert (recipe.value.endswith("_block")) is (traits.weight_groups is WeightGroups.LPBQ)
    # Groups of scales are for 4-bit weights only.
    assert traits.weight_groups is None or traits.weight_bits == 4
    # QNN quantizes exactly the recipes that name a QuantDtype; its float recipe is fp16.
    on_qnn = recipe in BACKENDS[Backend.QNN].recipes
    assert (traits.qnn_dtype is not None) is (on_qnn and recipe.is_quantized)
    # A run-time activation scale needs a backend that has them (the HTP fixes every scale).
    assert not traits.dynamic or all(
        BACKENDS[b].dynamic_activations for b in Backend if recipe in BACKENDS[b].recipes)
    # An HTP floor is a QNN rule: the recipe runs there from that arch on, not before.
    if traits.htp_floor is not None:
        assert on_qnn
        for soc in ALL_SOCS:
            assert (recipe in recipes_for(Backend.QNN, soc)) is (
                soc.htp_arch >= traits.htp_floor.arch)


# --- no backend branch outside the backend modules ----------------------------------------------

# What varies by backend lives in these modules (each a registry of one module per backend, or
# the modules themselves), and in `BACKENDS`' entries; everywhere else reads a fact of
# `BackendTraits` or calls the stage's registry (src/python/qnn_compile/backends/README.md).
BACKEND_MODULES: tuple[tuple[str, str], ...] = (
    ("qnn_compile/backends/", "the compile stage's CompileBackend per backend"),
    ("qnn_quant/quantizers/", "the quantize stage's QuantBackend per backend"),
    ("qnn_infer/backends/", "the infer stage's InferBackend per backend"),
)
_SOURCES = Path("src/python")  # the checkout's, or the sandbox's (//:python_sources_text)


def _names_a_backend(node: ast.AST) -> bool:
    """Whether `node` spells a backend: `Backend.QNN` and friends, a backend's value ("qnn") or
    its delegate id ("QnnBackend")."""
    spelled = {b.value for b in Backend} | {
        t.runtime_id for t in BACKENDS.values() if t.runtime_id is not None}
    for n in ast.walk(node):
        if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "Backend" and n.attr in Backend.__members__):
            return True
        if isinstance(n, ast.Constant) and n.value in spelled:
            return True
    return False


def backend_branches(source: str) -> list[int]:
    """Lines of `source` that compare with a backend (`is`, `==`, `in` ...) or match on one."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and _names_a_backend(node):
            lines.append(node.lineno)
        elif isinstance(node, ast.match_case) and _names_a_backend(node.pattern):
            lines.append(node.pattern.lineno)
    return sorted(lines)


def test_the_scan_finds_each_kind_of_branch() -> None:
    source = (
        "a = x if backend is Backend.QNN else y\n"
        "b = backend in (Backend.XNNPACK, Backend.PORTABLE)\n"
        'c = backend_id == "QnnBackend"\n'
        "match backend:\n    case Backend.QNN:\n        pass\n"
        "d = {Backend.QNN: 1}[backend]\n"  # a table, not a branch
        "e = BACKENDS[backend].needs_soc\n"
    )
    assert backend_branches(source) == [1, 2, 3, 5]


def test_no_backend_branch_outside_the_backend_modules() -> None:
    assert _SOURCES.is_dir(), f"run from the repository root: no {_SOURCES}"
    allowed = tuple(prefix for prefix, _ in BACKEND_MODULES)
    found = []
    for path in sorted(_SOURCES.rglob("*.py")):
        name = path.relative_to(_SOURCES).as_posix()
        if path.name.endswith("_test.py") or path.name == "conftest.py" or name.startswith(allowed):
            continue
        found += [f"{name}:{line}" for line in backend_branches(path.read_text())]
    assert not found, (
        f"a backend branch outside the backend modules: {', '.join(found)}. Make it a fact of "
        "BackendTraits (qnn_common/recipes.py) or a field of the stage's backend type "
        "(CompileBackend, QuantBackend, InferBackend), as qnn_compile/backends/README.md says"
    )
