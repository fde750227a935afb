"""A tiny GPT-2 built from `transformers.GPT2Config` (seeded random weights, no download).

GPT-2's attention and MLP projections are Hugging Face `Conv1D` layers, which compute
`addmm(bias, x, weight)` rather than `linear`: the model that showed a quantized recipe
quantizing nothing. Used as a `module:function` model (`support.gpt2_model:tiny_gpt2`).
"""

from __future__ import annotations

import torch
from torch import nn

LAYERS = 2
SEQ = 16
VOCAB = 128


class _LastHidden(nn.Module):
    """input_ids -> last hidden state (a plain tensor output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(input_ids=input_ids).last_hidden_state
        return out


def tiny_gpt2() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A 2-layer, 32-wide GPT-2 encoder stack and an example batch of token ids."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(1126)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=LAYERS,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    model = _LastHidden(GPT2Model(config).eval()).eval()
    return model, (torch.randint(0, VOCAB, (1, SEQ)),)
