"""XNNPACK's partitions preprocessed on a copy that shares the program's weights: the same .pte
bytes as ExecuTorch's deep copy, and the program's own weights untouched. (QNN's:
tests/qnn/qnn_shared_weights_test.py.)"""

from __future__ import annotations

import torch
from torch import nn

from qnn_compile.shared_constants import copy_sharing_weights, sharing_weights_with_xnnpack


class _ConvBnLinear(nn.Module):
    """A batch norm XNNPACK's preprocess folds into the convolution's weights (new constants),
    and linears whose weights it transposes or packs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 16)
        self.head = nn.Linear(16, 4)
        with torch.no_grad():
            self.bn.running_mean = torch.rand(8) * 2 - 1
            self.bn.running_var = torch.rand(8) * 1.5 + 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        out: torch.Tensor = self.head(torch.relu(self.fc(h.flatten(1))))
        return out


def _lowered(ep: torch.export.ExportedProgram) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    return bytes(edge.to_executorch().buffer)


def test_the_copy_shares_tensors_and_nothing_else() -> None:
    torch.manual_seed(0)
    ep = torch.export.export(_ConvBnLinear().eval(), (torch.randn(1, 3, 8, 8),))
    copy = copy_sharing_weights(ep)
    for name, tensor in ep.state_dict.items():
        assert copy.state_dict[name] is tensor
    assert copy.graph_module is not ep.graph_module
    assert copy.state_dict is not ep.state_dict


def test_xnnpack_lowers_the_same_bytes_and_leaves_the_weights_alone() -> None:
    torch.manual_seed(0)
    model = _ConvBnLinear().eval()
    x = (torch.randn(1, 3, 8, 8),)
    stock = _lowered(torch.export.export(model, x))
    ep = torch.export.export(model, x)
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    with sharing_weights_with_xnnpack():
        copied = XnnpackBackend.copy_exported_program_for_preprocess(ep, [])
        assert copied.state_dict["conv.weight"] is ep.state_dict["conv.weight"]
        shared = _lowered(ep)
    assert shared == stock
    for name, tensor in before.items():
        assert torch.equal(ep.state_dict[name], tensor), name
