"""The image task's built-in: ``tiny-cnn``, a seeded conv / relu / pool / linear classifier."""

from __future__ import annotations

import torch
from torch import nn

from qnn_prepare.task import LoadedModel

TINY_CNN = "tiny-cnn"
TINY_CNN_DESCRIPTION = "conv/relu/pool/linear classifier on 3x32x32 images, seeded random weights"


class TinyCnn(nn.Module):
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



def load_tiny_cnn(seed: int) -> LoadedModel:
    """The built-in ``tiny-cnn`` with seeded weights and a seeded example image."""
    torch.manual_seed(seed)
    module = TinyCnn().eval()
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

