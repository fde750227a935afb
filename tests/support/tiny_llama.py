"""The seeded tiny Llama (2 layers, hidden 64) as a loaded model and its exported program, for
tests that quantize or lower a decoder without a KV cache."""

from __future__ import annotations

from pathlib import Path

import torch

from qnn_prepare.causal_lm.tiny_decoders import save_tiny_llama
from qnn_prepare.models import load_model
from qnn_prepare.task import LoadedModel, export_program


def tiny_llama_program(directory: Path, seq_len: int = 16) -> tuple[
    LoadedModel, torch.export.ExportedProgram
]:
    """The tiny Llama saved under `directory`, loaded at `seq_len` tokens, and exported."""
    model = load_model(str(save_tiny_llama(directory)), seq_len=seq_len)
    return model, export_program(model)
