"""Accuracy gates: the minimum agreement a program's outputs must reach with their references.

The defaults per recipe are written here once; `InferConfig` carries the user's overrides and
`qnn_infer` judges a run against the result.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Recipe


@dataclass(frozen=True)
class AccuracyGates:
    """Minimum accuracy of a program's outputs against its references; None = not checked.

    "vs fp32" compares with the fp32 eager model, "vs fake quant" with the quantizer's fake-quant
    model (the program a quantized .pte should compute, up to rounding).
    """

    min_sqnr_db_vs_fp32: float | None = None
    min_cosine_vs_fp32: float | None = None
    min_sqnr_db_vs_fake_quant: float | None = None
    min_cosine_vs_fake_quant: float | None = None
    # Causal LMs: the program's perplexity of the held-out text over the fake-quant model's, at
    # most this (1.1: 10 % worse). Judged where both perplexities exist.
    max_perplexity_vs_fake_quant: float | None = None
    # Causal LMs, next token against eager fp32 on the held-out text: the mean KL divergence (nats
    # per token) at most this, judged by its interval's low end; the same top token at least this
    # often (percent), judged by its interval's high end (noise alone cannot fail either).
    max_kl_vs_fp32: float | None = None
    min_same_top_percent_vs_fp32: float | None = None


# The default gates, per recipe: low enough that every model we measured passes with a margin,
# high enough that a wrong program (swapped / mutated outputs, a mis-lowered op, a zero output)
# cannot. Measured on this project's eval inputs (docs/quantization.md's tables):
# * fp32: tiny-cnn on XNNPACK 120 dB vs fp32 (the e2e test asks >= 60). A float program is the
#   same arithmetic in another order, so under 40 dB (1 % RMS error) is a lowering bug.
# * fp16: QNN HTP 65.5 dB (tiny-cnn), 41.0 dB (MiniLM, 6 layers); fp16 rounding accumulates with
#   depth, so 30 dB (3 % RMS error, cosine ~0.9995) leaves 11 dB for deeper models.
# * 8-bit activations: XNNPACK MiniLM 8a8w ~20 dB vs fake quant with static linears (the backend
#   requantizes where fake quant stays float), 29.0 dB with the dynamic ones (the reference scales
#   them per row as XNNPACK does; per tensor it read 18.3 dB), tiny-cnn 46 dB: 15 dB keeps 5 dB
#   margin on the worst.
# * 16-bit activations: QNN MiniLM 16a8w 47.8 dB, tiny-llama 16a4w 54 dB, 16a4w / 16a16w 45-47
#   dB vs fake quant: 25 dB keeps 20 dB margin and still catches a program that drifted.
# * vs fp32, quantized: cosine 0.9 (MiniLM 8a8w 0.99, tiny-llama QNN 16a4w 0.987, MiniLM 16a8w
#   0.9996); a broken program lands near 0. Not checked below 4-bit weights (16a2w), whose error
#   vs fp32 is the recipe's own; the fake-quant gate still judges that program.
_FLOAT_GATES: dict[Recipe, AccuracyGates] = {
    Recipe.FP32: AccuracyGates(min_sqnr_db_vs_fp32=40.0),
    Recipe.FP16: AccuracyGates(min_sqnr_db_vs_fp32=30.0),
}
_MIN_SQNR_DB_VS_FAKE_QUANT = {8: 15.0, 16: 25.0}  # by activation bits
# Causal LMs, quantized: the logits of every teacher-forced position over the whole vocabulary,
# after every decoder layer's rounding. SmolLM2-135M (30 layers) 16a8w on the HTP emulator reads
# 19.2 dB vs its fake-quant model while its perplexity is no worse (32.9 vs 33.4): the HTP's
# fixed-point norms and softmax drift from the fake-quant float ones, layer after layer. So an
# LLM is judged by what its numbers are for: perplexity within 10 % of the fake-quant model's
# (a wrong program's is several times higher), with the SQNR floor of 8-bit activations.
_CAUSAL_LM_MIN_SQNR_DB_VS_FAKE_QUANT = 15.0
_CAUSAL_LM_MAX_PERPLEXITY_VS_FAKE_QUANT = 1.1
_MIN_COSINE_VS_FP32_QUANTIZED = 0.9
_MIN_WEIGHT_BITS_FOR_FP32_GATE = 4  # see above: not for 2-bit weights


@dataclass(frozen=True)
class NextTokenBounds:
    """How far a causal LM's next-token distributions may stray from eager fp32's under one
    recipe: the mean KL divergence (nats per token) and the same-top-token % where fp32
    decided (near ties forgiven)."""

    max_kl_mean: float
    min_same_top_percent: float


# Per recipe, from what it costs a real model (SmolLM2-135M, 30 layers, on the shipped corpus,
# docs/eval.md): several times a recipe's own KL and a same-top % well below its own, so that a
# model more sensitive than SmolLM2 passes while a broken program (KL in whole nats, the top token
# a coin toss) cannot. The same-top bound is judged where fp32 decided (a flip on a near tie,
# fp32's own top two within 0.1 nats, forgiven): a near-flat model's rounding flips near ties (a
# seeded tiny MoE at 16a8w: 87.5 % same top, every flip a near tie), a broken program flips
# decided positions. Measured, same top / where fp32 decided: 8da4w KL 0.018, 90.5 / 94.6 %;
# 16a8w 0.0063, 94.5 / 97.8 %; 16a4w_block 0.152, 77.2 / 82.9 % (each 4,096 tokens), within
# what a 4-bit recipe may cost; tiny-llama 8a8w 0.064, 88.7 % on its own text. A float program
# is fp32's arithmetic in another order (KL under 1e-6 on tiny-llama), or fp16's rounding. Not
# bounded below 4-bit weights (16a2w): there the loss is the recipe's by design, judged against
# its fake-quantized model instead.
_NEXT_TOKEN_BOUNDS: dict[Recipe, NextTokenBounds] = {
    Recipe.FP32: NextTokenBounds(max_kl_mean=0.01, min_same_top_percent=97.0),
    Recipe.FP16: NextTokenBounds(max_kl_mean=0.05, min_same_top_percent=90.0),
    Recipe.A16W16: NextTokenBounds(max_kl_mean=0.05, min_same_top_percent=90.0),
    Recipe.A16W8: NextTokenBounds(max_kl_mean=0.05, min_same_top_percent=88.0),
    Recipe.A8DW4: NextTokenBounds(max_kl_mean=0.1, min_same_top_percent=85.0),
    Recipe.A8W8: NextTokenBounds(max_kl_mean=0.25, min_same_top_percent=80.0),
    Recipe.A8W4: NextTokenBounds(max_kl_mean=0.25, min_same_top_percent=80.0),
    Recipe.A16W4: NextTokenBounds(max_kl_mean=0.25, min_same_top_percent=80.0),
    Recipe.A16W4_BLOCK: NextTokenBounds(max_kl_mean=0.25, min_same_top_percent=80.0),
}


def next_token_bounds(recipe: Recipe) -> NextTokenBounds | None:
    """The KL / same-top bounds of a causal LM under `recipe` (None: not bounded, 16a2w)."""
    return _NEXT_TOKEN_BOUNDS.get(recipe)


def default_accuracy_gates(recipe: Recipe, causal_lm: bool = False) -> AccuracyGates:
    """The gates a program compiled with `recipe` must pass when InferConfig sets none;
    `causal_lm`: a prefill + decode program judged on teacher-forced logits, perplexity and its
    next-token distributions against fp32 (`next_token_bounds`)."""
    bounds = next_token_bounds(recipe) if causal_lm else None
    lm = AccuracyGates() if bounds is None else AccuracyGates(
        max_kl_vs_fp32=bounds.max_kl_mean,
        min_same_top_percent_vs_fp32=bounds.min_same_top_percent,
    )
    if not recipe.is_quantized:
        return dataclasses.replace(_FLOAT_GATES[recipe], max_kl_vs_fp32=lm.max_kl_vs_fp32,
                                   min_same_top_percent_vs_fp32=lm.min_same_top_percent_vs_fp32)
    activation_bits, weight_bits = recipe.activation_bits, recipe.weight_bits
    assert activation_bits is not None and weight_bits is not None  # quantized recipes have both
    min_sqnr = _MIN_SQNR_DB_VS_FAKE_QUANT[activation_bits]
    return AccuracyGates(
        min_sqnr_db_vs_fake_quant=(
            min(min_sqnr, _CAUSAL_LM_MIN_SQNR_DB_VS_FAKE_QUANT) if causal_lm else min_sqnr
        ),
        min_cosine_vs_fp32=(
            _MIN_COSINE_VS_FP32_QUANTIZED
            if weight_bits >= _MIN_WEIGHT_BITS_FOR_FP32_GATE else None
        ),
        max_perplexity_vs_fake_quant=(
            _CAUSAL_LM_MAX_PERPLEXITY_VS_FAKE_QUANT if causal_lm else None
        ),
        max_kl_vs_fp32=lm.max_kl_vs_fp32,
        min_same_top_percent_vs_fp32=lm.min_same_top_percent_vs_fp32,
    )


def check_gate(name: str, value: float | None) -> None:
    """Refuse a gate that is not a number, or a cosine gate outside [-1, 1]; None is unset."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigValidationError(name, value, "must be a number (or unset for the default)")
    if "cosine" in name and not -1.0 <= value <= 1.0:
        raise ConfigValidationError(name, value, "a cosine gate must lie in [-1, 1]")
    if "same_top_percent" in name and not 0.0 <= value <= 100.0:
        raise ConfigValidationError(name, value, "a same-top gate is a percentage in [0, 100]")
    if "kl" in name.split("_") and not value >= 0.0:
        raise ConfigValidationError(name, value, "a KL divergence gate is >= 0 (nats per token)")
    if "perplexity" in name and not value >= 1.0:
        raise ConfigValidationError(
            name, value,
            "a perplexity ratio gate is at least 1 (1.1: at most 10 % above the fake-quant model)",
        )


@dataclass(frozen=True)
class EvalGates:
    """What a quantized causal LM's evaluation must show against the float model (the
    program's figures, `qnn_infer.evaluation`); None = not checked.

    Each gate judges a figure with its uncertainty: the KL mean and perplexity by the low end of
    their bootstrap intervals over windows, the same-top % where fp32 decided (near ties
    forgiven) by the high end of its own (so noise alone cannot fail a run), the prompt suite by
    the answers lost minus the answers gained on the same prompts. The defaults are 8a8w's;
    `default_eval_gates` gives each recipe its own.
    """

    # Mean per-token KL(fp32 || program) over the corpus windows the program read, in nats.
    max_kl_mean: float | None = 0.25
    # How often the program's most likely next token is the float model's where the float model
    # decided (a flip on a near tie forgiven).
    min_same_top_percent: float | None = 80.0
    # Program perplexity over fp32's, minus 1: failed when even the interval's low end is above.
    max_perplexity_increase: float | None = 0.25
    # Prompt suite: known answers the float model gave and the program lost, minus those it
    # gained, per hundred prompts with a known answer; failed only where the loss is also more
    # than chance (McNemar's test on the prompts where the two disagree).
    max_answer_drop_points: float | None = 10.0


def default_eval_gates(recipe: Recipe) -> EvalGates:
    """`qnn-pipeline --eval`'s gates for a program of `recipe`: its `next_token_bounds` (none for
    16a2w), with the perplexity and prompt-suite gates as `EvalGates` has them."""
    bounds = next_token_bounds(recipe)
    if bounds is None:
        return EvalGates(max_kl_mean=None, min_same_top_percent=None)
    return EvalGates(max_kl_mean=bounds.max_kl_mean,
                     min_same_top_percent=bounds.min_same_top_percent)


# Recipes a failing one can move to: more weight bits (or finer groups) on the same backend.
NEXT_RECIPE: dict[Recipe, tuple[Recipe, ...]] = {
    Recipe.A8DW4: (Recipe.A8W8,),
    Recipe.A8W4: (Recipe.A8W8,),
    Recipe.A16W2: (Recipe.A16W4_BLOCK, Recipe.A16W8),
    Recipe.A16W4: (Recipe.A16W4_BLOCK, Recipe.A16W8),
    Recipe.A16W4_BLOCK: (Recipe.A16W8,),
    Recipe.A8W8: (Recipe.A16W8,),
    Recipe.A16W8: (Recipe.A16W16,),
}
