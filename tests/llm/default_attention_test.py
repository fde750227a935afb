"""The default a pipeline picks for a decoder must be one that works for it (issue 52): on
XNNPACK a KV-cache export uses ExecuTorch's LLM custom ops where the model's attention is what
custom_sdpa computes, and transformers' own attention over a static cache where it is not,
instead of refusing the model. Asked for explicitly, custom ops are still refused for such a
model, with the way out. A causal LM is what transformers loads as one, GPT-2's
`GPT2LMHeadModel` included, not only a `*ForCausalLM`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline


def _tiny_granite(directory: Path) -> Path:
    """A seeded 2-layer Granite decoder and no tokenizer (bytes): attention scaled by
    `attention_multiplier`, not 1/sqrt(head_dim), so not custom_sdpa's."""
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(7)
    config = GraniteConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
        attention_multiplier=0.05,
    )
    GraniteForCausalLM(config).eval().save_pretrained(directory)
    return directory


def _tiny_gpt2(directory: Path) -> Path:
    """A seeded 2-layer GPT-2 (learned positions, Conv1D projections), no tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(3)
    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    return directory


def _create(model: Path, out: Path, recipe: str = "fp32", **prepare: Any) -> PipelineContext:
    return PipelineContext.create(
        str(model), recipe=recipe, out_dir=out,
        prepare={"kv_cache": True, "max_seq_len": 32, "prefill_len": 8,
                 "calibration_samples": 2, "eval_samples": 2, **prepare},
        infer={"generation": {"prompt": "Once upon", "max_new_tokens": 4}},
    )


def _program_ops(summary: dict[str, Any]) -> str:
    (entry,) = (s for s in summary["stages"] if s["name"] == Stage.COMPILE.value)
    return (Path(entry["artifact"]) / "model.pte").read_bytes().decode("latin-1")


def test_a_decoder_whose_attention_custom_sdpa_cannot_compute_runs_by_default(
    tmp_path: Path,
) -> None:
    model = _tiny_granite(tmp_path / "granite")
    ctx = _create(model, tmp_path / "out")
    assert ctx.prepare.custom_ops is None  # where the model allows
    summary = run_pipeline(ctx).checked().summary
    generation = summary["generation"]
    assert generation["new_tokens"] == 4
    # Its float program is the model's: transformers' attention, not custom_sdpa.
    assert "custom_sdpa" not in _program_ops(summary)
    next_token = generation["next_token"]["program"]
    assert next_token["kl_divergence"]["mean"] < 1e-4 and next_token["same_top_percent"] == 100.0
    # Asked for by name, custom ops are refused for it, saying what to do.
    asked = _create(model, tmp_path / "asked", custom_ops=True)
    with pytest.raises(ConfigValidationError, match="export it without custom ops"):
        run_pipeline(asked).checked()


def test_gpt2_is_a_causal_lm_and_generates_with_every_setting_at_its_default(
    tmp_path: Path,
) -> None:
    model = _tiny_gpt2(tmp_path / "gpt2")
    ctx = PipelineContext.create(
        str(model), out_dir=tmp_path / "out",
        prepare={"max_seq_len": 32, "prefill_len": 8, "calibration_samples": 2,
                 "eval_samples": 2},
        infer={"generation": {"prompt": "Once upon", "max_new_tokens": 4}},
    )
    assert ctx.recipe.value == "8a8w" and ctx.prepare.kv_cache  # the defaults
    summary = run_pipeline(ctx).checked().summary
    assert summary["generation"]["new_tokens"] == 4
    assert "custom_sdpa" not in _program_ops(summary)
    # Its 8a8w program against fp32 on the held-out windows, under the default gates.
    program = summary["generation"]["next_token"]["program"]
    assert program["same_top_percent"] >= 80.0


def test_a_mixture_of_experts_decoder_exports_without_transformers_custom_ops(
    tmp_path: Path,
) -> None:
    """transformers 5 runs MoE experts through a custom op by default (grouped_mm), which no
    ExecuTorch runtime has: the program failed at serialization, after all the work. The
    export routes experts through batched matmuls (`export.EXPORTABLE_EXPERTS`): plain ATen."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(3)
    config = Qwen3MoeConfig(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        vocab_size=256, max_position_embeddings=64, head_dim=16,
    )
    model = tmp_path / "moe"
    Qwen3MoeForCausalLM(config).eval().save_pretrained(model)
    summary = run_pipeline(_create(model, tmp_path / "out")).checked().summary
    assert summary["generation"]["new_tokens"] == 4
    assert "grouped_mm" not in _program_ops(summary)
    program = summary["generation"]["next_token"]["program"]
    assert program["kl_divergence"]["mean"] < 1e-4  # the float program is the eager model


def test_gemma3_runs_at_8a8w_by_default_and_its_program_starts_from_the_models_state(
    tmp_path: Path,
) -> None:
    """Two defects a tiny Gemma 3 showed, each leaving a program that did not load:
    - the quantize stage's own runs (calibration, the fake-quant reference) wrote their cache
      and the sliding-window layers' token counters into the quantized program, which the
      compile then serialized as the program's initial state (qnn_quant.calibration
      `initial_state`, method_modules `own_copies`): every buffer the program writes must leave
      the quantize stage as the model registered it;
    - XNNPACK took a slice reading int8 and writing float (its rotary embedding's half of the
      QK-normed query), which XNNPACK refuses at load (qnn_compile.backends.xnnpack)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from qnn_common.torchio.known_weights import buffers_written

    torch.manual_seed(7)
    config = Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=64,
        sliding_window=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    model = tmp_path / "gemma3"
    Gemma3ForCausalLM(config).eval().save_pretrained(model)
    summary = run_pipeline(_create(model, tmp_path / "out", recipe="8a8w")).checked().summary
    assert summary["generation"]["new_tokens"] == 4
    (quantize,) = (s for s in summary["stages"] if s["name"] == Stage.QUANTIZE.value)
    for method in ("prefill", "decode"):
        program = torch.export.load(Path(quantize["artifact"]) / "methods" / f"{method}.pt2")
        written = buffers_written(program)
        state = {n: b for n, b in program.named_buffers() if n in written}
        assert any("cumulative_length" in n for n in state), sorted(state)  # counters seen
        assert not any(bool(b.any()) for b in state.values()), [
            n for n, b in state.items() if b.any()]
