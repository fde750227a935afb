from __future__ import annotations

import pytest
import torch

from qnn_testing.rounding import held_out_sqnr, low_rank_batches, weights_kept


def _program(noise: float = 0.0) -> torch.export.ExportedProgram:
    torch.manual_seed(3)
    linear = torch.nn.Linear(32, 8).eval()
    with torch.no_grad():
        linear.weight.add_(noise * torch.randn_like(linear.weight))
    return torch.export.export(linear, low_rank_batches(count=1)[0])


def test_low_rank_batches_are_seeded_and_correlated() -> None:
    a, b = low_rank_batches(count=3), low_rank_batches(count=3)
    assert all(torch.equal(x, y) for (x,), (y,) in zip(a, b, strict=True))
    (x,) = a[0]
    singular = torch.linalg.svdvals(torch.cat([batch for (batch,) in a]))
    assert x.shape == (16, 32) and singular[6] < 0.05 * singular[5]  # rank 6 plus noise


def test_weights_kept_sees_a_change_through_module() -> None:
    program = _program()
    with weights_kept(program):
        program.state_dict["weight"].clone().mul_(2)  # a copy: the caller's weights stay
    with pytest.raises(AssertionError, match="weight was changed"), weights_kept(program):
        program.module().get_parameter("weight").detach().mul_(2)  # module() shares them


def test_held_out_sqnr_ranks_closer_programs_higher() -> None:
    programs = {"same": _program(), "near": _program(0.01), "far": _program(0.1)}
    sqnr = held_out_sqnr(_program(), programs, low_rank_batches(count=2))
    assert sqnr["same"] > 100 and sqnr["same"] > sqnr["near"] > sqnr["far"] + 10, sqnr
