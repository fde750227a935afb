"""Backends, quantization recipes, and the rules of which backend / HTP arch can run which recipe.

Recipe values are strings, never ints: upstream's op tests picked the dtype with
`if dtype := getattr(QuantDtype, name)` and silently skipped 16a16w, whose enum value is 0. Code
here always tests `recipe is None`, never truthiness.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from qnn_common.errors import ConfigValidationError
from qnn_common.soc import HtpArch, Soc

E = TypeVar("E", bound=enum.StrEnum)


class Backend(enum.StrEnum):
    """Where the compiled program runs."""

    XNNPACK = "xnnpack"  # host CPU; the default everywhere
    QNN = "qnn"  # Qualcomm HTP, compiled ahead of time for one SoC
    PORTABLE = "portable"  # ExecuTorch's reference kernels


class Recipe(enum.StrEnum):
    """Numeric precision of a compiled model: `<activation bits>a<weight bits>w`, or a float."""

    FP32 = "fp32"
    FP16 = "fp16"
    A8W8 = "8a8w"
    A8W4 = "8a4w"
    A16W8 = "16a8w"
    A16W16 = "16a16w"
    A16W4 = "16a4w"
    A16W4_BLOCK = "16a4w_block"  # LPBQ: low-power block quantization of 4-bit weights
    A16W2 = "16a2w"
    # int8 activations quantized per token at run time ("d": dynamic), 4-bit weights with one
    # scale per group of input channels: the CPU recipe of upstream's LLM exports (torchao's
    # Int8DynamicActivationIntxWeightConfig). No calibration.
    A8DW4 = "8da4w"

    @property
    def traits(self) -> RecipeTraits:
        return RECIPES[self]

    @property
    def is_quantized(self) -> bool:
        return self.traits.activation_bits is not None

    @property
    def is_dynamic(self) -> bool:
        """Whether every activation scale is chosen at run time: nothing to calibrate."""
        return self.traits.dynamic

    @property
    def has_weight_groups(self) -> bool:
        """Whether 4-bit weights come in groups of input channels, each with its own scale
        (8da4w's groups, 16a4w_block's LPBQ blocks): what `GroupMapping` applies to."""
        return self.traits.weight_groups is not None

    @property
    def activation_bits(self) -> int | None:
        return self.traits.activation_bits

    @property
    def weight_bits(self) -> int | None:
        return self.traits.weight_bits


class WeightGroups(enum.StrEnum):
    """How a recipe's 4-bit weights share scales across input channels."""

    GROUPS = "groups"  # 8da4w: torchao's groups, asymmetric by default (GGUF Q4_1's form)
    LPBQ = "lpbq"  # 16a4w_block: QNN's low-power block quantization, symmetric as upstream's


@dataclass(frozen=True)
class HtpFloor:
    """The oldest HTP arch that runs a recipe, and why (ExecuTorch's Qualcomm docs)."""

    arch: HtpArch
    why: str


@dataclass(frozen=True)
class RecipeTraits:
    """What a recipe is, in one place: every stage asks here, never parses the recipe's name
    (`BackendTraits` says which backend runs it)."""

    activation_bits: int | None  # None: a float recipe
    weight_bits: int | None
    # Activation scales chosen per call at run time (torchao's dynamic int8): nothing to calibrate.
    dynamic: bool = False
    weight_groups: WeightGroups | None = None  # None: one scale per output channel (or tensor)
    # The QNN quantizer's QuantDtype member (upstream's name); None: not a QNN quantized recipe.
    qnn_dtype: str | None = None
    htp_floor: HtpFloor | None = None  # None: every HTP arch the backend knows


RECIPES: dict[Recipe, RecipeTraits] = {
    Recipe.FP32: RecipeTraits(None, None),
    Recipe.FP16: RecipeTraits(
        None, None, htp_floor=HtpFloor(HtpArch.V69, "the HTP float16 datapath starts at V69")),
    Recipe.A8W8: RecipeTraits(8, 8, qnn_dtype="use_8a8w"),
    Recipe.A8W4: RecipeTraits(8, 4, qnn_dtype="use_8a4w"),
    Recipe.A16W8: RecipeTraits(16, 8, qnn_dtype="use_16a8w"),
    Recipe.A16W16: RecipeTraits(
        16, 16, qnn_dtype="use_16a16w",
        htp_floor=HtpFloor(HtpArch.V73, "16-bit weight matmul (16a16w) needs HTP >= V73")),
    Recipe.A16W4: RecipeTraits(16, 4, qnn_dtype="use_16a4w"),
    Recipe.A16W4_BLOCK: RecipeTraits(
        16, 4, weight_groups=WeightGroups.LPBQ, qnn_dtype="use_16a4w_block",
        htp_floor=HtpFloor(HtpArch.V69, "LPBQ (16a4w_block) needs HTP >= V69")),
    Recipe.A16W2: RecipeTraits(16, 2, qnn_dtype="use_16a2w"),
    Recipe.A8DW4: RecipeTraits(8, 4, dynamic=True, weight_groups=WeightGroups.GROUPS),
}


class WeightRounding(enum.StrEnum):
    """How quantized weights are rounded onto their per-channel grid."""

    NEAREST = "nearest"  # each weight to its nearest level: the stock PT2E behaviour
    # GPTQ (Frantar et al. 2022): column by column, the rounding error of each weight is pushed
    # onto the columns not yet rounded, weighted by the layer's input statistics from
    # calibration. Linear layers only; the scales stay those of round-to-nearest.
    GPTQ = "gptq"


def default_weight_rounding(recipe: Recipe, per_channel: bool = True) -> WeightRounding:
    """GPTQ for calibrated 4-bit weights (per channel, or LPBQ's blocks), nearest otherwise.

    At 4 bits rounding each weight alone costs accuracy that GPTQ wins back (docs/quantization.md
    has the tiny-llama and SmolLM2 figures); at 8 bits rounding to nearest loses little, and
    GPTQ costs calibration passes. 16a4w_block's GPTQ rounds onto the block scales its observer
    chose, after calibration (`qnn_quant.quantizers.lpbq_gptq`).
    """
    if recipe.is_dynamic:
        return WeightRounding.NEAREST  # no calibration data, so nothing GPTQ could weigh by
    if per_channel and recipe.weight_bits == 4:
        return WeightRounding.GPTQ
    return WeightRounding.NEAREST


def check_weight_rounding(
    recipe: Recipe, rounding: WeightRounding, per_channel: bool, field: str = "weight_rounding"
) -> None:
    """Refuse a rounding the recipe cannot use, saying why."""
    if rounding is WeightRounding.NEAREST:
        return
    if recipe.is_dynamic:
        raise ConfigValidationError(
            field, rounding.value,
            f"GPTQ weighs rounding errors by calibration inputs, and {recipe.value} takes none "
            "(its activation scales are chosen per token at run time); use weight_rounding "
            "nearest, or a calibrated 4-bit recipe (16a4w on qnn)",
        )
    if recipe.weight_bits not in (4, 8):
        raise ConfigValidationError(
            field, rounding.value,
            f"GPTQ rounds 4- and 8-bit weights; {recipe.value} has {recipe.weight_bits}-bit "
            "weights; use weight_rounding nearest",
        )
    if not per_channel:
        raise ConfigValidationError(
            field, rounding.value,
            "GPTQ here keeps one scale per output channel; set per_channel true or use nearest",
        )


def check_dynamic_layers(
    backend: Backend, patterns: tuple[str, ...], field: str = "dynamic_layers"
) -> None:
    """Refuse dynamically quantized layers where the backend cannot run them, saying why.

    Dynamic quantization chooses an activation's scale at run time from the values it gets
    (XNNPACK's qd8 GEMMs, portable's choose_qparams kernel). The HTP fixes every scale when its
    context binary is built, so QNN has none.
    """
    if patterns and not BACKENDS[backend].dynamic_activations:
        raise ConfigValidationError(
            field, list(patterns),
            "the qnn backend fixes every activation scale when the HTP context is built and has "
            "no run-time (dynamic) quantization; leave dynamic_layers empty, and for layers "
            "with outliers use 16-bit activations (16a8w)",
        )


@dataclass(frozen=True)
class GroupSizeRule:
    """A backend's rule on 8da4w weight-group sizes: groups a multiple of `multiple` input
    channels, and what to say (and suggest) when a size breaks it."""

    multiple: int
    why: str


@dataclass(frozen=True)
class BackendTraits:
    """What a backend is, in one place: every stage asks here instead of keeping a list."""

    recipes: tuple[Recipe, ...]  # what it can run at all
    hint: str  # what it runs, said when a recipe is refused
    float_recipe: Recipe  # the recipe of an unquantized program
    needs_soc: bool  # compiled ahead of time for one SoC (and so runs off the host)
    # Activation scales chosen per call at run time (dynamic linears, 8da4w); the HTP fixes every
    # scale when its context is built.
    dynamic_activations: bool
    # A program may update buffers in place (a static KV cache); QNN has no mutable buffers, so
    # a KV-cache program for it keeps the cache as its inputs and outputs.
    mutable_buffers: bool
    # A KV-cache program's cache written and read by ExecuTorch's LLM custom ops by default
    # (qnn_prepare.causal_lm.custom_op_attention): fused CPU attention, and no portable kernels
    # between the delegate's partitions of every layer.
    llm_custom_ops: bool
    runtime_id: str | None  # the delegate id a .pte names it by (None: no delegate)
    # Compiled for the SoC's HTP arch: a recipe's `HtpFloor` applies, and the HTP's build
    # options (`CompileConfig.htp_performance_mode`) mean something.
    compiles_for_htp: bool = False
    # Methods of one program may share one copy of their weights inside the delegate's context
    # (QNN weight sharing, `check_weight_sharing`); elsewhere a program already stores a weight
    # its methods share once.
    weight_sharing: bool = False
    # A causal LM's decoder layers may be split into several delegate contexts
    # (`CompileConfig.num_shards`): what keeps each HTP context under the device's limit.
    context_shards: bool = False
    # A quantized program may leave layers in float (run on the CPU kernels between
    # partitions). The HTP's program must run whole, and a float linear between fixed-point
    # tensors cannot lower at all (no float FullyConnected there): nothing is left float by
    # default, and a float linear is refused (`qnn_quant.layers`).
    float_layers_in_quantized: bool = True
    # Its program runs on this host through an emulator (QNN's HTP emulator on x86), orders
    # slower than the CPU runs the references: an evaluation gives it a budget of its own.
    emulated_on_host: bool = False
    # 8da4w's weight-group sizes its kernels take (None: any size).
    group_size_rule: GroupSizeRule | None = None
    # Why it cannot run one recipe in particular, and what to pick instead: said before `hint`.
    refusals: Mapping[Recipe, str] = dataclasses.field(default_factory=dict)
    # A prompt's rest after its whole prefill windows, if at most this many tokens, goes a token
    # at a time through decode rather than through one padded prefill window. A rule of the
    # backend, not a timing: the two ways round differently, and a near tie they tip must tip the
    # same way in every run and in the evaluation's replies (qnn_infer.evaluation).
    prompt_rest_decode_up_to: int = 1


BACKENDS: dict[Backend, BackendTraits] = {
    # 8da4w: XNNPACK's qd8 x qb4w GEMMs (int8 activations per token, 4-bit blockwise weights).
    Backend.XNNPACK: BackendTraits(
        recipes=(Recipe.FP32, Recipe.A8W8, Recipe.A8DW4),
        hint="XNNPACK runs fp32, 8a8w (symmetric int8 weights, int8 activations) and 8da4w "
        "(int8 activations per token at run time, 4-bit grouped weights)",
        float_recipe=Recipe.FP32, needs_soc=False, dynamic_activations=True,
        mutable_buffers=True, llm_custom_ops=True, runtime_id="XnnpackBackend",
        # Measured: ExecuTorch 1.5.1's XNNPACK lowering asserts "requires group_size to be a
        # multiple of 32" for 8, 16 and 48; 32 and 64 lower and run.
        group_size_rule=GroupSizeRule(
            32, "XNNPACK's blockwise 4-bit kernels take groups that are a multiple of 32 input "
            "channels; use 32 (the default), 64, 128 ... (portable takes any size)"),
        # A CPU's prefill window reuses each weight across its tokens, so a 32-token window costs
        # five to eight decode steps on the x86 hosts measured (docs/llm.md); four steps is below
        # that on each, so the rule never costs time where it saves some.
        prompt_rest_decode_up_to=4,
    ),
    # The reference for quantized programs too: quantized_decomposed kernels, bit-exact with
    # fake quant, so it tells a backend's deviation from the quantizer's. 8da4w runs there as
    # the plain ATen ops torchao's affine quantize ops decompose into.
    Backend.PORTABLE: BackendTraits(
        recipes=(Recipe.FP32, Recipe.A8W8, Recipe.A8DW4),
        hint="the portable reference kernels run fp32, 8a8w and 8da4w",
        float_recipe=Recipe.FP32, needs_soc=False, dynamic_activations=True,
        # The reference keeps the plain ATen ops (custom_ops can be asked for).
        mutable_buffers=True, llm_custom_ops=False, runtime_id=None,
    ),
    # No fp32 datapath: a float program is fp16.
    Backend.QNN: BackendTraits(
        recipes=tuple(r for r in Recipe if r not in (Recipe.FP32, Recipe.A8DW4)),
        hint="the HTP has no fp32 datapath; use fp16 for a float model",
        float_recipe=Recipe.FP16, needs_soc=True, dynamic_activations=False,
        mutable_buffers=False, llm_custom_ops=False, runtime_id="QnnBackend",
        # The HTP (and its emulator) runs a prefill window in about the time of one decode step.
        prompt_rest_decode_up_to=1,
        compiles_for_htp=True, weight_sharing=True, context_shards=True,
        float_layers_in_quantized=False, emulated_on_host=True,
        refusals={Recipe.A8DW4: (
            "8da4w chooses each activation scale per token at run time, and the HTP fixes every "
            "scale when its context binary is built (it has no run-time quantization); for 4-bit "
            "weights on qnn use 16a4w (calibrated static 16-bit activations), or 16a4w_block on "
            "V69+; 8da4w is a recipe of the xnnpack and portable backends"
        )},
    ),
}

def recipes_for(backend: Backend, soc: Soc | None = None) -> tuple[Recipe, ...]:
    """The recipes `backend` (on `soc`, for QNN) can run."""
    allowed = BACKENDS[backend].recipes
    if BACKENDS[backend].compiles_for_htp and soc is not None:
        allowed = tuple(
            r
            for r in allowed
            if (floor := r.traits.htp_floor) is None or soc.htp_arch >= floor.arch
        )
    return allowed


def check_recipe(backend: Backend, recipe: Recipe, soc: Soc | None, field: str = "recipe") -> None:
    """Raise ConfigValidationError saying why `recipe` cannot run, and what to pick instead."""
    if BACKENDS[backend].needs_soc and soc is None:
        raise ConfigValidationError(
            "soc", None, f"the {backend.value} backend compiles for one SoC; pass one (e.g. SM8650)"
        )
    if recipe not in BACKENDS[backend].recipes:
        why = BACKENDS[backend].refusals.get(recipe, BACKENDS[backend].hint)
        raise ConfigValidationError(
            field,
            recipe.value,
            f"backend {backend.value} cannot run it: {why}",
            allowed=tuple(r.value for r in recipes_for(backend, soc)),
        )
    floor = recipe.traits.htp_floor if BACKENDS[backend].compiles_for_htp else None
    if floor is not None and soc is not None and soc.htp_arch < floor.arch:
        suggestion = "16a4w is the suggested baseline on older HTP"
        raise ConfigValidationError(
            field,
            recipe.value,
            f"{floor.why}, and {soc.name} is {soc.htp_arch}; {suggestion}",
            allowed=tuple(r.value for r in recipes_for(backend, soc)),
        )


# Methods of one QNN program (a causal LM's prefill and decode) sharing one copy of their weights
# in the context binary: QNN's weight sharing, HTP >= V73 (ExecuTorch's Qualcomm docs). QNN's x86
# emulator refuses to load such a context ("Shared weights buffer isn't supported on this
# platform", QNN 2.51), so only a device runs it.
WEIGHT_SHARING_MIN_ARCH = HtpArch.V73


def check_weight_sharing(backend: Backend, soc: Soc | None, field: str = "weight_sharing") -> None:
    """Refuse QNN weight sharing where it cannot be built, saying why."""
    if not BACKENDS[backend].weight_sharing:
        raise ConfigValidationError(
            field, True,
            f"weight sharing is a QNN context feature; {backend.value} programs already store "
            "a weight the methods share once",
        )
    if soc is not None and soc.htp_arch < WEIGHT_SHARING_MIN_ARCH:
        raise ConfigValidationError(
            field, True,
            f"QNN weight sharing needs HTP >= {WEIGHT_SHARING_MIN_ARCH}, and {soc.name} is "
            f"{soc.htp_arch}; drop it (each method then carries its own weights)",
        )


def parse_enum(kind: type[E], value: str, field: str) -> E:
    """Parse a string into `kind`, case-insensitively, with an error listing the allowed values."""
    try:
        return kind(value.strip().lower())
    except ValueError:
        raise ConfigValidationError(
            field, value, f"unknown {kind.__name__.lower()}", allowed=tuple(m.value for m in kind)
        ) from None
