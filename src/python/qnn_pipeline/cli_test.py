"""The pipeline CLI's argument handling: flags and TOML merge into one validated context."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import Backend, Recipe
from qnn_common.weight_groups import GroupMapping
from qnn_pipeline.cli import build_parser, context_from_args, main
from qnn_pipeline.context import PipelineContext


def _ctx(*argv: str) -> PipelineContext:
    return context_from_args(build_parser().parse_args(list(argv)))


def test_defaults_are_xnnpack_8a8w() -> None:
    ctx = _ctx("--model", "minilm")
    assert (ctx.backend, ctx.recipe, ctx.soc) == (Backend.XNNPACK, Recipe.A8W8, None)
    assert ctx.out_dir == Path("out") and ctx.quantize is not None


def test_skip_quantize_is_the_fp32_path() -> None:
    ctx = _ctx("--model", "tiny-cnn", "--skip", "quantize", "--stop-after", "compile")
    assert ctx.recipe is Recipe.FP32 and ctx.quantize is None
    assert ctx.stop_after is Stage.COMPILE


def test_stage_flags_reach_stage_configs(tmp_path: Path) -> None:
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("one sample\nanother\n", encoding="utf-8")
    ctx = _ctx("--model", "minilm", "--seq-len", "32", "--calibration-samples", "3", "--runs", "7",
               "--calibration-file", str(calibration))
    assert ctx.prepare.seq_len == 32 and ctx.prepare.calibration_samples == 3
    assert ctx.prepare.calibration_file == calibration
    assert ctx.infer.runs == 7
    lpbq = _ctx("--model", "tiny-llama", "--backend", "qnn", "--soc", "SM8650", "--recipe",
                "16a4w_block", "--block-size", "32", "--group-mapping", "asymmetric")
    assert lpbq.quantize is not None and lpbq.quantize.block_size == 32
    assert lpbq.quantize.group_mapping is GroupMapping.ASYMMETRIC


def test_smooth_blocks_is_8da4ws_default_and_refused_off_elsewhere() -> None:
    on = _ctx("--model", "tiny-llama", "--recipe", "8da4w")
    assert on.quantize is not None and on.quantize.smooth_blocks
    off = _ctx("--model", "tiny-llama", "--recipe", "8da4w", "--no-smooth-blocks")
    assert off.quantize is not None and not off.quantize.smooth_blocks
    with pytest.raises(ConfigValidationError, match="only 8da4w smooths blocks"):
        _ctx("--model", "tiny-llama", "--recipe", "8a8w", "--no-smooth-blocks")


def test_layer_recipes_from_flags_and_from_the_toml_file(tmp_path: Path) -> None:
    qnn = ("--model", "tiny-llama", "--backend", "qnn", "--soc", "SM8650", "--recipe",
           "16a4w_block")
    ctx = _ctx(*qnn, "--layer-recipe", r"layers\.0\.mlp\.down_proj$=16a8w",
               "--layer-recipe", "lm_head=16a16w")
    assert ctx.quantize is not None and ctx.quantize.layer_recipes == (
        LayerRecipe(r"layers\.0\.mlp\.down_proj$", Recipe.A16W8),
        LayerRecipe("lm_head", Recipe.A16W16))
    config = tmp_path / "mixed.toml"
    config.write_text(
        '[pipeline]\nmodel = "tiny-llama"\nbackend = "qnn"\nsoc = "SM8650"\n'
        'recipe = "16a4w_block"\n[quantize]\n'
        "layer_recipes = [{ pattern = 'down_proj$', recipe = \"16a8w\" }]\n",
        encoding="utf-8")
    from_file = _ctx("--config", str(config))
    assert from_file.quantize is not None
    assert from_file.quantize.layer_recipes == (LayerRecipe("down_proj$", Recipe.A16W8),)
    with pytest.raises(ConfigValidationError, match="activations are 16-bit"):
        _ctx(*qnn, "--layer-recipe", "down_proj=8a8w")
    with pytest.raises(ConfigValidationError, match="PATTERN=RECIPE"):
        _ctx(*qnn, "--layer-recipe", "down_proj")


def test_custom_ops_follow_the_backend_unless_said() -> None:
    prompt = ("--model", "tiny-llama", "--prompt", "Hi")
    assert _ctx(*prompt).prepare.custom_ops is None  # where the model's attention allows
    assert _ctx(*prompt, "--no-custom-ops").prepare.custom_ops is False
    assert _ctx(*prompt, "--backend", "portable").prepare.custom_ops is False
    assert _ctx(*prompt, "--backend", "portable", "--custom-ops").prepare.custom_ops is True


def test_flags_override_the_toml_file(tmp_path: Path) -> None:
    config = tmp_path / "p.toml"
    config.write_text('[pipeline]\nmodel = "tiny-cnn"\nrecipe = "fp32"\n[infer]\nruns = 9\n')
    ctx = _ctx("--config", str(config), "--runs", "2")
    assert ctx.prepare.model == "tiny-cnn" and ctx.recipe is Recipe.FP32
    assert ctx.infer.runs == 2


def test_qnn_needs_a_soc_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "tiny-cnn", "--backend", "qnn", "--recipe", "fp16"]) == 2
    assert "SoC" in capsys.readouterr().err


def test_unknown_soc_suggests_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "x", "--backend", "qnn", "--soc", "SM8655", "--recipe", "16a4w"]) == 2
    assert "did you mean SM8650" in capsys.readouterr().err


def test_list_socs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-socs"]) == 0
    out = capsys.readouterr().out
    assert "SM8650" in out and "V75" in out and out.count("\n") == 21


def test_help_exits_zero() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0


def test_eval_is_checked_before_any_stage(tmp_path: Path) -> None:
    from qnn_common.errors import ArtifactError
    from qnn_pipeline.cli import _eval_request
    from qnn_pipeline.evaluation import EvalRequest

    def request(*argv: str) -> EvalRequest | None:
        args = build_parser().parse_args(list(argv))
        return _eval_request(args, context_from_args(args))

    llm = ("--model", "tiny-llama", "--prompt", "Hi")
    quick = request(*llm, "--eval", "quick")
    assert quick is not None and quick.suite.name == "quick" and quick.gates is not None
    judged_not = request(*llm, "--eval", "full", "--no-accuracy-gates")
    assert judged_not is not None and judged_not.gates is None
    assert request(*llm) is None
    with pytest.raises(ConfigValidationError, match="add --eval quick or full"):
        request(*llm, "--eval-file", str(tmp_path / "x.txt"))
    with pytest.raises(ConfigValidationError, match="add --prompt"):
        request("--model", "tiny-llama", "--eval", "quick")
    with pytest.raises(ConfigValidationError, match="drop --stop-after"):
        request(*llm, "--eval", "quick", "--stop-after", "compile")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n', encoding="utf-8")
    with pytest.raises(ArtifactError, match="line 1: 'prompt' must be a non-empty string"):
        request(*llm, "--eval", "quick", "--eval-file", str(bad))


def test_from_an_artifact_without_a_recipe_says_it_skips_quantize(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="qnn_pipeline.cli"):
        ctx = _ctx("--from", str(tmp_path))
    assert Stage.QUANTIZE in ctx.skip
    assert any("pass --recipe" in r.getMessage() and str(tmp_path) in r.getMessage()
               for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="qnn_pipeline.cli"):
        _ctx("--from", str(tmp_path), "--recipe", "8a8w")
    assert not caplog.records
