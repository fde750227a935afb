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

A config also says how big a model to build, and its fields feed transformers' strict
dataclasses: `check_model_dir` has `qnn_common.torchio.hf_config.check_config` check them (types,
ranges, agreement, the weights' total against this machine's memory) first. JSON files are read
only up to `MAX_JSON_BYTES` (configs are kilobytes; tokenizer.json files, not read here, are
larger), and chat template files only up to `MAX_TEMPLATE_BYTES` (a template is read whole and
parsed before it renders: a 2 GB one costs gigabytes before any time limit can stop it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from qnn_common.errors import ArtifactError
from qnn_common.torchio.hf_config import check_config

HF_LOAD: Final[Mapping[str, Any]] = MappingProxyType(
    {"local_files_only": True, "trust_remote_code": False}
)
MAX_JSON_BYTES = 16 * 2**20
# Files in which transformers looks for an `auto_map` for the Auto classes this project uses.
CODE_MAPS = ("config.json", "tokenizer_config.json", "processor_config.json",
             "preprocessor_config.json")
MAX_TEMPLATE_BYTES = 1 << 20  # published templates, tool-use ones included, are kilobytes
# Files transformers reads a chat template from, whole (an old tokenizer_config.json's
# "chat_template" key is bounded as JSON, and again at rendering).
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TEMPLATE_DIR = "additional_chat_templates"
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
    """Raise ArtifactError if any of `directory`'s CODE_MAPS files maps custom code or holds an
    `auto_map` transformers cannot read (null, a string), or if a chat template file is larger
    than MAX_TEMPLATE_BYTES: all before transformers reads the directory."""
    for name in CODE_MAPS:
        path = directory / name
        if not path.is_file():
            continue
        data = read_hf_json(path)
        if "auto_map" not in data:
            continue
        auto_map = data["auto_map"]
        if auto_map and isinstance(auto_map, dict | list):
            shown = ", ".join(f"{k} -> {v}" for k, v in auto_map.items()) if isinstance(
                auto_map, dict) else repr(auto_map)
            raise ArtifactError(
                path,
                f"auto_map asks transformers to import and run the directory's own code "
                f"({shown[:200]}); {_FACTORY_HINT}",
            )
        if auto_map != {}:
            raise ArtifactError(
                path,
                f"auto_map is {json.dumps(auto_map)[:60]}, not an object naming classes; "
                "delete the auto_map key (it is needed only by models that ship their own code)",
            )
    _check_template_sizes(directory)


def _check_template_sizes(directory: Path) -> None:
    extra = directory / TEMPLATE_DIR
    paths = [directory / name for name in TEMPLATE_FILES]
    if extra.is_dir():
        paths.extend(sorted(extra.iterdir()))
    for path in paths:
        try:
            size = path.stat().st_size if path.is_file() else 0
        except OSError:
            continue  # unreadable: transformers says so when it reads the directory
        if size > MAX_TEMPLATE_BYTES:
            raise ArtifactError(
                path,
                f"the chat template is {size / 2**20:.1f} MiB; a chat template here may be at "
                f"most {MAX_TEMPLATE_BYTES >> 20} MiB (published ones are kilobytes); replace it "
                "with the model's real template",
            )


def check_model_dir(directory: Path) -> dict[str, Any]:
    """`refuse_custom_code` and `check_config` on a model directory; its config.json."""
    refuse_custom_code(directory)
    config_file = directory / "config.json"
    config = read_hf_json(config_file)
    check_config(config_file, config)
    return config
