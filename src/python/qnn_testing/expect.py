"""What each op case must achieve per target and precision: checks, an expected failure, or an
expected exception, each with its reason.

A case carries `Rule`s; the first rule whose target and precision patterns match and that sets
the aspect asked for (outcome or structure) wins, else the defaults below apply. A native crash
(`Crashes`) is an expectation too: such a cell runs in a child process, so the crash it asserts
cannot take the test process down. Nothing is
skipped silently: a (case, target, precision) the target cannot run at all is not generated (see
`qnn_testing.matrix`), and every other one resolves to exactly one outcome.
"""

from __future__ import annotations

import fnmatch
import signal
from dataclasses import dataclass

from qnn_common.recipes import BACKENDS, Backend, Recipe
from qnn_testing.checks import Check, CosineSimilarity, Sqnr, Tolerance
from qnn_testing.structure import Delegation, Structure


@dataclass(frozen=True)
class Measure:
    """Pass when every check holds on every output."""

    checks: tuple[Check, ...]


@dataclass(frozen=True)
class XFail:
    """Runs, but is known to miss its checks (or structure). `strict`: an unexpected pass fails,
    so a fixed upstream bug is noticed and the expectation tightened."""

    reason: str
    issue: str | None = None
    strict: bool = True


@dataclass(frozen=True)
class Raises:
    """Must raise `exception` (a qnn_common error type, or a builtin) with `match` in its text."""

    exception: type[BaseException]
    reason: str
    match: str = ""
    issue: str | None = None


@dataclass(frozen=True)
class Crashes:
    """Kills the process with `signal` in native code (a backend library): run in a child process
    (`op.harness.run_isolated`), and met when the child dies of that signal. Strict like XFail:
    a child that survives fails the cell, so a fixed crash is noticed."""

    signal: signal.Signals
    reason: str
    issue: str | None = None


Outcome = Measure | XFail | Raises | Crashes


@dataclass(frozen=True)
class Rule:
    """Overrides for the targets and precisions matching the fnmatch patterns.

    `targets` matches target names (``xnnpack``, ``portable``, ``qnn-v75``; ``qnn-*`` for every
    arch), `precisions` recipe values (``8a8w``, ``16a*``, ``*``).
    """

    targets: str = "*"
    precisions: str = "*"
    outcome: Outcome | None = None
    structure: Structure | None = None

    def matches(self, target: str, precision: Recipe) -> bool:
        """Whether this rule applies to (`target`, `precision`)."""
        return fnmatch.fnmatchcase(target, self.targets) and fnmatch.fnmatchcase(
            precision.value, self.precisions
        )


# fp32 on XNNPACK: reordered float math, ~0.1 % error at most (60 dB).
_XNNPACK_FP32 = Measure((Sqnr(60.0), CosineSimilarity(0.99999), Tolerance(rtol=1e-3, atol=1e-4)))
# Quantized vs the fake-quantized model: the same integer math, requantization rounding differs.
_XNNPACK_Q8 = Measure((Sqnr(30.0), CosineSimilarity(0.999)))
# The portable kernels are the reference implementation: near bit-exact with eager PyTorch.
_PORTABLE_FP32 = Measure((Sqnr(80.0), CosineSimilarity(0.999999), Tolerance(rtol=1e-5, atol=1e-5)))
_PORTABLE_Q8 = Measure((Sqnr(40.0), CosineSimilarity(0.9999)))
# fp16 vs fp32: half precision keeps ~3 decimal digits; 40 dB is ~1 % error.
_QNN_FP16 = Measure((Sqnr(40.0), CosineSimilarity(0.9999)))
# 8-bit activations on the HTP vs fake quant: kernels round differently by about one LSB.
_QNN_A8 = Measure((Sqnr(25.0), CosineSimilarity(0.995)))
# 16-bit activations: an LSB is 256x smaller.
_QNN_A16 = Measure((Sqnr(40.0), CosineSimilarity(0.9999)))
# Integer and bool outputs: exact, whatever the precision of the float parts.
EXACT = Measure((Tolerance(rtol=0.0, atol=0.0),))


@dataclass(frozen=True)
class _Defaults:
    """A backend's default checks: at its float recipe, and at 8- and 16-bit activations."""

    unquantized: Measure
    a8: Measure
    a16: Measure


# XNNPACK and portable run no 16-bit activations; their 8-bit measure stands for any quantized.
_DEFAULTS: dict[Backend, _Defaults] = {
    Backend.XNNPACK: _Defaults(_XNNPACK_FP32, _XNNPACK_Q8, _XNNPACK_Q8),
    Backend.PORTABLE: _Defaults(_PORTABLE_FP32, _PORTABLE_Q8, _PORTABLE_Q8),
    Backend.QNN: _Defaults(_QNN_FP16, _QNN_A8, _QNN_A16),
}


def default_outcome(backend: Backend, precision: Recipe) -> Measure:
    """The checks a case meets unless a rule says otherwise."""
    defaults = _DEFAULTS[backend]
    if not precision.is_quantized:
        return defaults.unquantized
    return defaults.a8 if precision.activation_bits == 8 else defaults.a16


def default_structure(backend: Backend) -> Structure:
    """A backend without a delegate (portable) delegates nothing; the others should take the
    whole case."""
    if BACKENDS[backend].runtime_id is None:
        return Structure(Delegation.NONE)
    return Structure(Delegation.FULL)


def resolve(
    rules: tuple[Rule, ...], target: str, backend: Backend, precision: Recipe
) -> tuple[Outcome, Structure]:
    """The outcome and structure a case with `rules` must show on (`target`, `precision`)."""
    outcome: Outcome | None = None
    structure: Structure | None = None
    for rule in rules:
        if not rule.matches(target, precision):
            continue
        if outcome is None and rule.outcome is not None:
            outcome = rule.outcome
        if structure is None and rule.structure is not None:
            structure = rule.structure
    # `is None`, never truthiness: no value here may read as "unset" by being falsy.
    if outcome is None:
        outcome = default_outcome(backend, precision)
    if structure is None:
        structure = default_structure(backend)
    return outcome, structure


def measure_for(
    rules: tuple[Rule, ...], target: str, backend: Backend, precision: Recipe
) -> Measure:
    """The checks that apply under an XFail: the first matching Measure rule, else the default.

    An expected failure is judged against the checks the cell would otherwise meet, so a strict
    XFail that starts passing them is reported (and the rule can go).
    """
    for rule in rules:
        if rule.matches(target, precision) and isinstance(rule.outcome, Measure):
            return rule.outcome
    return default_outcome(backend, precision)
