"""The operator suite: every (case, target, precision) cell of the matrix, lowered and executed.

One module for every target. Which targets a process runs comes from `QNN_OP_TARGETS` (each
Pants target in tests/op/BUILD sets it: `xnnpack`, `portable`, `qnn-v68` ... `qnn-v81`; unset,
all of them), how much of the matrix from `QNN_OP_SUITE` (`default`, `full`; see
qnn_testing.matrix). Test ids read ``<case>-<target>-<precision>``, so
``-k "conv2d and 8a8w"`` selects as expected. Each cell's expectation (checks, expected failure
or expected exception, and the delegation it must show) lives with its case in qnn_testing.cases.
"""

from __future__ import annotations

import logging

import pytest
import torch

from op.harness import Harness
from op.verdict import judge
from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import HtpArch
from qnn_compile.backends import lowering_for
from qnn_compile.decompositions import MissingKernelError
from qnn_compile.lower import lower_program
from qnn_quant.engine import quantize_program
from qnn_testing.cases import CATALOGUE
from qnn_testing.coverage import Status
from qnn_testing.matrix import (
    DEFAULT_ARCH,
    Cell,
    OpTarget,
    cells,
    mode_from_env,
    shard_from_env,
    targets_from_env,
)

TARGETS = targets_from_env()
CELLS = list(cells(CATALOGUE, TARGETS, mode_from_env(), shard_from_env()))
QNN_TARGETS = [t for t in TARGETS if t.backend is Backend.QNN]


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """One harness per session: exports and quantizations are shared between cells."""
    return Harness(tmp_path_factory.mktemp("op"))


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.id)
def test_op(cell: Cell, harness: Harness) -> None:
    verdict = judge(cell, harness)
    if verdict.status is Status.XFAIL:
        pytest.xfail(verdict.message)
    assert verdict.status in (Status.PASS, Status.RAISES), verdict.message


# The upstream op tests chose the QNN dtype with `if dtype := getattr(QuantDtype, name)`, and
# QuantDtype.use_16a16w is 0: 16a16w read as "no recipe" and was skipped without a word. Here
# recipes are strings and lookups test `is None`; this proves a 16a16w program is really 16-bit.
# Defined only where it applies (QNN from V73, 16a16w's floor): no empty parametrization, which
# pytest would report as a skip.
A16W16_TARGETS = [t for t in QNN_TARGETS if t.arch is not None and t.arch >= HtpArch.V73]


if A16W16_TARGETS:  # this process runs a QNN arch with 16a16w

    @pytest.mark.parametrize("target", A16W16_TARGETS, ids=str)
    def test_16a16w_is_quantized_16_bit(target: OpTarget) -> None:
        from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype

        assert QuantDtype.use_16a16w == 0  # the falsy value the bug tripped on
        assert Recipe.A16W16 in target.precisions
        torch.manual_seed(1126)
        example = (torch.randn(4, 16),)
        ep = torch.export.export(torch.nn.Linear(16, 16).eval(), example, strict=False)
        quantized = quantize_program(
            ep, target=target.target, recipe=Recipe.A16W16, calibration=[example], progress=False
        )
        ranges = {
            # quantize_per_tensor(x, scale, zp, qmin, qmax, dtype); per_channel adds an axis first.
            tuple(n.args[4:6] if "per_channel" in str(n.target) else n.args[3:5])
            for n in quantized.graph.nodes
            if n.op == "call_function" and "quantize_per" in str(n.target)
        }
        assert ranges, "16a16w produced no quantize node: the recipe was read as no recipe"
        # Activations (0..65535) and weights (-32767..32767, symmetric) at 16 bits, the bias at 32:
        # no 8-bit (-128..127 / 0..255) range anywhere.
        assert (0, 65535) in ranges and all(hi - lo >= 65534 for lo, hi in ranges), ranges


class _Erfinv(torch.nn.Module):
    """erfinv between two linears: QNN has no op for it (measured; validation refuses it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(torch.erfinv(torch.tanh(self.fc(x)) * 0.9))
        return out


V75_TARGETS = [t for t in QNN_TARGETS if t.arch is DEFAULT_ARCH]


if V75_TARGETS:  # this process runs the V75 target

    @pytest.mark.parametrize("target", V75_TARGETS, ids=str)
    def test_an_op_qnn_refuses_is_named(target: OpTarget, caplog: pytest.LogCaptureFixture) -> None:
        torch.manual_seed(1126)
        ep = torch.export.export(_Erfinv().eval(), (torch.randn(4, 16),), strict=False)
        soc = target.target.soc
        assert soc is not None
        config = CompileConfig(backend=Backend.QNN, soc=soc.name, recipe=Recipe.FP16)
        # QNN leaves erfinv to the CPU and says so; the runtime has no kernel for it either, so
        # compile refuses the program, naming the op, rather than let it fail when run.
        with caplog.at_level(logging.WARNING), pytest.raises(MissingKernelError, match="erfinv"):
            lower_program(ep, lowering_for(config))
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert refused and "aten.erfinv.default x1" in refused[0], caplog.text
