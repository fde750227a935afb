"""Operator cases and what each (backend, recipe) must achieve on them.

A case is a tiny module around one operator. An expectation is a metric with a threshold, checked
against the right reference: fp32 programs against eager fp32, quantized programs against the
fake-quantized model (the converted PT2E program run eagerly), which is what a backend should
reproduce; quantization error itself is the quantizer's business, not the backend's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from qnn_common.config import CompileConfig
from qnn_common.metrics import cosine, max_abs_error, sqnr_db
from qnn_common.recipes import Recipe
from qnn_common.target import Target
from qnn_common.tensorio import Sample, flatten_outputs
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_infer.runner import HostRunner
from qnn_infer.runtimes import prepare_runtime
from qnn_quant.pt2e import quantize_program

SEED = 1126


@dataclass(frozen=True)
class Sqnr:
    """Signal-to-quantization-noise ratio at least `threshold_db`."""

    threshold_db: float

    def check(self, ref: np.ndarray, got: np.ndarray) -> str | None:
        value = sqnr_db(ref, got)
        return None if value >= self.threshold_db else (
            f"SQNR {value:.2f} dB < {self.threshold_db} dB (max abs error "
            f"{max_abs_error(ref, got):.3g})"
        )


@dataclass(frozen=True)
class Cosine:
    """Cosine similarity at least `threshold`."""

    threshold: float

    def check(self, ref: np.ndarray, got: np.ndarray) -> str | None:
        value = cosine(ref, got)
        return None if value >= self.threshold else f"cosine {value:.5f} < {self.threshold}"


@dataclass(frozen=True)
class Tolerance:
    """Element-wise |got - ref| <= atol + rtol * |ref|, like torch.allclose."""

    rtol: float
    atol: float

    def check(self, ref: np.ndarray, got: np.ndarray) -> str | None:
        bad = np.abs(got - ref) > self.atol + self.rtol * np.abs(ref)
        if not bad.any():
            return None
        i = int(np.argmax(np.abs(got - ref)))
        return (
            f"{int(bad.sum())}/{bad.size} elements outside rtol={self.rtol} atol={self.atol}; "
            f"worst at flat index {i}: ref {ref.flat[i]:.6g} got {got.flat[i]:.6g}"
        )


Metric = Sqnr | Cosine | Tolerance


@dataclass(frozen=True)
class OpCase:
    name: str
    make: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.Generator], Sample]


def _rand(*shape: int) -> Callable[[torch.Generator], Sample]:
    return lambda g: (torch.randn(*shape, generator=g),)


class _Binary(torch.nn.Module):
    def __init__(self, op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.op(a, b)


class _Unary(torch.nn.Module):
    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class _LinearThen(torch.nn.Module):
    """A linear layer feeding the op: quantizers annotate ops in context, as in real models."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor], features: int = 32) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(features, features)
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(self.fc(x))


def _seeded(factory: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        torch.manual_seed(SEED)
        return factory().eval()

    return make


CASES: tuple[OpCase, ...] = (
    OpCase("linear", _seeded(lambda: torch.nn.Linear(32, 16)), _rand(4, 32)),
    OpCase("conv2d", _seeded(lambda: torch.nn.Conv2d(3, 8, 3, padding=1)), _rand(1, 3, 16, 16)),
    OpCase("relu", _seeded(lambda: _LinearThen(torch.relu)), _rand(4, 32)),
    OpCase("add", _seeded(lambda: _Binary(torch.add)),
           lambda g: (torch.randn(4, 32, generator=g), torch.randn(4, 32, generator=g))),
    OpCase("mul", _seeded(lambda: _Binary(torch.mul)),
           lambda g: (torch.randn(4, 32, generator=g), torch.randn(4, 32, generator=g))),
    OpCase("matmul", _seeded(lambda: _Binary(torch.matmul)),
           lambda g: (torch.randn(2, 8, 16, generator=g), torch.randn(2, 16, 8, generator=g))),
    OpCase("avg_pool2d_k2", _seeded(lambda: _Unary(lambda x: torch.nn.functional.avg_pool2d(x, 2))),
           _rand(1, 4, 8, 8)),
    OpCase("max_pool2d", _seeded(lambda: _Unary(lambda x: torch.nn.functional.max_pool2d(x, 2))),
           _rand(1, 4, 8, 8)),
    OpCase("softmax", _seeded(lambda: _LinearThen(lambda x: torch.softmax(x, dim=-1))),
           _rand(4, 32)),
    OpCase("gelu", _seeded(lambda: _LinearThen(torch.nn.functional.gelu)), _rand(4, 32)),
    OpCase("layer_norm", _seeded(lambda: _LinearThen(torch.nn.LayerNorm(32))), _rand(4, 32)),
    OpCase("sigmoid", _seeded(lambda: _LinearThen(torch.sigmoid)), _rand(4, 32)),
)


Outputs = list[np.ndarray]


def run_case(
    case: OpCase, target: Target, recipe: Recipe, workdir: Path
) -> tuple[Outputs, Outputs, int]:
    """Export, (quantize,) lower and execute one case for real.

    Returns (reference outputs, program outputs, delegated op count); the reference is eager fp32
    for float recipes and the fake-quantized program for quantized ones.
    """
    g = torch.Generator().manual_seed(SEED)
    example = case.inputs(g)
    calibration = [case.inputs(g) for _ in range(8)]
    program = torch.export.export(case.make(), example, strict=False)
    if recipe.is_quantized:
        program = quantize_program(program, target=target, recipe=recipe,
                                   calibration=calibration, progress=False)
    with torch.no_grad():
        reference = flatten_outputs(program.module()(*example))
    soc = None if target.soc is None else target.soc.name
    config = CompileConfig(backend=target.backend, soc=soc, recipe=recipe)
    lowered = lower_program(program, lowering_for(config))
    pte = workdir / f"{case.name}-{target.backend}-{recipe}.pte"
    pte.write_bytes(lowered.pte)
    prepare_runtime({target.backend})
    got = HostRunner(pte).run(example)
    return (
        [r.detach().double().numpy() for r in reference],
        [o.detach().double().numpy() for o in got],
        lowered.delegated_ops,
    )


def check(metrics: tuple[Metric, ...], reference: Outputs, got: Outputs) -> list[str]:
    """Every failed metric, per output, in words; empty when all pass."""
    failures = []
    for i, (ref, out) in enumerate(zip(reference, got, strict=True)):
        if ref.shape != out.shape:
            failures.append(f"output {i}: shape {out.shape}, expected {ref.shape}")
            continue
        failures += [f"output {i}: {msg}" for m in metrics if (msg := m.check(ref, out))]
    return failures


def assert_case(
    case: OpCase, target: Target, recipe: Recipe, metrics: tuple[Metric, ...], workdir: Path
) -> int:
    """Run `case` for real and fail with every mismatch spelled out; return the delegated ops."""
    reference, got, delegated = run_case(case, target, recipe, workdir)
    failures = check(metrics, reference, got)
    assert not failures, f"{case.name} on {target} {recipe}: " + "; ".join(failures)
    return delegated
