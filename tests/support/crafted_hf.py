"""Hostile Hugging Face directories: a real tiny decoder whose files ask for more than weights.

`with_custom_code` adds an `auto_map` pointing at a module of its own: transformers, allowed to
trust it, imports that module, which writes a marker file (proof that code ran) and then defines
the classes the map names as subclasses of the stock Llama ones, so that without a guard
everything loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qnn_prepare.causal_lm.tiny_decoders import save_tiny_decoder

_MODULE = "custom_llama"


def tiny_decoder_dir(directory: Path) -> Path:
    """tiny-llama as a HF directory (config, safetensors, the byte tokenizer)."""
    return save_tiny_decoder("tiny-llama", directory)


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def with_custom_code(directory: Path, marker: Path, *, where: str = "config.json") -> Path:
    """`directory` (a HF model or tokenizer directory) with custom code mapped in `where`
    (config.json or tokenizer_config.json)."""
    (directory / f"{_MODULE}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('custom code ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast\n"
        "class CustomConfig(LlamaConfig):\n    model_type = 'custom_llama'\n"
        "class CustomForCausalLM(LlamaForCausalLM):\n    config_class = CustomConfig\n"
        "class CustomTokenizer(PreTrainedTokenizerFast):\n    pass\n",
        encoding="utf-8",
    )
    # Names transformers does not know, so that only the custom code can load the directory.
    changes: dict[str, Any] = (
        {
            "model_type": "custom_llama",
            "auto_map": {
                "AutoConfig": f"{_MODULE}.CustomConfig",
                "AutoModelForCausalLM": f"{_MODULE}.CustomForCausalLM",
            },
        }
        if where == "config.json"
        else {
            "tokenizer_class": "CustomTokenizer",
            "auto_map": {"AutoTokenizer": [None, f"{_MODULE}.CustomTokenizer"]},
        }
    )
    edit_json(directory / where, **changes)
    return directory
