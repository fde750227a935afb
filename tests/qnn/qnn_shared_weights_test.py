"""QNN preprocesses partitions that share the program's weights (qnn_compile.shared_constants):
the program's tensors are left as they were, and the .pte computes what the stock deep copies
give. A convolution (whose weights QNN lays out again) and a linear, at fp16 on SM8650."""

from __future__ import annotations

import contextlib

import pytest
import torch

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_compile.backends import lowering_for
from qnn_compile.backends import qnn as qnn_backend
from qnn_compile.lower import lower_program
from qnn_compile.shared_constants import copy_sharing_weights
from qnn_infer.runtimes import host_runtime, prepare_runtime

CONFIG = CompileConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.FP16)


class _ConvHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.relu(self.conv(x)).flatten(1))
        return out


def _run(pte: bytes, x: torch.Tensor) -> torch.Tensor:
    method = host_runtime().load_program(pte).load_method("forward")
    (out,) = method.execute([x])
    return torch.as_tensor(out).clone()


def test_preprocess_leaves_the_weights_alone_and_computes_what_copies_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, x = _ConvHead().eval(), torch.randn(1, 3, 8, 8)
    program = torch.export.export(model, (x,))
    before = {name: t.clone() for name, t in program.state_dict.items()}
    shared = lower_program(program, lowering_for(CONFIG))
    for name, tensor in before.items():
        assert torch.equal(program.state_dict[name], tensor), name

    monkeypatch.setattr(qnn_backend, "sharing_weights_with_qnn", contextlib.nullcontext)
    stock = lower_program(torch.export.export(model, (x,)), lowering_for(CONFIG))
    assert shared.partitions == stock.partitions == 1
    prepare_runtime({Backend.QNN})
    assert torch.equal(_run(shared.pte, x), _run(stock.pte, x))


def test_the_copy_shares_tensors_and_copies_the_graph() -> None:
    program = torch.export.export(_ConvHead().eval(), (torch.randn(1, 3, 8, 8),))
    copied = copy_sharing_weights(program)
    assert copied.graph_module is not program.graph_module
    assert copied.state_dict is not program.state_dict
    for name, tensor in program.state_dict.items():
        assert copied.state_dict[name] is tensor
    next(iter(copied.graph.nodes)).name = "renamed"  # the graph is the copy's own
    assert next(iter(program.graph.nodes)).name != "renamed"
