"""Runs op cases through the real stage libraries, sharing work between cells.

export -> (PT2E quantize) -> lower -> execute, with `qnn_quant.engine.quantize_program`,
`qnn_compile.lower.lower_program` and `qnn_infer.runner.HostRunner`, exactly as the pipeline
calls them. Exports are cached per case, quantized programs per (case, quantizer, recipe):
XNNPACK and portable share one quantizer, so their quantized programs are one and the same.
Each cell still lowers and runs its own program: one case, one program.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.export import ExportedProgram

from qnn_common.cli.child_env import python_child_env
from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_common.torchio.program_state import initial_buffers_kept
from qnn_common.torchio.samples import Sample, flatten_outputs
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_infer.runner import HostRunner
from qnn_infer.runtimes import prepare_runtime
from qnn_quant.engine import quantize_program
from qnn_testing.cases import SEED, OpCase
from qnn_testing.matrix import OpTarget
from qnn_testing.structure import Lowered, is_qdq

CALIBRATION_SAMPLES = 8
Arrays = list[np.ndarray]


@dataclass(frozen=True)
class _Program:
    """An exported (maybe quantized) program, its example input, and its reference outputs."""

    program: ExportedProgram
    example: Sample
    reference: Arrays
    qdq_nodes: int


@dataclass
class CellRun:
    """What running one cell produced."""

    reference: Arrays
    got: Arrays
    lowered: Lowered
    qdq_nodes: int
    seconds: dict[str, float] = field(default_factory=dict)


def _numpy(outputs: Sample) -> Arrays:
    return [t.detach().to(torch.float64).numpy() for t in outputs]


def _qdq_count(ep: ExportedProgram) -> int:
    return sum(1 for n in ep.graph.nodes if n.op == "call_function" and is_qdq(str(n.target)))


def _quantizer_key(target: OpTarget) -> str:
    # Portable is calibrated with XNNPACK's quantizer (see qnn_quant.quantizers): same program.
    if target.backend in (Backend.XNNPACK, Backend.PORTABLE):
        return "xnnpack"
    soc = target.target.soc
    assert soc is not None  # a QNN target always has one
    return soc.name


class Harness:
    """Runs cells, caching exports and quantizations; one per test session (or coverage run).

    A failure in a shared step (export, quantize) is cached too, and raised again for every
    cell that needs it, so each cell reports the real error.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._float: dict[str, _Program | BaseException] = {}
        self._quant: dict[tuple[str, str, Recipe], _Program | BaseException] = {}
        self._runtimes: set[Backend] = set()

    def _inputs(self, case: OpCase) -> tuple[Sample, list[Sample]]:
        g = torch.Generator().manual_seed(SEED)
        example = case.inputs(g)
        return example, [case.inputs(g) for _ in range(CALIBRATION_SAMPLES)]

    def _reference(self, program: ExportedProgram, example: Sample) -> Arrays:
        # A copy: cases that update an input in place must not change the example; and the
        # program's buffers as they were: it is lowered after this.
        with torch.no_grad(), initial_buffers_kept(program):
            return _numpy(flatten_outputs(program.module()(*copy.deepcopy(example))))

    def exported(self, case: OpCase) -> _Program:
        """The case exported (strict=False, as the pipeline does) with its fp32 reference."""
        cached = self._float.get(case.name)
        if cached is None:
            try:
                example, _ = self._inputs(case)
                ep = torch.export.export(case.make(), copy.deepcopy(example), strict=False)
                cached = _Program(ep, example, self._reference(ep, example), 0)
            except Exception as exc:  # any export failure belongs to the cell's verdict
                cached = exc
            self._float[case.name] = cached
        if isinstance(cached, BaseException):
            raise cached
        return cached

    def quantized(self, case: OpCase, target: OpTarget, recipe: Recipe) -> _Program:
        """The case quantized for `target` at `recipe`, with its fake-quant reference."""
        key = (case.name, _quantizer_key(target), recipe)
        cached = self._quant.get(key)
        if cached is None:
            try:
                base = self.exported(case)
                _, calibration = self._inputs(case)
                ep = quantize_program(
                    base.program,
                    target=target.target,
                    recipe=recipe,
                    calibration=calibration,
                    progress=False,
                )
                cached = _Program(
                    ep, base.example, self._reference(ep, base.example), _qdq_count(ep)
                )
            except Exception as exc:  # cached like a result: see the class docstring
                cached = exc
            self._quant[key] = cached
        if isinstance(cached, BaseException):
            raise cached
        return cached

    def run(self, case: OpCase, target: OpTarget, recipe: Recipe) -> CellRun:
        """Lower and execute one cell; raises whatever a stage raised."""
        seconds: dict[str, float] = {}
        start = time.perf_counter()
        prog = self.quantized(case, target, recipe) if recipe.is_quantized else self.exported(case)
        seconds["prepare"] = time.perf_counter() - start
        soc = target.target.soc
        config = CompileConfig(
            backend=target.backend, recipe=recipe, soc=None if soc is None else soc.name
        )
        start = time.perf_counter()
        # A copy: backend passes may rewrite the graph, and the program is shared between cells.
        lowered = lower_program(copy.deepcopy(prog.program), lowering_for(config))
        seconds["lower"] = time.perf_counter() - start
        pte = self.workdir / f"{case.name}-{target.name}-{recipe.value}.pte"
        pte.write_bytes(lowered.pte)
        if target.backend not in self._runtimes:
            prepare_runtime({target.backend})
            self._runtimes.add(target.backend)
        start = time.perf_counter()
        got = HostRunner(pte).run(copy.deepcopy(prog.example))
        seconds["run"] = time.perf_counter() - start
        pte.unlink()
        return CellRun(
            reference=prog.reference,
            got=_numpy(got),
            lowered=Lowered(lowered.partitions, lowered.delegated_ops, lowered.op_counts),
            qdq_nodes=prog.qdq_nodes,
            seconds=seconds,
        )


# The child's whole program: one harness, one cell; exit 0 if the cell ran to its outputs.
_CHILD = """
import sys
from pathlib import Path
from op.harness import Harness
from qnn_common.recipes import Recipe
from qnn_testing.cases import BY_NAME
from qnn_testing.matrix import TARGETS_BY_NAME
case, target, recipe, workdir = sys.argv[1:5]
Harness(Path(workdir)).run(BY_NAME[case], TARGETS_BY_NAME[target], Recipe(recipe))
"""


def run_isolated(
    case: OpCase, target: OpTarget, recipe: Recipe, workdir: Path, timeout: float = 900.0
) -> subprocess.CompletedProcess[bytes]:
    """Run one cell (export to execution) in a child process; its return code is negative for
    the signal that killed it, its stderr kept. For cells expected to crash in native code, which
    would otherwise take the whole test process (and every cell after it) down. A fresh
    interpreter, not a fork: the parent's loaded backend libraries and threads stay out of it."""
    child = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            _CHILD,
            case.name,
            target.name,
            recipe.value,
            str(workdir),
        ],
        env=python_child_env(),
        timeout=timeout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    return child
