"""The op case type and the small modules and input generators the catalogue builds cases from.

Float ops sit behind a linear layer (`Lin`) in most cases: quantizers annotate ops in context, as
in real models (a quantized recipe with nothing to annotate is refused), and LPBQ (16a4w_block)
needs a linear whose input size is a multiple of its block (16).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from qnn_common.errors import ConfigValidationError, StageError
from qnn_common.torchio.samples import Sample
from qnn_testing.expect import EXACT, Outcome, Raises, Rule
from qnn_testing.structure import Delegation, Structure

SEED = 1126
Inputs = Callable[[torch.Generator], Sample]
Fn = Callable[..., Any]


@dataclass(frozen=True)
class OpCase:
    """One operator in a tiny module, its inputs, and how it must fare per target and precision.

    `smoke`: in the subset every other HTP arch runs by default; `qnn`: run at every precision on
    V75 by default (every other case runs there once, see qnn_testing.matrix).
    `integer`: integer / bool outputs, compared exactly, with no q/dq expected. `linear`: the
    module has a layer LPBQ can block, a linear or a 1x1 convolution of 16n input channels
    (without one, 16a4w_block must be refused).
    """

    name: str
    family: str
    make: Callable[[], torch.nn.Module]
    inputs: Inputs
    rules: tuple[Rule, ...] = ()
    smoke: bool = False
    qnn: bool = False
    integer: bool = False
    linear: bool = True
    # XNNPACK's quantizer (also portable's) leaves some ops float at 8a8w (matmul, sub, ...): a
    # case whose quantizable ops all stay float on the host, so no q/dq is expected there.
    host_unquantized: bool = False
    note: str = ""
    all_rules: tuple[Rule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # An expected exception comes first: a cell that cannot be built has no numbers to judge.
        first = () if self.linear else (NO_LINEAR_LPBQ,)
        implied: list[Rule] = []
        if self.integer:
            # Integer math: no quantizer annotates it, so a quantized recipe is refused on the
            # host (nothing to quantize); XNNPACK's kernels are float ones.
            implied += nothing_to_quantize("integer and bool ops")
            implied.append(qnn_nothing_to_quantize("integer and bool ops"))
            implied.append(Rule(outcome=EXACT))
            host = Structure(Delegation.NONE, qdq=False)
            implied += [Rule("xnnpack", structure=host), Rule("portable", structure=host)]
        object.__setattr__(self, "all_rules", (*first, *self.rules, *implied))


class Fun(torch.nn.Module):
    """A module around a plain function of its inputs."""

    def __init__(self, fn: Fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(*args)


class Lin(torch.nn.Module):
    """A linear layer over the first input's last dim (`n` features), then `fn` of all inputs."""

    def __init__(self, fn: Fn, n: int = 16) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(n, n)
        self.fn = fn

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> Any:
        return self.fn(self.fc(x), *rest)


class Then(torch.nn.Module):
    """A linear layer (`n` features), then a module applied to its output."""

    def __init__(self, inner: torch.nn.Module, n: int = 16) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(n, n)
        self.inner = inner

    def forward(self, x: torch.Tensor) -> Any:
        return self.inner(self.fc(x))


def with_stats(module: torch.nn.modules.batchnorm._BatchNorm) -> torch.nn.Module:
    """A batch norm with non-trivial running statistics (the defaults make eval-mode BN an
    identity, which would test nothing)."""
    if module.running_mean is not None and module.running_var is not None:
        module.running_mean.uniform_(-0.5, 0.5)
        module.running_var.uniform_(0.5, 2.0)
    return module


def seeded(factory: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """A factory building the module under a fixed seed, in eval mode."""

    def make() -> torch.nn.Module:
        torch.manual_seed(SEED)
        return factory().eval()

    return make


def fn_case(name: str, family: str, fn: Fn, inputs: Inputs, **kw: Any) -> OpCase:
    """A case for a plain function (no parameters, so no linear layer)."""
    kw.setdefault("linear", False)
    return OpCase(name, family, seeded(lambda: Fun(fn)), inputs, **kw)


def lin_case(name: str, family: str, fn: Fn, inputs: Inputs, n: int = 16, **kw: Any) -> OpCase:
    """A case for `fn` applied after a linear layer over the first input."""
    return OpCase(name, family, seeded(lambda: Lin(fn, n)), inputs, **kw)


def mod_case(
    name: str, family: str, factory: Callable[[], torch.nn.Module], inputs: Inputs, **kw: Any
) -> OpCase:
    """A case for an nn.Module (built under the fixed seed); say `linear=True` if it has one."""
    kw.setdefault("linear", False)
    return OpCase(name, family, seeded(factory), inputs, **kw)


def randn(*shapes: tuple[int, ...], scale: float = 1.0) -> Inputs:
    """Standard normal inputs of the given shapes (times `scale`)."""
    return lambda g: tuple(torch.randn(*s, generator=g) * scale for s in shapes)


def positive(*shapes: tuple[int, ...]) -> Inputs:
    """Inputs in [0.5, 2.5): for log, sqrt, reciprocal and friends."""
    return lambda g: tuple(torch.rand(*s, generator=g) * 2 + 0.5 for s in shapes)


def ints(
    *shapes: tuple[int, ...], low: int = -8, high: int = 8, dtype: torch.dtype = torch.int32
) -> Inputs:
    """Integer inputs in [low, high)."""
    return lambda g: tuple(torch.randint(low, high, s, generator=g, dtype=dtype) for s in shapes)


def bools(*shapes: tuple[int, ...]) -> Inputs:
    """Random bool inputs."""
    return lambda g: tuple(torch.rand(*s, generator=g) > 0.5 for s in shapes)


def concat(*gens: Inputs) -> Inputs:
    """The inputs of several generators, in order."""
    return lambda g: tuple(t for gen in gens for t in gen(g))


def index(shape: tuple[int, ...], high: int) -> Inputs:
    """An int64 index tensor in [0, high)."""
    return lambda g: (torch.randint(0, high, shape, generator=g),)


def on_host(outcome: Outcome) -> tuple[Rule, ...]:
    """`outcome` on XNNPACK and portable, which share the host runtime's portable kernels."""
    return on_host_at("*", outcome)


def on_host_at(precisions: str, outcome: Outcome) -> tuple[Rule, ...]:
    """`outcome` on XNNPACK and portable at the matching precisions."""
    return (
        Rule("xnnpack", precisions, outcome=outcome),
        Rule("portable", precisions, outcome=outcome),
    )


def nothing_to_quantize(what: str) -> tuple[Rule, ...]:
    """On the host at 8a8w: refused, since XNNPACK's quantizer (portable's too) annotates none of
    `what`; a quantized recipe that quantizes nothing is an error, not a float program."""
    return on_host_at(
        "8a8w",
        Raises(
            ConfigValidationError,
            f"XNNPACK's quantizer annotates none of {what}: nothing to quantize",
            match="found no op to quantize",
        ),
    )


def qnn_nothing_to_quantize(what: str) -> Rule:
    """On QNN at every quantized precision: refused, since QNN's quantizer annotates none of
    `what` (measured on V75 at each of them)."""
    return Rule(
        "qnn-*",
        "*a*w*",
        outcome=Raises(
            ConfigValidationError,
            f"QNN's quantizer annotates none of {what}: nothing to quantize",
            match="found no op to quantize",
        ),
    )


def qnn_lowering_fails(precisions: str, reason: str, match: str) -> Rule:
    """On V75 at `precisions`: ExecuTorch's QNN lowering fails (measured); `match` quotes the
    error (for a context QNN cannot build, what the backend said)."""
    return Rule("qnn-v75", precisions, outcome=Raises(StageError, reason, match=match))


# LPBQ (16a4w_block) blocks the weights of linears and 1x1 convolutions whose input channels
# divide into blocks (qnn_quant.quantizers.lpbq): a case with neither has nothing to block.
NO_LINEAR_LPBQ = Rule(
    targets="qnn-*",
    precisions="16a4w_block",
    outcome=Raises(
        ConfigValidationError,
        "LPBQ (16a4w_block) blocks linear and 1x1 convolution weights; this case has no "
        "such layer with input channels in whole blocks",
        match="block",
    ),
)
