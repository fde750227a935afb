"""The pipeline context: stage configs built consistently, from flat settings and from TOML."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from qnn_common.config import (
    DEFAULT_SEED,
    CompileConfig,
    InferConfig,
    PrepareConfig,
    QuantizeConfig,
    Stage,
)
from qnn_common.errors import ConfigValidationError, PipelineError
from qnn_common.gates import AccuracyGates, default_accuracy_gates
from qnn_common.recipes import Backend, Recipe, recipes_for
from qnn_common.soc import SOCS
from qnn_pipeline.context import PipelineContext, load_pipeline_toml, pipeline_from_mapping

WriteToml = Callable[[str], Path]


@pytest.fixture
def write_toml(tmp_path: Path) -> WriteToml:
    """Write a TOML text to a fresh file under tmp_path and return its path."""
    counter = iter(range(1_000_000))

    def write(text: str) -> Path:
        path = tmp_path / f"pipeline{next(counter)}.toml"
        path.write_text(text, encoding="utf-8")
        return path

    return write


def _raises_cve(fn: Callable[[], object]) -> ConfigValidationError:
    with pytest.raises(ConfigValidationError) as info:
        fn()
    return info.value


# --- Stage ------------------------------------------------------------------------------------


def test_stages_in_pipeline_order() -> None:
    assert [s.value for s in Stage] == ["prepare", "quantize", "compile", "infer"]
    assert [s.position for s in Stage] == [0, 1, 2, 3]


# --- PipelineContext.create -------------------------------------------------------------------


def test_create_takes_stages_by_name_as_users_type_them() -> None:
    ctx = PipelineContext.create("tiny-cnn", skip="Infer", stop_after="compile")
    assert ctx.skip == frozenset({Stage.INFER}) and ctx.stop_after is Stage.COMPILE
    ctx = PipelineContext.create("tiny-cnn", skip=["quantize", Stage.INFER])
    assert ctx.skip == frozenset({Stage.QUANTIZE, Stage.INFER})
    assert ctx.recipe is Recipe.FP32  # quantize skipped: the float recipe
    with pytest.raises(ConfigValidationError, match="pipeline.stop_after") as err:
        PipelineContext.create("tiny-cnn", stop_after="quantise")
    assert "quantize" in str(err.value)  # the allowed names


def test_create_defaults() -> None:
    ctx = PipelineContext.create("minilm")
    assert ctx.prepare == PrepareConfig(model="minilm")
    assert ctx.prepare.seq_len == 128
    assert ctx.prepare.calibration_samples == 16
    assert ctx.prepare.eval_samples == 4
    assert ctx.prepare.calibration_file is None
    assert ctx.prepare.seed == DEFAULT_SEED == 1126
    assert ctx.quantize == QuantizeConfig(backend=Backend.XNNPACK, recipe=Recipe.A8W8, soc=None)
    assert ctx.quantize.per_channel is True
    assert ctx.quantize.report_layers == 10
    assert ctx.compile == CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.A8W8, soc=None)
    assert ctx.compile.etrecord is False
    assert ctx.infer == InferConfig()
    assert (ctx.infer.warmup, ctx.infer.runs, ctx.infer.etdump) == (3, 20, False)
    assert ctx.infer.inputs_file is None
    assert ctx.out_dir == Path("out")
    assert ctx.skip == frozenset()
    assert ctx.stop_after is None
    assert ctx.force is False
    assert (ctx.backend, ctx.recipe, ctx.soc) == (Backend.XNNPACK, Recipe.A8W8, None)


def test_create_qnn_defaults_to_8a8w_and_canonical_soc_name() -> None:
    ctx = PipelineContext.create("m", backend=Backend.QNN, soc=" sm8650 ")
    assert ctx.recipe is Recipe.A8W8
    assert ctx.soc == "SM8650"
    assert ctx.quantize is not None and ctx.quantize.soc == "SM8650"
    assert ctx.compile.soc_info is not None and ctx.compile.soc_info.chipset_id == 57
    assert ctx.quantize.soc_info == ctx.compile.soc_info


def test_create_unknown_soc_names_pipeline_soc() -> None:
    err = _raises_cve(lambda: PipelineContext.create("m", backend=Backend.QNN, soc="SM8655"))
    assert err.field == "pipeline.soc"
    assert "did you mean SM8650" in str(err)


def test_create_qnn_without_soc() -> None:
    err = _raises_cve(lambda: PipelineContext.create("m", backend=Backend.QNN))
    assert err.field == "soc"


def test_skip_quantize_gives_fp32() -> None:
    ctx = PipelineContext.create("m", skip=frozenset({Stage.QUANTIZE}))
    assert ctx.recipe is Recipe.FP32
    assert ctx.quantize is None
    assert ctx.skip == {Stage.QUANTIZE}


def test_skip_quantize_on_portable_gives_fp32() -> None:
    ctx = PipelineContext.create("m", backend=Backend.PORTABLE, skip=frozenset({Stage.QUANTIZE}))
    assert ctx.recipe is Recipe.FP32


def test_skip_quantize_on_qnn_gives_fp16() -> None:
    ctx = PipelineContext.create(
        "m", backend=Backend.QNN, soc="SM8650", skip=frozenset({Stage.QUANTIZE})
    )
    assert ctx.recipe is Recipe.FP16
    assert ctx.quantize is None


def test_skip_quantize_on_v68_qnn_has_no_float_recipe() -> None:
    err = _raises_cve(
        lambda: PipelineContext.create(
            "m", backend=Backend.QNN, soc="SM8350", skip=frozenset({Stage.QUANTIZE})
        )
    )
    assert "float16 datapath starts at V69" in str(err)


def test_float_recipe_skips_quantize_by_itself() -> None:
    ctx = PipelineContext.create("m", recipe=Recipe.FP32)
    assert ctx.quantize is None
    assert Stage.QUANTIZE in ctx.skip


def test_explicit_quantized_recipe_with_skip_quantize_is_an_error() -> None:
    err = _raises_cve(
        lambda: PipelineContext.create(
            "m", recipe=Recipe.A8W8, skip=frozenset({Stage.QUANTIZE})
        )
    )
    assert err.field == "pipeline.recipe"
    assert err.value == "8a8w"
    assert "quantize is skipped" in str(err)
    assert "fp32 or fp16" in str(err)


@pytest.mark.parametrize("stage", [Stage.PREPARE, Stage.COMPILE])
def test_skip_prepare_or_compile_is_an_error(stage: Stage) -> None:
    err = _raises_cve(lambda: PipelineContext.create("m", skip=frozenset({stage})))
    assert err.field == "pipeline.skip"
    assert err.allowed == ("quantize", "infer")
    assert "--from" in str(err)


def test_skip_infer_is_allowed() -> None:
    ctx = PipelineContext.create("m", skip=frozenset({Stage.INFER}))
    assert ctx.skip == {Stage.INFER}
    assert ctx.quantize is not None


def test_create_passes_stage_tables() -> None:
    ctx = PipelineContext.create(
        "m",
        prepare={"seq_len": 64, "calibration_file": "calib.pt"},
        quantize={"per_channel": False},
        compile={"etrecord": True},
        infer={"runs": 5, "warmup": 0},
        out_dir=Path("elsewhere"),
        stop_after=Stage.COMPILE,
        force=True,
    )
    assert ctx.prepare.seq_len == 64
    assert ctx.prepare.calibration_file == Path("calib.pt")
    assert ctx.quantize is not None and ctx.quantize.per_channel is False
    assert ctx.compile.etrecord is True
    assert (ctx.infer.runs, ctx.infer.warmup) == (5, 0)
    assert ctx.out_dir == Path("elsewhere")
    assert ctx.stop_after is Stage.COMPILE
    assert ctx.force is True


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"prepare": {"seq_len": 0}}, "prepare.seq_len"),
        ({"prepare": {"calibration_samples": -1}}, "prepare.calibration_samples"),
        ({"prepare": {"eval_samples": 0}}, "prepare.eval_samples"),
        ({"prepare": {"seed": -1}}, "prepare.seed"),
        ({"quantize": {"report_layers": -1}}, "quantize.report_layers"),
        ({"infer": {"runs": 0}}, "infer.runs"),
        ({"infer": {"warmup": -1}}, "infer.warmup"),
    ],
)
def test_out_of_range_values_name_the_field(table: dict[str, Any], field: str) -> None:
    err = _raises_cve(lambda: PipelineContext.create("m", **table))
    assert err.field == field
    assert "must be an integer >=" in str(err)


@pytest.mark.parametrize("model", ["", "   "])
def test_empty_model_is_an_error(model: str) -> None:
    err = _raises_cve(lambda: PipelineContext.create(model))
    assert err.field == "prepare.model"


def test_quantize_and_compile_must_agree() -> None:
    err = _raises_cve(
        lambda: PipelineContext(
            prepare=PrepareConfig(model="m"),
            quantize=QuantizeConfig(recipe=Recipe.A8W8),
            compile=CompileConfig(recipe=Recipe.FP32),
        )
    )
    assert "must agree" in str(err)


def test_quantized_compile_needs_quantize() -> None:
    err = _raises_cve(
        lambda: PipelineContext(
            prepare=PrepareConfig(model="m"),
            quantize=None,
            compile=CompileConfig(recipe=Recipe.A8W8),
        )
    )
    assert err.field == "pipeline.recipe"


def test_quantize_config_refuses_float_recipe() -> None:
    err = _raises_cve(lambda: QuantizeConfig(recipe=Recipe.FP32))
    assert err.field == "quantize.recipe"
    assert "skip the quantize stage" in str(err)
    assert err.allowed is not None and "fp32" not in err.allowed and "16a16w" in err.allowed


def test_stage_config_soc_errors_name_their_section() -> None:
    assert _raises_cve(lambda: QuantizeConfig(backend=Backend.QNN, soc="bogus")).field == (
        "quantize.soc"
    )
    assert _raises_cve(lambda: CompileConfig(backend=Backend.QNN, soc="bogus")).field == (
        "compile.soc"
    )


def test_compile_recipe_error_names_compile_recipe() -> None:
    err = _raises_cve(lambda: CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.A16W4))
    assert err.field == "compile.recipe"


@pytest.mark.parametrize("value", [True, 1.5, "3"])
def test_positive_ints_refuse_bools_floats_strings(value: object) -> None:
    # Deliberately the wrong type: callers without a type checker get a clear error too.
    err = _raises_cve(lambda: InferConfig(runs=value))  # type: ignore[arg-type]
    assert err.field == "infer.runs"


# --- hashable ---------------------------------------------------------------------------------


def test_configs_are_hashable_and_comparable() -> None:
    a = PipelineContext.create("m", skip=frozenset({Stage.INFER}))
    b = PipelineContext.create("m", skip=frozenset({Stage.INFER}))
    assert a == b
    assert hash(a.compile) == hash(b.compile)


# --- TOML -------------------------------------------------------------------------------------

FULL_TOML = """
[pipeline]
model = "minilm"
backend = "qnn"
recipe = "16a4w"
soc = "SM8650"
out = "build/out"
skip = ["infer"]
stop_after = "compile"
force = true

[prepare]
seq_len = 64
calibration_samples = 8
eval_samples = 2
calibration_file = "calib.pt"
seed = 7

[quantize]
per_channel = false
report_layers = 0

[compile]
etrecord = true

[infer]
warmup = 1
runs = 5
inputs_file = "in.pt"
etdump = true
"""


def test_load_valid_file(write_toml: WriteToml) -> None:
    ctx = load_pipeline_toml(write_toml(FULL_TOML))
    assert ctx.prepare == PrepareConfig(
        model="minilm",
        seq_len=64,
        calibration_samples=8,
        eval_samples=2,
        calibration_file=Path("calib.pt"),
        seed=7,
    )
    assert ctx.quantize == QuantizeConfig(
        backend=Backend.QNN, recipe=Recipe.A16W4, soc="SM8650", per_channel=False, report_layers=0
    )
    assert ctx.compile == CompileConfig(
        backend=Backend.QNN, recipe=Recipe.A16W4, soc="SM8650", etrecord=True
    )
    assert ctx.infer == InferConfig(warmup=1, runs=5, inputs_file=Path("in.pt"), etdump=True)
    assert ctx.out_dir == Path("build/out")
    assert ctx.skip == {Stage.INFER}
    assert ctx.stop_after is Stage.COMPILE
    assert ctx.force is True


def test_load_minimal_file_matches_create(write_toml: WriteToml) -> None:
    assert load_pipeline_toml(write_toml('[pipeline]\nmodel = "m"\n')) == (
        PipelineContext.create("m")
    )


def test_load_skip_as_comma_string(write_toml: WriteToml) -> None:
    ctx = load_pipeline_toml(write_toml('[pipeline]\nmodel = "m"\nskip = "quantize,infer"\n'))
    assert ctx.skip == {Stage.QUANTIZE, Stage.INFER}
    assert ctx.recipe is Recipe.FP32


def test_load_unknown_section(write_toml: WriteToml) -> None:
    err = _raises_cve(lambda: load_pipeline_toml(write_toml('[pipeline]\nmodel="m"\n[quantise]\n')))
    assert err.field == "quantise"
    assert "unknown key" in str(err)
    assert err.allowed == ("pipeline", "prepare", "quantize", "compile", "infer")


def test_load_section_that_is_not_a_table(write_toml: WriteToml) -> None:
    path = write_toml('prepare = 3\n[pipeline]\nmodel="m"\n')
    err = _raises_cve(lambda: load_pipeline_toml(path))
    assert err.field == "prepare"
    assert "must be a table" in str(err)


def test_load_unknown_stage_key_names_path_and_lists_allowed(write_toml: WriteToml) -> None:
    err = _raises_cve(
        lambda: load_pipeline_toml(write_toml('[pipeline]\nmodel="m"\n[prepare]\nseqlen = 64\n'))
    )
    assert err.field == "prepare.seqlen"
    msg = str(err)
    assert msg.startswith("prepare.seqlen: 64 is invalid: unknown key")
    assert err.allowed == ("seq_len", "calibration_samples", "eval_samples", "calibration_file",
                           "seed", "kv_cache", "max_seq_len", "prefill_len", "kv_io",
                           "custom_ops", "attention_sink")
    assert "seq_len" in msg


def test_load_unknown_pipeline_key(write_toml: WriteToml) -> None:
    err = _raises_cve(lambda: load_pipeline_toml(write_toml('[pipeline]\nmodel="m"\nsocc="x"\n')))
    assert err.field == "pipeline.socc"
    assert err.allowed is not None and "soc" in err.allowed and "stop_after" in err.allowed


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ('[prepare]\nseq_len = "128"\n', "prepare.seq_len", "must be an integer"),
        ("[prepare]\nseq_len = 12.5\n", "prepare.seq_len", "must be an integer"),
        ("[prepare]\nseq_len = true\n", "prepare.seq_len", "must be an integer"),
        ("[quantize]\nper_channel = 1\n", "quantize.per_channel", "must be true or false"),
        ('[compile]\netrecord = "yes"\n', "compile.etrecord", "must be true or false"),
        ("[infer]\ninputs_file = 3\n", "infer.inputs_file", "must be a path string"),
        ("[pipeline]\nforce = 1\n", "pipeline.force", "must be true or false"),
        ("[pipeline]\nbackend = 1\n", "pipeline.backend", "must be a string"),
        ("[pipeline]\nskip = 1\n", "pipeline.skip", "must be a list"),
        ("[pipeline]\nout = 1\n", "pipeline.out", "must be a path string"),
        ("[pipeline]\nsoc = 8650\n", "pipeline.soc", "must be a string"),
    ],
)
def test_load_wrong_types(write_toml: WriteToml, body: str, field: str, reason: str) -> None:
    text = '[pipeline]\nmodel = "m"\n' + body if not body.startswith("[pipeline]") else (
        body.replace("[pipeline]\n", '[pipeline]\nmodel = "m"\n')
    )
    err = _raises_cve(lambda: load_pipeline_toml(write_toml(text)))
    assert err.field == field
    assert reason in str(err)


def test_load_model_of_wrong_type(write_toml: WriteToml) -> None:
    err = _raises_cve(lambda: load_pipeline_toml(write_toml("[pipeline]\nmodel = 3\n")))
    assert err.field == "pipeline.model"


def test_load_enum_values_case_insensitive(write_toml: WriteToml) -> None:
    ctx = load_pipeline_toml(
        write_toml(
            '[pipeline]\nmodel = "m"\nbackend = "QNN"\nrecipe = "16A4W_Block"\n'
            'soc = "sm8750"\nskip = ["INFER"]\nstop_after = "Compile"\n'
        )
    )
    assert ctx.backend is Backend.QNN
    assert ctx.recipe is Recipe.A16W4_BLOCK
    assert ctx.soc == "SM8750"
    assert ctx.skip == {Stage.INFER}
    assert ctx.stop_after is Stage.COMPILE


def test_load_unknown_enum_value_lists_allowed(write_toml: WriteToml) -> None:
    err = _raises_cve(
        lambda: load_pipeline_toml(write_toml('[pipeline]\nmodel = "m"\nrecipe = "int8"\n'))
    )
    assert err.field == "pipeline.recipe"
    assert err.allowed == tuple(r.value for r in Recipe)
    assert "unknown recipe" in str(err)


def test_overrides_win_over_file(write_toml: WriteToml) -> None:
    path = write_toml(
        '[pipeline]\nmodel = "from-file"\nbackend = "xnnpack"\nrecipe = "8a8w"\nout = "a"\n'
        "[infer]\nruns = 7\nwarmup = 2\n"
    )
    ctx = load_pipeline_toml(
        path,
        {
            "pipeline": {
                "model": "from-cli",
                "backend": Backend.QNN,
                "recipe": "16a8w",
                "soc": "SM8550",
                "out": Path("b"),
                "force": True,
            },
            "infer": {"runs": 3},
        },
    )
    assert ctx.prepare.model == "from-cli"
    assert ctx.backend is Backend.QNN
    assert ctx.recipe is Recipe.A16W8
    assert ctx.soc == "SM8550"
    assert ctx.out_dir == Path("b")
    assert ctx.force is True
    assert ctx.infer.runs == 3
    assert ctx.infer.warmup == 2  # not overridden: the file's value stays


def test_none_overrides_do_not_clear_file_values(write_toml: WriteToml) -> None:
    path = write_toml('[pipeline]\nmodel = "m"\nrecipe = "fp32"\n[infer]\nruns = 9\n')
    ctx = load_pipeline_toml(
        path, {"pipeline": {"recipe": None, "model": None, "soc": None}, "infer": {"runs": None}}
    )
    assert ctx.prepare.model == "m"
    assert ctx.recipe is Recipe.FP32
    assert ctx.infer.runs == 9


def test_overrides_can_supply_the_model(write_toml: WriteToml) -> None:
    ctx = load_pipeline_toml(write_toml("[prepare]\nseq_len = 32\n"), {"pipeline": {"model": "x"}})
    assert ctx.prepare.model == "x"
    assert ctx.prepare.seq_len == 32


def test_overrides_are_validated(write_toml: WriteToml) -> None:
    path = write_toml('[pipeline]\nmodel = "m"\n')
    err = _raises_cve(lambda: load_pipeline_toml(path, {"pipeline": {"recipe": "16a16w"}}))
    assert err.field in ("compile.recipe", "quantize.recipe")
    err = _raises_cve(lambda: load_pipeline_toml(path, {"pipeline": {"force": "yes"}}))
    assert err.field == "pipeline.force"
    err = _raises_cve(lambda: load_pipeline_toml(path, {"infer": {"runs": 0}}))
    assert err.field == "infer.runs"


def test_unknown_override_key_is_a_config_error(write_toml: WriteToml) -> None:
    path = write_toml('[pipeline]\nmodel = "m"\n')
    err = _raises_cve(lambda: load_pipeline_toml(path, {"pipeline": {"bogus": 1}}))
    assert err.field == "pipeline.bogus"
    assert "unknown key" in str(err)
    err = _raises_cve(lambda: load_pipeline_toml(path, {"prepare": {"seqlen": 1}}))
    assert err.field == "prepare.seqlen"
    err = _raises_cve(lambda: load_pipeline_toml(path, {"quantise": {"per_channel": True}}))
    assert err.field == "quantise"


def test_override_may_not_repeat_a_pipeline_key_in_a_stage(write_toml: WriteToml) -> None:
    path = write_toml('[pipeline]\nmodel = "m"\n')
    err = _raises_cve(lambda: load_pipeline_toml(path, {"quantize": {"recipe": "8a8w"}}))
    assert err.field == "quantize.recipe"


def test_load_bad_toml_syntax(write_toml: WriteToml) -> None:
    path = write_toml('[pipeline\nmodel = "m"\n')
    err = _raises_cve(lambda: load_pipeline_toml(path))
    assert err.field == "config"
    assert err.value == str(path)
    assert "not valid TOML" in str(err)
    assert str(path) in str(err)


def test_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    err = _raises_cve(lambda: load_pipeline_toml(path))
    assert err.field == "config"
    assert "file not found" in str(err)
    assert str(path) in str(err)


def test_load_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    err = _raises_cve(lambda: load_pipeline_toml(tmp_path))  # a directory
    assert str(tmp_path) in str(err)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[pipeline]\nmodel = "caf\xe9"\n')
    err = _raises_cve(lambda: load_pipeline_toml(bad))
    assert str(bad) in str(err)


def test_load_missing_model(write_toml: WriteToml) -> None:
    err = _raises_cve(lambda: load_pipeline_toml(write_toml('[pipeline]\nbackend = "xnnpack"\n')))
    assert err.field == "pipeline.model"
    assert "required" in str(err)


def test_load_empty_file_is_missing_model(write_toml: WriteToml) -> None:
    err = _raises_cve(lambda: load_pipeline_toml(write_toml("")))
    assert err.field == "pipeline.model"


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("quantize", "recipe", '"8a8w"'),
        ("quantize", "backend", '"xnnpack"'),
        ("compile", "soc", '"SM8650"'),
        ("compile", "recipe", '"fp32"'),
        ("prepare", "model", '"other"'),
    ],
)
def test_stage_table_may_not_repeat_a_pipeline_key(
    write_toml: WriteToml, section: str, key: str, value: str
) -> None:
    path = write_toml(f'[pipeline]\nmodel = "m"\n[{section}]\n{key} = {value}\n')
    err = _raises_cve(lambda: load_pipeline_toml(path))
    assert err.field == f"{section}.{key}"
    assert f"under [pipeline] {key}" in str(err)


def test_stage_table_repeat_rejected_even_when_quantize_is_skipped(
    write_toml: WriteToml,
) -> None:
    path = write_toml('[pipeline]\nmodel = "m"\n[compile]\nrecipe = "fp32"\n')
    assert _raises_cve(lambda: load_pipeline_toml(path)).field == "compile.recipe"


def test_skip_prepare_from_toml(write_toml: WriteToml) -> None:
    path = write_toml('[pipeline]\nmodel = "m"\nskip = ["prepare"]\n')
    err = _raises_cve(lambda: load_pipeline_toml(path))
    assert err.field == "pipeline.skip"


def test_pipeline_from_mapping_errors_are_pipeline_errors() -> None:
    with pytest.raises(PipelineError):
        pipeline_from_mapping({"pipeline": {"model": "m", "backend": "tpu"}})


def test_keep_float_is_a_list_of_regexes() -> None:
    ctx = pipeline_from_mapping(
        {"pipeline": {"model": "m"}, "quantize": {"keep_float": [r"layer\.\d+\.output"]}}
    )
    assert ctx.quantize is not None and ctx.quantize.keep_float == (r"layer\.\d+\.output",)
    with pytest.raises(ConfigValidationError, match="not a regular expression"):
        QuantizeConfig(keep_float=("(",))
    with pytest.raises(ConfigValidationError, match="must be a list"):
        pipeline_from_mapping({"pipeline": {"model": "m"}, "quantize": {"keep_float": "x"}})
    assert QuantizeConfig().keep_float is None  # the quantizer's default


def test_block_size_is_for_lpbq_only() -> None:
    ok = QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A16W4_BLOCK, soc="SM8650", block_size=32)
    assert ok.block_size == 32
    with pytest.raises(ConfigValidationError, match="16a4w_block"):
        QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A16W4, soc="SM8650", block_size=32)
    with pytest.raises(ConfigValidationError, match=">= 2"):
        QuantizeConfig(backend=Backend.QNN, recipe=Recipe.A16W4_BLOCK, soc="SM8650", block_size=0)


# --- accuracy gates ------------------------------------------------------------------------------


def test_default_gates_per_recipe() -> None:
    assert default_accuracy_gates(Recipe.FP32) == AccuracyGates(min_sqnr_db_vs_fp32=40.0)
    assert default_accuracy_gates(Recipe.FP16) == AccuracyGates(min_sqnr_db_vs_fp32=30.0)
    assert default_accuracy_gates(Recipe.A8W8) == AccuracyGates(
        min_cosine_vs_fp32=0.9, min_sqnr_db_vs_fake_quant=15.0
    )
    assert default_accuracy_gates(Recipe.A16W8) == AccuracyGates(
        min_cosine_vs_fp32=0.9, min_sqnr_db_vs_fake_quant=25.0
    )
    # 2-bit weights: the error vs fp32 is the recipe's own; the fake-quant gate judges the program.
    assert default_accuracy_gates(Recipe.A16W2) == AccuracyGates(min_sqnr_db_vs_fake_quant=25.0)


def test_quantized_causal_lms_are_judged_by_perplexity_too() -> None:
    # A deep decoder's logits drift on the HTP at 16-bit activations while its perplexity does
    # not (SmolLM2 16a8w: 19.2 dB vs fake quant, perplexity 32.9 vs 33.4): the SQNR floor of
    # 8-bit activations, and perplexity within 10 % of the fake-quant model's.
    # And their next token against fp32's, bounded per recipe (qnn_common.gates).
    assert default_accuracy_gates(Recipe.A16W8, causal_lm=True) == AccuracyGates(
        min_cosine_vs_fp32=0.9, min_sqnr_db_vs_fake_quant=15.0, max_perplexity_vs_fake_quant=1.1,
        max_kl_vs_fp32=0.05, min_same_top_percent_vs_fp32=88.0,
    )
    assert default_accuracy_gates(Recipe.A8DW4, causal_lm=True).min_sqnr_db_vs_fake_quant == 15.0
    assert default_accuracy_gates(Recipe.A16W2, causal_lm=True).max_kl_vs_fp32 is None
    # Float programs: the float gates, and for an LLM the float bounds on its next token.
    assert default_accuracy_gates(Recipe.FP32, causal_lm=True) == dataclasses.replace(
        default_accuracy_gates(Recipe.FP32), max_kl_vs_fp32=0.01,
        min_same_top_percent_vs_fp32=97.0,
    )
    assert default_accuracy_gates(Recipe.FP32).max_kl_vs_fp32 is None
    assert InferConfig(max_perplexity_vs_fake_quant=1.5).gates_for(
        Recipe.A16W8, causal_lm=True
    ).max_perplexity_vs_fake_quant == 1.5


@pytest.mark.parametrize("recipe", list(Recipe))
def test_every_quantized_recipe_is_judged_against_its_fake_quant(recipe: Recipe) -> None:
    gates = default_accuracy_gates(recipe)
    if recipe.is_quantized:
        assert gates.min_sqnr_db_vs_fake_quant is not None
    else:  # a float program has no fake-quant reference, only fp32
        assert gates.min_sqnr_db_vs_fake_quant is None and gates.min_sqnr_db_vs_fp32 is not None


def test_unset_gates_take_the_recipes_default_and_set_ones_win() -> None:
    cfg = InferConfig(min_sqnr_db_vs_fp32=12, min_cosine_vs_fake_quant=0.5)
    assert cfg.min_sqnr_db_vs_fp32 == 12.0 and isinstance(cfg.min_sqnr_db_vs_fp32, float)
    assert cfg.gates_for(Recipe.A8W8) == AccuracyGates(
        min_sqnr_db_vs_fp32=12.0, min_cosine_vs_fp32=0.9, min_sqnr_db_vs_fake_quant=15.0,
        min_cosine_vs_fake_quant=0.5,
    )
    # A bare .pte: the recipe is unknown, so only the gates set explicitly apply.
    assert cfg.gates_for(None) == AccuracyGates(min_sqnr_db_vs_fp32=12.0,
                                                min_cosine_vs_fake_quant=0.5)
    assert InferConfig(accuracy_gates=False).gates_for(Recipe.FP32) == AccuracyGates()


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"min_cosine_vs_fp32": 1.5}, "infer.min_cosine_vs_fp32", "[-1, 1]"),
        ({"min_cosine_vs_fake_quant": -2}, "infer.min_cosine_vs_fake_quant", "[-1, 1]"),
        ({"max_perplexity_vs_fake_quant": 0.9}, "infer.max_perplexity_vs_fake_quant",
         "at least 1"),
        ({"min_sqnr_db_vs_fp32": float("nan")}, "infer.min_sqnr_db_vs_fp32", "a number"),
        ({"min_sqnr_db_vs_fake_quant": "20"}, "infer.min_sqnr_db_vs_fake_quant", "a number"),
        ({"min_sqnr_db_vs_fp32": True}, "infer.min_sqnr_db_vs_fp32", "a number"),
        ({"accuracy_gates": "no"}, "infer.accuracy_gates", "true or false"),
    ],
)
def test_bad_gates_name_the_field(kwargs: dict[str, Any], field: str, reason: str) -> None:
    err = _raises_cve(lambda: InferConfig(**kwargs))
    assert err.field == field and reason in str(err)


def test_gates_load_from_toml(write_toml: WriteToml) -> None:
    ctx = load_pipeline_toml(write_toml(
        '[pipeline]\nmodel = "m"\n[infer]\nmin_sqnr_db_vs_fp32 = 35\nmin_cosine_vs_fp32 = 0.95\n'
        "accuracy_gates = true\n"
    ))
    assert ctx.infer.min_sqnr_db_vs_fp32 == 35.0 and ctx.infer.min_cosine_vs_fp32 == 0.95
    err = _raises_cve(lambda: load_pipeline_toml(write_toml(
        '[pipeline]\nmodel = "m"\n[infer]\nmin_sqnr_db_vs_fake_quant = "high"\n'
    )))
    assert err.field == "infer.min_sqnr_db_vs_fake_quant" and "must be a number" in str(err)


def test_etdump_is_host_only() -> None:
    with pytest.raises(ConfigValidationError, match="drop --etdump / --profile, or --device"):
        InferConfig(etdump=True, device="auto")


def test_kv_cache_settings_need_kv_cache_and_qnn_gets_kv_io() -> None:
    with pytest.raises(ConfigValidationError, match="set kv_cache too"):
        PrepareConfig(model="tiny-llama", max_seq_len=64)
    with pytest.raises(ConfigValidationError, match="set kv_cache too"):
        PrepareConfig(model="tiny-llama", kv_io=True)
    ctx = PipelineContext.create("tiny-llama", backend="qnn", soc="SM8650", recipe="16a4w",
                                 prepare={"kv_cache": True})
    assert ctx.prepare.kv_io  # QNN has no mutable buffers: the host keeps the cache
    xnn = PipelineContext.create("tiny-llama", prepare={"kv_cache": True})
    assert not xnn.prepare.kv_io


def test_custom_ops_default_from_the_backend_and_need_a_cache_written_in_place() -> None:
    xnn = PipelineContext.create("tiny-llama", prepare={"kv_cache": True})
    # What ExecuTorch's own Llama export does for XNNPACK, where the model's attention allows
    # (tests/llm/default_attention_test.py runs one whose attention does not).
    assert xnn.prepare.custom_ops is None
    portable = PipelineContext.create("tiny-llama", backend="portable", prepare={"kv_cache": True})
    assert portable.prepare.custom_ops is False  # the reference keeps ATen ops
    asked = PipelineContext.create(
        "tiny-llama", backend="portable", prepare={"kv_cache": True, "custom_ops": True}
    )
    assert asked.prepare.custom_ops
    declined = PipelineContext.create("tiny-llama", prepare={"kv_cache": True, "custom_ops": False})
    assert declined.prepare.custom_ops is False
    assert not PipelineContext.create("tiny-llama").prepare.custom_ops  # no cache, no ops
    qnn = PipelineContext.create("tiny-llama", backend="qnn", soc="SM8650", recipe="16a8w",
                                 prepare={"kv_cache": True})
    assert not qnn.prepare.custom_ops
    with pytest.raises(ConfigValidationError, match="set kv_cache, and not kv_io"):
        PrepareConfig(model="tiny-llama", custom_ops=True)
    with pytest.raises(ConfigValidationError, match="set kv_cache, and not kv_io"):
        PrepareConfig(model="tiny-llama", kv_cache=True, kv_io=True, custom_ops=True)
    with pytest.raises(ConfigValidationError, match="as QNN's is"):
        PipelineContext.create("tiny-llama", backend="qnn", soc="SM8650", recipe="16a8w",
                               prepare={"kv_cache": True, "custom_ops": True})


def test_generation_table_loads_from_toml(write_toml: WriteToml) -> None:
    ctx = load_pipeline_toml(write_toml(
        '[pipeline]\nmodel="tiny-llama"\n[prepare]\nkv_cache = true\n'
        '[infer.generation]\nprompt = "Hi"\nmax_new_tokens = 4\ntemperature = 0.7\ntop_k = 3\n'
    ))
    assert ctx.infer.generation is not None
    assert (ctx.infer.generation.prompt, ctx.infer.generation.top_k) == ("Hi", 3)
    with pytest.raises(ConfigValidationError, match="infer.generation.topk"):
        load_pipeline_toml(write_toml(
            '[pipeline]\nmodel="m"\n[infer.generation]\ntopk = 3\n'
        ))


def test_weight_sharing_is_for_qnn_from_v73_and_for_a_device() -> None:
    assert CompileConfig(
        backend=Backend.QNN, recipe=Recipe.A16W8, soc="SM8650", weight_sharing=True
    ).weight_sharing
    with pytest.raises(ConfigValidationError, match="QNN context feature"):
        CompileConfig(backend=Backend.XNNPACK, weight_sharing=True)
    with pytest.raises(ConfigValidationError, match="HTP >= V73, and SM8450 is V69"):
        CompileConfig(backend=Backend.QNN, recipe=Recipe.A16W8, soc="SM8450", weight_sharing=True)
    with pytest.raises(ConfigValidationError, match="true or false"):
        CompileConfig(backend=Backend.QNN, recipe=Recipe.A16W8, soc="SM8650",
                      weight_sharing=cast(Any, "yes"))
    # The emulator cannot load such a program: a pipeline that would run it here is refused
    # before any work; compile-only, or a device run, is not.
    shared = {"weight_sharing": True}
    with pytest.raises(ConfigValidationError, match="--stop-after compile"):
        PipelineContext.create("m", backend="qnn", soc="SM8650", recipe="16a8w", compile=shared)
    PipelineContext.create("m", backend="qnn", soc="SM8650", recipe="16a8w", compile=shared,
                           stop_after="compile")
    PipelineContext.create("m", backend="qnn", soc="SM8650", recipe="16a8w", compile=shared,
                           infer={"device": "auto"})


def test_a_generation_section_implies_the_kv_cache_export_as_the_prompt_flag_does() -> None:
    ctx = PipelineContext.create(
        "tiny-llama", prepare={"max_seq_len": 64}, infer={"generation": {"prompt": "hi"}},
    )
    assert ctx.prepare.kv_cache and ctx.prepare.max_seq_len == 64
    qnn = PipelineContext.create(
        "tiny-llama", backend="qnn", soc="SM8650", recipe="16a8w",
        infer={"generation": {"prompt": "hi"}},
    )
    assert qnn.prepare.kv_cache and qnn.prepare.kv_io
    # Said outright, it stands.
    plain = PipelineContext.create("tiny-llama", prepare={"kv_cache": False})
    assert not plain.prepare.kv_cache


def test_num_shards_takes_a_number_or_auto_on_qnn_only() -> None:
    def qnn(shards: object) -> PipelineContext:
        return PipelineContext.create("tiny-llama", backend="qnn", soc="SM8650", recipe="16a8w",
                                      compile={"num_shards": shards})

    assert qnn("auto").compile.num_shards == "auto"
    assert qnn(3).compile.num_shards == 3
    with pytest.raises(ConfigValidationError, match="must be an integer, or one of: 'auto'"):
        qnn("many")
    with pytest.raises(ConfigValidationError, match=r"1\.\.64"):
        qnn(0)
    with pytest.raises(ConfigValidationError, match="only the qnn backend splits"):
        PipelineContext.create("tiny-llama", compile={"num_shards": 2})


def _a_soc_for(backend: Backend, recipe: Recipe) -> str | None:
    """Some SoC on which `backend` runs `recipe` (None for the host backends)."""
    if backend is not Backend.QNN:
        return None
    return next(s.name for s in SOCS.values() if recipe in recipes_for(backend, s))


def _supported_pairs() -> list[tuple[Backend, Recipe]]:
    """For every recipe, one backend that can run it."""
    return [
        (next(b for b in (Backend.XNNPACK, Backend.QNN)
              if recipe in recipes_for(b, SOCS["SM8750"])), recipe)
        for recipe in Recipe
    ]


@pytest.mark.parametrize(("backend", "recipe"), _supported_pairs())
def test_every_recipe_round_trips_through_config(backend: Backend, recipe: Recipe) -> None:
    soc = _a_soc_for(backend, recipe)
    ctx = PipelineContext.create("m", backend=backend, recipe=recipe, soc=soc)
    assert ctx.recipe is recipe
    assert ctx.compile.recipe is recipe
    if recipe.is_quantized:
        assert ctx.quantize is not None
        assert ctx.quantize.recipe is recipe
        assert Stage.QUANTIZE not in ctx.skip
    else:
        assert ctx.quantize is None
        assert Stage.QUANTIZE in ctx.skip


@pytest.mark.parametrize(("backend", "recipe"), _supported_pairs())
def test_every_recipe_round_trips_through_toml(
    tmp_path: Path, backend: Backend, recipe: Recipe
) -> None:
    soc = _a_soc_for(backend, recipe)
    soc_line = f'soc = "{soc}"\n' if soc else ""
    cfg = tmp_path / "p.toml"
    cfg.write_text(
        f'[pipeline]\nmodel = "m"\nbackend = "{backend.value}"\n'
        f'recipe = "{recipe.value}"\n{soc_line}',
        encoding="utf-8",
    )
    ctx = load_pipeline_toml(cfg)
    assert ctx.recipe is recipe
    assert (ctx.quantize is not None) == recipe.is_quantized


def test_16a16w_reaches_quantize_and_compile_from_mapping() -> None:
    ctx = pipeline_from_mapping(
        {"pipeline": {"model": "m", "backend": "qnn", "recipe": "16A16W", "soc": "sm8650"}}
    )
    assert ctx.quantize is not None
    assert ctx.quantize.recipe is Recipe.A16W16
    assert ctx.compile.recipe is Recipe.A16W16
