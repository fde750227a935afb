"""Hugging Face files from outside: refused when they would run code or build an absurd model.

A directory's `auto_map` (in config.json, tokenizer_config.json, ...) names Python modules of its
own that transformers imports, and so runs, to build the model or tokenizer: with
`trust_remote_code=True` silently, and by default after asking "run the custom code? [y/N]" on a
terminal. Here that is never asked: every transformers load passes `HF_LOAD` (local files only,
`trust_remote_code=False`), and `refuse_custom_code` first refuses a directory that maps custom
code, naming the file and the classes, before transformers reads it. Code from a user runs only
where the user names it: a `package.module:function` model factory, which may load such a
model with `trust_remote_code=True` itself. So no opt-in flag: the factory is the opt-in, and it
says whose code it is.

A config also says how big a model to build, and transformers allocates what it says before any
weight is read (a million layers: minutes and gigabytes, then a MemoryError).
`check_config_sizes` refuses sizes past `SIZE_LIMITS` (each well above any published model),
and a model whose smallest possible weights (two hidden x hidden matrices per layer and the
embedding, in 16-bit) exceed this machine's memory. JSON files are read only up to
`MAX_JSON_BYTES` (configs are kilobytes; tokenizer.json files, not read here, are larger).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from qnn_common.errors import ArtifactError

HF_LOAD: Final[Mapping[str, Any]] = MappingProxyType(
    {"local_files_only": True, "trust_remote_code": False}
)
MAX_JSON_BYTES = 16 * 2**20
# Files in which transformers looks for an `auto_map` for the Auto classes this project uses.
CODE_MAPS = ("config.json", "tokenizer_config.json", "processor_config.json",
             "preprocessor_config.json")
# Far above any published model (layers: 126 for Llama 3.1 405B; hidden: 16,384; vocabulary:
# 256,000 for Gemma), far below what makes one allocation absurd.
SIZE_LIMITS: Final[Mapping[str, int]] = MappingProxyType({
    "num_hidden_layers": 1024, "n_layer": 1024, "num_layers": 1024,
    "hidden_size": 65_536, "n_embd": 65_536, "d_model": 65_536,
    "intermediate_size": 1_048_576, "n_inner": 1_048_576, "ffn_dim": 1_048_576,
    "num_attention_heads": 1024, "n_head": 1024, "num_key_value_heads": 1024,
    "head_dim": 65_536, "num_experts": 4096, "num_local_experts": 4096,
    "vocab_size": 4_194_304,
    "max_position_embeddings": 16_777_216, "n_positions": 16_777_216,
})
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_FACTORY_HINT = (
    "this tool loads only the model and tokenizer classes transformers ships, never a "
    "directory's own code; to run it, wrap the model in a 'package.module:function' factory "
    "(--model package.module:function) that loads it with trust_remote_code=True, as code you "
    "choose to trust"
)


def read_hf_json(path: Path) -> dict[str, Any]:
    """`path` as a JSON object, read only if it is at most MAX_JSON_BYTES."""
    data = read_hf_json_value(path)
    if not isinstance(data, dict):
        raise ArtifactError(path, "expected a JSON object; re-save the model")
    return data


def read_hf_json_value(path: Path) -> Any:
    """`path` as JSON of any kind, read only if it is at most MAX_JSON_BYTES."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ArtifactError(
                path,
                f"is {size / 2**20:.1f} MiB; a Hugging Face JSON file here may be at most "
                f"{MAX_JSON_BYTES // 2**20} MiB (configs are kilobytes); re-save the model",
            )
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as err:
        raise ArtifactError(
            path, f"cannot read it as JSON ({type(err).__name__}: {err}); re-save the model"
        ) from None


def refuse_custom_code(directory: Path) -> None:
    """Raise ArtifactError if any of `directory`'s CODE_MAPS files maps custom code."""
    for name in CODE_MAPS:
        path = directory / name
        if not path.is_file():
            continue
        auto_map = read_hf_json(path).get("auto_map")
        if auto_map:
            shown = ", ".join(f"{k} -> {v}" for k, v in auto_map.items()) if isinstance(
                auto_map, dict) else repr(auto_map)
            raise ArtifactError(
                path,
                f"auto_map asks transformers to import and run the directory's own code "
                f"({shown[:200]}); {_FACTORY_HINT}",
            )


def check_model_dir(directory: Path) -> dict[str, Any]:
    """`refuse_custom_code` and `check_config_sizes` on a model directory; its config.json."""
    refuse_custom_code(directory)
    config_file = directory / "config.json"
    config = read_hf_json(config_file)
    check_config_sizes(config_file, config)
    return config


def check_config_sizes(path: Path, config: Mapping[str, Any]) -> None:
    """Raise ArtifactError if `config` (read from `path`) asks for a size past SIZE_LIMITS, or
    for weights that cannot fit in this machine's memory; nested configs (text_config, ...)
    included."""
    for where, section in _sections(config, ""):
        for field, limit in SIZE_LIMITS.items():
            value = section.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > limit:
                raise ArtifactError(
                    path,
                    f"{where}{field} = {value} is past the sane limit of {limit}; a config "
                    "asking for that builds no model that could run here; fix the config",
                )
        layers = _first_int(section, _LAYERS)
        hidden = _first_int(section, _HIDDEN)
        vocab = _first_int(section, ("vocab_size",))
        if layers and hidden:
            least = 2 * (2 * layers * hidden * hidden + vocab * hidden)  # bytes, 16-bit weights
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            if least > memory:
                raise ArtifactError(
                    path,
                    f"{where}layers x hidden size x vocab_size ({layers} x {hidden} x {vocab}) "
                    f"ask for at least {least / 2**30:.1f} GiB of weights; this machine has "
                    f"{memory / 2**30:.1f} GiB of memory; fix the config or use a larger host",
                )


def _sections(config: Mapping[str, Any], where: str, depth: int = 0) -> Iterator[
        tuple[str, Mapping[str, Any]]]:
    yield where, config
    if depth < 4:
        for key, value in config.items():
            if isinstance(value, Mapping):
                yield from _sections(value, f"{where}{key}.", depth + 1)


def _first_int(section: Mapping[str, Any], fields: tuple[str, ...]) -> int:
    for field in fields:
        value = section.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0
