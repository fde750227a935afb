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


# The layer `save_sensitive_llama` makes sensitive to its weights' rounding.
SENSITIVE_LAYER = "layers.1.mlp"


def save_sensitive_llama(directory: Path) -> Path:
    """The seeded tiny Llama of `save_tiny_llama` with one layer made sensitive to weight
    rounding on purpose: layer 1's down projection reads input channel 5 through weights 40 times
    any other of their row (its up projection writes that channel 40 times smaller, so the float
    model stays in range), so a per-row grid spends its levels on that channel and rounds the
    rest of the row coarsely. The head is scaled up so the next-token distributions are peaked,
    as a trained model's are, rather than near uniform (random weights)."""
    from transformers import AutoModelForCausalLM

    from qnn_prepare.causal_lm.tiny_decoders import save_tiny_llama

    save_tiny_llama(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    mlp = model.model.layers[1].mlp
    with torch.no_grad():
        mlp.down_proj.weight[:, 5] = mlp.down_proj.weight.abs().max(dim=1).values * 40
        mlp.up_proj.weight[5] /= 40
        model.lm_head.weight *= 8
    model.save_pretrained(directory)
    return directory
