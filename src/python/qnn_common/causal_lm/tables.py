"""The torch tensors an LLM artifact carries beside its programs: the rotary table a KV-as-inputs
program is fed (`stages.ROPE_TABLE`) and the attention sink's keys and values per layer
(`stages.SINK_TABLE`), written by prepare and read by every later stage."""

from __future__ import annotations

from pathlib import Path

import torch

from qnn_common.causal_lm.steps import SinkTable
from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.stages import ROPE_TABLE, SINK_TABLE
from qnn_common.torchio.samples import load_samples


def rope_of(source: Path, manifest: Manifest) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rotary table a KV-as-inputs LLM artifact carries, or None."""
    if manifest.file(ROPE_TABLE) is None:
        return None
    samples = load_samples(source / ROPE_TABLE)
    if len(samples) != 1 or len(samples[0]) != 2:
        raise ArtifactError(source / ROPE_TABLE, "expected one (cos, sin) pair")
    cos, sin = samples[0]
    return cos, sin


def sink_sample(table: SinkTable) -> tuple[torch.Tensor, ...]:
    """An attention sink's keys and values per layer as `SINK_TABLE` stores them: one sample
    (k_0, v_0, k_1, v_1, ...); `sink_of` reads it back."""
    return tuple(t for kv in table for t in kv)


def sink_of(source: Path, manifest: Manifest) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The attention sink's keys and values per layer an LLM artifact carries, or None."""
    if manifest.file(SINK_TABLE) is None:
        return None
    samples = load_samples(source / SINK_TABLE)
    if len(samples) != 1 or len(samples[0]) % 2:
        raise ArtifactError(source / SINK_TABLE, "expected one (k, v, k, v, ...) tuple")
    flat = samples[0]
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
