"""Issue 24: the QNN quantizer's per-node "No quant config" prints, filtered as known noise.

Quantizing SmolLM2 for QNN printed 92 such lines for dropout, contiguous and alias. Real
annotation of a real export here; the same line for an op that does stay in float still shows.
"""

from __future__ import annotations

import pytest
import torch

from qnn_common.cli import noise
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_quant.pt2e import prepare_program


class _DropoutAndViews(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dropout(self.linear(x))
        return out.t().contiguous()


@pytest.mark.parametrize("quiet", [True, False])
def test_no_quant_config_lines_only_with_verbose(
    quiet: bool, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(noise, "_quiet", quiet)  # True: a CLI without -v; False: with -v
    ep = torch.export.export(_DropoutAndViews().eval(), (torch.randn(2, 8),))
    prepare_program(ep, target=Target(Backend.QNN, lookup_soc("SM8650")), recipe=Recipe.A16W8)
    out = capfd.readouterr().out
    shown = "No quant config is implemented for op, aten.dropout.default" in out
    assert shown is not quiet, out
    if quiet:
        assert "aten.contiguous.default" not in out, out
