"""What a model family (a task) hands the prepare stage, and the loaded-model record it builds on.

A task (`Task`) turns a model spec into a `TaskExport`: one ExportedProgram per method, the
calibration and eval samples, the fp32 reference, and extra files (tokenizer, tables). The
prepare stage writes any `TaskExport` the same way; the registry of tasks is `qnn_prepare.models`.
Single-method tasks (image, text encoder, a user's factory) load a `LoadedModel` and share one
export flow (`qnn_prepare.single`); the causal-LM task exports ``prefill`` + ``decode``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from qnn_common.config import PrepareConfig
from qnn_common.torchio.samples import ModelInputs, Sample

KINDS = ("text-encoder", "causal-lm", "vision", "custom")


@dataclass(frozen=True)
class LoadedModel:
    """A single-method model ready to export: module in eval mode plus what feeds it."""

    name: str
    kind: str  # one of KINDS
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
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
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


def export_program(model: LoadedModel) -> torch.export.ExportedProgram:
    """torch.export the model at its example inputs (non-strict, static shapes)."""
    kwargs = dict(model.example_kwargs) or None
    with torch.no_grad():
        return torch.export.export(model.module, tuple(model.example_inputs), kwargs, strict=False)


@dataclass(frozen=True)
class TaskExport:
    """Everything a task gives the prepare stage to write.

    `programs` has one entry per method, each written as ``methods/<name>.pt2``; a
    single-method task names its one method `qnn_common.stages.DEFAULT_METHOD`. Samples are per
    call of the model: flat tuples for the causal LM (token ids), `ModelInputs` for
    single-method tasks.
    """

    name: str
    kind: str
    programs: Mapping[str, torch.export.ExportedProgram]
    calibration: Sequence[Sample | ModelInputs]
    eval_inputs: Sequence[Sample | ModelInputs]
    reference: Sequence[Sample]
    # Artifact-relative path -> bytes (tokenizer files, tables the host needs at run time).
    files: Mapping[str, bytes]
    timings: Mapping[str, float]
    metrics: Mapping[str, Any]
    # A generating causal LM's shapes (`LlmSpec.to_json`), for the manifest's program record.
    llm: Mapping[str, Any] | None = None
    # Artifact-relative path -> tensors saved with `save_samples` (a KV-as-inputs LLM's rotary
    # table).
    tables: Mapping[str, Sequence[Any]] = field(default_factory=dict)


class Task(Protocol):
    """A model family: its built-in models, which specs it takes, and how one is exported."""

    @property
    def name(self) -> str:
        """The task's name, recorded in the prepare manifest (``metrics.task``)."""
        ...

    def builtins(self) -> Mapping[str, str]:
        """Built-in model names this task provides, with a one-line description each."""
        ...

    def accepts(self, spec: str, config: PrepareConfig) -> bool:
        """Whether this task exports `spec` under `config` (checked in registry order)."""
        ...

    def builtin_weights(self, spec: str) -> bytes | None:
        """For a built-in whose weights are not this package's code (package data, another
        installed package): what identifies them, for the cache key; None for any other spec."""
        ...

    def export(self, config: PrepareConfig) -> TaskExport:
        """Load `config.model` and export it with its samples and reference outputs."""
        ...
