"""A small BERT sentence encoder as a ``package.module:function`` model: the module paths,
padding mask and mean pooling of all-MiniLM-L6-v2 (`qnn_prepare.encoder.Encoder`), random
weights, two layers, so an HTP compile of it takes seconds."""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertConfig, BertModel

from qnn_prepare.encoder import Encoder


def tiny_bert() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1126)
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64)
    encoder = Encoder(BertModel(config).eval(), pooling="mean", normalize=True).eval()
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, 128, (1, 16), generator=generator)
    attention_mask = torch.ones(1, 16, dtype=torch.int64)
    attention_mask[:, 11:] = 0  # padding, as a tokenizer writes it
    return encoder, (input_ids, attention_mask)
