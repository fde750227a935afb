"""Benchmark: `lower_program` on small programs with and without each of our speed-ups of
ExecuTorch's lowering, side by side in one process (only ratios measured so are reported).

Run: `./pants run bench/lowering_bench.py -- --cases 40 --backend xnnpack`

The programs are the op suite's first `--cases` cases (`qnn_testing.cases`), exported once and,
at 8a8w, quantized once; each is then lowered once per variant, round-robin (so drifts of a busy
machine fall on every variant alike), and the variants' bytes compared (they must be equal):
- `ours`: as the compile stage lowers;
- `cia per namespace`: torch materializing its CompositeImplicitAutograd ops once per op
  namespace per query, as stock (`materialize_cia_once=False`, qnn_compile.cia_ops);
- `stock`: every speed-up off (also provenance deep-copied and ExecuTorch's own partitioning).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target
from qnn_compile.backends import lowering_for
from qnn_compile.lower import LoweredProgram, lower_program
from qnn_quant.engine import quantize_program
from qnn_testing.cases import CATALOGUE, SEED

Lower = Callable[[torch.export.ExportedProgram], LoweredProgram]


def _programs(count: int, backend: Backend, recipe: Recipe) -> list[tuple[str, Any]]:
    """The first `count` cases that export (and quantize) cleanly, with their programs."""
    out: list[tuple[str, Any]] = []
    for case in CATALOGUE:
        if len(out) == count:
            break
        g = torch.Generator().manual_seed(SEED)
        example = case.inputs(g)
        try:
            ep = torch.export.export(case.make(), copy.deepcopy(example), strict=False)
            if recipe.is_quantized:
                ep = quantize_program(ep, target=Target(backend), recipe=recipe,
                                      calibration=[case.inputs(g) for _ in range(4)],
                                      progress=False)
        except Exception:  # a case the suite expects to be refused: not a lowering to time
            continue
        out.append((case.name, ep))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=40)
    p.add_argument("--backend", default="xnnpack", choices=["xnnpack", "portable"])
    p.add_argument("--recipe", default="fp32", choices=["fp32", "8a8w"])
    args = p.parse_args()
    backend, recipe = Backend(args.backend), Recipe(args.recipe)
    lowering = lowering_for(CompileConfig(backend=backend, recipe=recipe))
    variants: dict[str, Lower] = {
        "ours": lambda ep: lower_program(ep, lowering),
        "cia per namespace": lambda ep: lower_program(ep, lowering, materialize_cia_once=False),
        "stock": lambda ep: lower_program(ep, lowering, share_provenance=False,
                                          fast_partitioning=False, materialize_cia_once=False),
    }
    programs = _programs(args.cases, backend, recipe)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    differ: list[str] = []
    for case, ep in programs:
        ptes = set()
        for name, lower in variants.items():
            program = copy.deepcopy(ep)  # backend passes may rewrite it: each lowers its own
            t = time.perf_counter()
            ptes.add(lower(program).pte)
            seconds[name].append(time.perf_counter() - t)
        if len(ptes) != 1:
            differ.append(case)
    print(f"lower_program, {len(programs)} op-suite programs, {backend.value} {recipe.value}; "
          f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print("| variant | total s | median s / program | vs ours |")
    print("|---|---|---|---|")
    ours = sum(seconds["ours"])
    for name, values in seconds.items():
        print(f"| {name} | {sum(values):.1f} | {statistics.median(values):.2f} | "
              f"{sum(values) / ours:.2f}x |")
    print("same .pte bytes for every variant:", "yes" if not differ else f"no: {differ}")


if __name__ == "__main__":
    main()
