"""A local Hugging Face model directory: checked, its config read, its tokenizer loaded.

Shared by the text-encoder and causal-LM tasks, which differ only in how they wrap the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.torchio.hf_untrusted import HF_LOAD, check_model_dir, read_hf_json

EXAMPLE_SENTENCE = "ExecuTorch runs this model on a phone after it has been quantized."

# Files copied next to a compiled model so it can tokenize and be identified on its own. All sit
# at the top of the model directory, so copying them flat cannot collide (the pooling config in
# 1_Pooling/ is left out: pooling is part of the exported graph).
TOKENIZER_FILE_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "config.json",
    "generation_config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)


def read_json(path: Path) -> dict[str, Any]:
    """`path` as a JSON object (size-bounded: `qnn_common.torchio.hf_untrusted.read_hf_json`)."""
    return read_hf_json(path)


# A tokenizer's own files: with none of them a directory has no tokenizer (random-weight test
# models often ship none); with any, it has one, and it must load.
OWN_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                       "merges.txt", "tokenizer.model", "spiece.model")


def read_tokenizer(model_dir: Path) -> Any | None:
    """transformers' tokenizer of `model_dir`, None when it ships none of OWN_TOKENIZER_FILES.

    One that ships them but does not load (a truncated tokenizer.json) is refused here, naming
    the file: dropping it would export a model whose artifact carries those files and fails
    only when infer reads them.
    """
    present = [model_dir / f for f in OWN_TOKENIZER_FILES if (model_dir / f).is_file()]
    if not present:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), **HF_LOAD)
    # Tokenizer files are parsed by transformers, tokenizers (Rust) and sentencepiece, which
    # raise what they like on a corrupt file (a JSONDecodeError, an Exception from Rust, ...).
    except Exception as err:
        raise ArtifactError(
            _broken_tokenizer_file(present),
            f"the tokenizer does not load ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:300]}); restore the model's tokenizer files, or "
            "delete them all to export with byte token ids",
        ) from None


def _broken_tokenizer_file(present: list[Path]) -> Path:
    """Which of `present` is unreadable: tokenizer.json when tokenizers cannot parse it, else
    the first file (transformers' message names what it tripped on)."""
    fast = present[0]
    if fast.name == "tokenizer.json":
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(fast))
        except Exception:  # what a corrupt file raises in tokenizers' Rust code
            return fast
        if len(present) > 1:
            return present[1]
    return fast


def load_tokenizer(model_dir: Path) -> Any | None:
    """The directory's tokenizer (`read_tokenizer`), with a pad token; None when it has none
    (random token ids are used then)."""
    tokenizer = read_tokenizer(model_dir)
    if tokenizer is None:
        return None
    # Decoder tokenizers often ship without a pad token; padding to a fixed length needs one.
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def example_tokens(
    tokenizer: Any | None,
    vocab_size: int,
    seq_len: int,
    seed: int,
    with_mask: bool,
) -> tuple[torch.Tensor, ...]:
    if tokenizer is not None:
        enc = tokenizer(
            EXAMPLE_SENTENCE,
            padding="max_length",
            truncation=True,
            max_length=seq_len,
            return_tensors="pt",
        )
        ids = enc["input_ids"].to(torch.int64)
        mask = enc["attention_mask"].to(torch.int64)
    else:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab_size, (1, seq_len), generator=gen, dtype=torch.int64)
        mask = torch.ones(1, seq_len, dtype=torch.int64)
    return (ids, mask) if with_mask else (ids,)



@dataclass(frozen=True)
class HfDir:
    """A checked HF model directory: what the wrapping tasks need to load its weights."""

    path: Path
    name: str
    architectures: tuple[str, ...]
    vocab_size: int
    max_position_embeddings: int | None
    tokenizer: Any | None
    tokenizer_files: tuple[Path, ...]

    @property
    def is_causal_lm(self) -> bool:
        """Whether its architecture is a causal LM (`is_causal_lm_architecture`)."""
        return any(is_causal_lm_architecture(a) for a in self.architectures)

    def load_error(self, err: Exception) -> ArtifactError:
        """The error for weights that do not load."""
        return weights_error(self.path, err)


def is_causal_lm_architecture(name: str) -> bool:
    """Whether transformers loads architecture `name` as a causal LM: a ``*ForCausalLM``, or one
    of its causal-LM mapping by another name (GPT-2's ``GPT2LMHeadModel``)."""
    if name.endswith("ForCausalLM"):
        return True
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()


# What transformers raises (a RuntimeError) when a checkpoint's weights and its config disagree.
_MISMATCHED = "ignore_mismatched_sizes"
# What loading weights from outside raises, for `weights_error`.
WEIGHT_ERRORS = (OSError, ValueError, RuntimeError)


def weights_error(directory: Path, err: Exception) -> ArtifactError:
    """The one message for weights of `directory` that transformers did not load."""
    if _MISMATCHED in str(err):
        return ArtifactError(
            directory,
            "the weights' shapes do not match what config.json describes (its sizes, heads or "
            "head_dim were changed after the weights were saved); fix config.json or re-save "
            "the model with save_pretrained",
        )
    return ArtifactError(
        directory, f"cannot load the weights ({type(err).__name__}: "
        f"{' '.join(str(err).split())[:300]}); the directory needs model.safetensors that "
        "match its config.json",
    )


def read_auto_config(model_dir: Path) -> Any:
    """transformers' config of `model_dir`, after `check_model_dir`; one ArtifactError if
    transformers still cannot build it."""
    check_model_dir(model_dir)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model_dir), **HF_LOAD)
    # check_model_dir checks the fields this project reads; transformers' config classes check
    # the others (huggingface_hub's StrictDataclassError, a TypeError, a KeyError, ...), and a
    # config from outside may fail any of them.
    except Exception as err:
        raise ArtifactError(
            model_dir / "config.json",
            f"transformers cannot read this config ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:300]}); fix config.json or re-save the model",
        ) from None


def is_hf_dir_spec(spec: str) -> bool:
    """Whether `spec` names a directory (a path separator, ./ or ~, or an existing directory)."""
    return "/" in spec or spec.startswith((".", "~")) or Path(spec).expanduser().is_dir()


def open_hf_dir(model_dir: Path, *, name: str, seed: int) -> HfDir:
    """Check `model_dir` is a text model transformers can read; load its config and tokenizer.

    `seed` is set before anything else so weights missing from the directory (initialized by
    transformers) are reproducible.
    """
    if not model_dir.exists():
        raise ArtifactError(
            model_dir,
            "model directory does not exist; pass a local Hugging Face model directory "
            "(as written by save_pretrained) or a built-in model name",
        )
    if not model_dir.is_dir():
        raise ArtifactError(model_dir, "not a directory; pass the model's directory")
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise ArtifactError(
            model_dir,
            "no config.json here, so it is not a Hugging Face model directory; save the model "
            "with save_pretrained() or point at the directory that holds config.json",
        )
    config_json = check_model_dir(model_dir)  # before transformers reads a byte of it
    archs = tuple(config_json.get("architectures") or [])
    config = read_auto_config(model_dir)
    vocab_size = getattr(config, "vocab_size", None)
    if not isinstance(vocab_size, int):
        raise ConfigValidationError(
            "model",
            str(model_dir),
            "only text models (config with vocab_size) load from a directory; wrap other "
            "models in a 'package.module:function' factory",
        )
    max_positions = getattr(config, "max_position_embeddings", None)
    torch.manual_seed(seed)
    return HfDir(
        path=model_dir,
        name=name,
        architectures=archs,
        vocab_size=vocab_size,
        max_position_embeddings=max_positions if isinstance(max_positions, int) else None,
        tokenizer=load_tokenizer(model_dir),
        tokenizer_files=tuple(
            model_dir / f for f in TOKENIZER_FILE_NAMES if (model_dir / f).is_file()
        ),
    )
