"""Activations, each behind a linear layer, plus softmax and log_softmax."""

from __future__ import annotations

import torch
import torch.nn.functional as fn

from qnn_common.errors import StageError
from qnn_testing.cases.base import OpCase, Then, lin_case, mod_case, randn
from qnn_testing.expect import Raises, Rule

F = "activation"
X = (4, 16)
x = randn(X, scale=2.0)

# XNNPACK's lowering fails on PReLU over a 2-D (N, C) input: its channels-last pass expects
# an image layout (measured with executorch 1.5.1).
PRELU_2D = Rule(
    targets="xnnpack",
    outcome=Raises(
        StageError,
        "XNNPACK's ChannelsLastTaggedReshapePass fails on PReLU over a 2-D input",
        match="ChannelsLastTaggedReshapePass",
    ),
)

CASES: tuple[OpCase, ...] = (
    lin_case("relu", F, torch.relu, x, smoke=True),
    lin_case("relu6", F, fn.relu6, x),
    lin_case("leaky_relu", F, lambda a: fn.leaky_relu(a, 0.1), x),
    lin_case("elu", F, fn.elu, x),
    lin_case("gelu", F, fn.gelu, x, qnn=True),
    lin_case("silu", F, fn.silu, x),
    lin_case("sigmoid", F, torch.sigmoid, x),
    lin_case("tanh", F, torch.tanh, x, smoke=True),
    lin_case("hardtanh", F, lambda a: fn.hardtanh(a, -0.5, 0.5), x),
    lin_case("hardswish", F, fn.hardswish, x),
    lin_case("hardsigmoid", F, fn.hardsigmoid, x),
    lin_case("softplus", F, fn.softplus, x),
    lin_case("mish", F, fn.mish, x),
    lin_case("threshold", F, lambda a: fn.threshold(a, 0.2, -1.0), x),
    lin_case("glu", F, lambda a: fn.glu(a, dim=-1), x),
    mod_case("prelu", F, lambda: Then(torch.nn.PReLU(16)), x, linear=True, rules=(PRELU_2D,)),
    lin_case("softmax", F, lambda a: torch.softmax(a, dim=-1), x, smoke=True, qnn=True),
    lin_case("softmax_4d_neg_dim", F, lambda a: torch.softmax(a, dim=-2), randn((2, 3, 4, 16))),
    lin_case("log_softmax", F, lambda a: torch.log_softmax(a, dim=-1), x),
)
