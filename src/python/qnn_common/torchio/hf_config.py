"""A Hugging Face config.json's fields, checked before transformers reads them.

transformers builds its configs as strict dataclasses and its models straight from the numbers:
a float where a count goes, a null vocab_size, heads that do not divide the hidden size or an
`auto_map` of null each raise from deep inside transformers or huggingface_hub (a traceback, not
a message), and a count of -1 layers builds an empty model quietly. And a config says how big a
model to build: transformers allocates what it says before any weight is read.

`check_config` walks the config and each nested section (text_config, ...) and raises one
ArtifactError for the first field whose type, range or agreement with the others is wrong, naming
the field, its value, why, and what to do; then it refuses a model whose weights, counted as
`weight_count` counts them (embeddings, attention with its key-value heads and head_dim, the MLP
with its intermediate size, gated or not, MoE experts, norms, an untied LM head), cannot fit in
this machine's memory. Fields it does not know are left to transformers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeGuard

from qnn_common.errors import ArtifactError

# Far above any published model (layers: 126 for Llama 3.1 405B; hidden: 16,384; vocabulary:
# 256,000 for Gemma), far below what makes one allocation absurd.
SIZE_LIMITS: Final[Mapping[str, int]] = MappingProxyType({
    "num_hidden_layers": 1024, "n_layer": 1024, "num_layers": 1024,
    "hidden_size": 65_536, "n_embd": 65_536, "d_model": 65_536,
    "intermediate_size": 1_048_576, "n_inner": 1_048_576, "ffn_dim": 1_048_576,
    "moe_intermediate_size": 1_048_576,
    "num_attention_heads": 1024, "n_head": 1024, "num_key_value_heads": 1024,
    "head_dim": 65_536, "num_experts": 4096, "num_local_experts": 4096, "n_routed_experts": 4096,
    "n_shared_experts": 4096, "num_experts_per_tok": 4096,
    "shared_expert_intermediate_size": 1_048_576,
    "vocab_size": 4_194_304,
    "max_position_embeddings": 16_777_216, "n_positions": 16_777_216,
})
# Counts that may be 0 (a model without experts); every other count is at least 1.
_MAY_BE_ZERO = frozenset({"num_experts", "num_local_experts", "n_routed_experts",
                          "n_shared_experts", "num_experts_per_tok",
                          "shared_expert_intermediate_size"})
# Counts transformers derives when null (GPT-2's n_inner: 4 x hidden; kv heads: the heads).
_MAY_BE_NULL = frozenset({"num_key_value_heads", "head_dim", "n_inner", "intermediate_size",
                          "moe_intermediate_size", *_MAY_BE_ZERO})
_POSITIVE_REALS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta")
_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_cache", "is_decoder",
          "is_encoder_decoder")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "cls_token_id",
              "decoder_start_token_id")
_TOKEN_ID_LIMIT = 2**31
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_HEADS = ("num_attention_heads", "n_head")
_INTERMEDIATE = ("intermediate_size", "n_inner", "ffn_dim")
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")
# Families whose MLP is gated (gate, up and down projections: three matrices, not two).
_GATED_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi3", "olmo", "olmo2", "granite", "granitemoe", "smollm3", "cohere",
    "deepseek_v2", "deepseek_v3", "internlm2", "ministral", "glm", "helium",
})
_GATED_ACTS = frozenset({"silu", "swish", "swiglu"})
_FIX = "fix config.json (or re-save the model with save_pretrained)"


def check_config(path: Path, config: Mapping[str, Any]) -> None:
    """Raise ArtifactError for the first malformed field of `config` (read from `path`), or for
    weights that cannot fit in this machine's memory."""
    if "model_type" not in config:
        raise ArtifactError(path, f"has no model_type, so transformers cannot tell which model "
                                  f"it describes; {_FIX}")
    sections = list(_sections(config, ""))
    for where, section in sections:
        _check_section(path, where, section)
    if not any("vocab_size" in section for _, section in sections):
        raise ArtifactError(path, "has no vocab_size (the number of tokens the model's embedding "
                                  f"holds), so it is no text model this tool loads; {_FIX}")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for where, section in _sections(config, ""):
        count = weight_count(section)
        need = count * _bytes_per_weight(config, section)
        if need > memory:
            mlp = "MLP experts" if _first(section, _EXPERTS) else "MLP"
            raise ArtifactError(
                path,
                f"{where or 'the config'} asks for {count:,} weights ({need / 2**30:.1f} GiB, "
                f"counting embeddings, attention, {mlp} and LM head); this machine has "
                f"{memory / 2**30:.1f} GiB of memory; fix the config or use a larger host",
            )


def weight_count(section: Mapping[str, Any]) -> int:
    """How many weights a decoder (or encoder) `section` of a config builds; 0 if it names no
    layers or hidden size. A count omitted takes transformers' usual default (kv heads: the
    heads; head_dim: hidden / heads; MLP: 4 x hidden)."""
    layers = _first(section, _LAYERS)
    hidden = _first(section, _HIDDEN)
    if not layers or not hidden:
        return 0
    vocab = _first(section, ("vocab_size",))
    heads = _first(section, _HEADS) or 1
    kv_heads = _first(section, ("num_key_value_heads",)) or heads
    head_dim = _first(section, ("head_dim",)) or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o; k, v
    act = section.get("hidden_act")
    gated = section.get("model_type") in _GATED_TYPES or act in _GATED_ACTS
    matrices = 3 if gated else 2
    intermediate = _first(section, _INTERMEDIATE) or 4 * hidden
    experts = _first(section, _EXPERTS)
    if experts:
        expert_size = _first(section, ("moe_intermediate_size",)) or intermediate
        # Shared experts: DeepSeek counts them in moe_intermediate_size units, Qwen-MoE gives
        # one of its own width (and a gate of hidden weights).
        shared = _first(section, ("n_shared_experts",)) * expert_size + _first(
            section, ("shared_expert_intermediate_size",))
        mlp = matrices * hidden * (expert_size * experts + shared) + hidden * experts  # + router
    else:
        mlp = matrices * hidden * intermediate
    norms = 2 * hidden
    embeddings = vocab * hidden
    tied = section.get("tie_word_embeddings", True) is not False
    lm_head = 0 if tied else vocab * hidden
    return layers * (attention + mlp + norms) + embeddings + lm_head + hidden


def _bytes_per_weight(config: Mapping[str, Any], section: Mapping[str, Any]) -> int:
    """2 for a config stored in 16 bits (transformers loads it so), else 4."""
    dtype = section.get("dtype", section.get("torch_dtype",
                                             config.get("dtype", config.get("torch_dtype"))))
    return 2 if dtype in ("float16", "bfloat16") else 4


def _check_section(path: Path, where: str, section: Mapping[str, Any]) -> None:
    def refuse(field: str, why: str) -> ArtifactError:
        return ArtifactError(path, f"{where}{field} = {_shown(section[field])} {why}; {_FIX}")

    for field, limit in SIZE_LIMITS.items():
        if field not in section:
            continue
        value = section[field]
        least = 0 if field in _MAY_BE_ZERO else 1
        if value is None:
            if field not in _MAY_BE_NULL:
                raise refuse(field, f"must be a whole number of at least {least}, not null")
        elif not _is_int(value):
            raise refuse(field, f"is a {_kind(value)}, not a whole number{_int_hint(value)}")
        elif value < least:
            raise refuse(field, f"is less than {least}")
        elif value > limit:
            raise refuse(field, f"is past the sane limit of {limit}: no model that could run "
                                "here asks for that")
    for field in _POSITIVE_REALS:
        value = section.get(field)
        if field in section and value is not None and not (
            _is_real(value) and math.isfinite(value) and value > 0
        ):
            raise refuse(field, "must be a positive finite number")
    for field in _BOOLS:
        if field in section and not isinstance(section[field], bool):
            raise refuse(field, "must be true or false")
    for field in _TOKEN_IDS:
        value = section.get(field)
        # Only generation's stop tokens may be several.
        ids = value if isinstance(value, list) and field == "eos_token_id" else [value]
        if field in section and not all(
            i is None or (_is_int(i) and -_TOKEN_ID_LIMIT < i < _TOKEN_ID_LIMIT) for i in ids
        ):
            several = ", a list of them" if field == "eos_token_id" else ""
            raise refuse(field, f"must be a token id (a whole number){several} or null")
    if "model_type" in section and not (
        isinstance(section["model_type"], str) and section["model_type"]
    ):
        raise refuse("model_type", "must be a model family's name, such as \"llama\"")
    _check_names(refuse, section, is_rope="rope_scaling." in where or "rope_parameters." in where)
    archs = section.get("architectures")
    if archs is not None and not (
        isinstance(archs, list) and all(isinstance(a, str) for a in archs)
    ):
        raise refuse("architectures", "must be a list of class names, such as "
                                      "[\"LlamaForCausalLM\"]")
    for field in ("rope_scaling", "rope_parameters", "text_config"):
        if section.get(field) is not None and not isinstance(section[field], Mapping):
            raise refuse(field, "must be an object or null")
    _check_agreement(refuse, section)


def _check_names(
    refuse: Callable[[str, str], ArtifactError], section: Mapping[str, Any], *, is_rope: bool
) -> None:
    """An activation and a RoPE type transformers knows (it looks them up in a dict: KeyError)."""
    from transformers.activations import ACT2FN
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    act = section.get("hidden_act")
    if "hidden_act" in section and not (isinstance(act, str) and act in ACT2FN):
        raise refuse("hidden_act", f"is no activation transformers has; use one of "
                                   f"{', '.join(sorted(ACT2FN))}")
    if not is_rope:
        return
    kinds = ("default", *ROPE_INIT_FUNCTIONS)
    for field in ("rope_type", "type"):
        kind = section.get(field)
        if field in section and not (isinstance(kind, str) and kind in kinds):
            raise refuse(field, f"is no RoPE type transformers has; use one of {', '.join(kinds)}")


def _check_agreement(
    refuse: Callable[[str, str], ArtifactError], section: Mapping[str, Any]
) -> None:
    """Heads against hidden size and key-value heads, experts against experts per token."""
    hidden_field = next((f for f in _HIDDEN if _is_int(section.get(f))), None)
    heads_field = next((f for f in _HEADS if _is_int(section.get(f))), None)
    if hidden_field and heads_field and section[hidden_field] % section[heads_field]:
        raise refuse(
            hidden_field,
            f"is not a multiple of {heads_field} ({section[heads_field]}), so the heads cannot "
            "split it evenly; make the hidden size a multiple of the number of heads",
        )
    kv_heads = section.get("num_key_value_heads")
    if heads_field and _is_int(kv_heads) and section[heads_field] % kv_heads:
        raise refuse(
            "num_key_value_heads",
            f"does not divide {heads_field} ({section[heads_field]}), so the query heads cannot "
            "share key-value heads evenly; use a divisor of the number of heads",
        )
    per_token = section.get("num_experts_per_tok")
    experts = _first(section, _EXPERTS)
    if _is_int(per_token) and experts and per_token > experts:
        raise refuse("num_experts_per_tok", f"is more than the {experts} experts there are")


def _sections(config: Mapping[str, Any], where: str, depth: int = 0) -> Iterator[
        tuple[str, Mapping[str, Any]]]:
    yield where, config
    if depth < 4:
        for key, value in config.items():
            if isinstance(value, Mapping):
                yield from _sections(value, f"{where}{key}.", depth + 1)


def _first(section: Mapping[str, Any], fields: tuple[str, ...]) -> int:
    for field in fields:
        value = section.get(field)
        if _is_int(value) and value > 0:
            return int(value)
    return 0


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_hint(value: object) -> str:
    """How to write `value` as the whole number it may mean."""
    number: object = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return ""
    if isinstance(number, float) and number.is_integer() and abs(number) < 2**53:
        return f" (write {int(number)}, without quotes or a decimal point)"
    return ""


def _kind(value: object) -> str:
    return {str: "string", float: "decimal number", bool: "true/false", list: "list",
            dict: "object"}.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    """`value` as config.json writes it."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
