"""The plain upstream ExecuTorch QNN calls a user would write, timed step by step.

What the pipeline is compared with on the HTP (`bench/pipeline_bench.py --backend qnn`), as the
outside run of issue 23 made them: `torch.export.export`, then for a quantized recipe
`QnnQuantizer` with its default settings (`set_default_quant_config(dtype)`: per-tensor weights,
its default activation observer), calibration on the samples, `convert_pt2e`, then
`to_edge_transform_and_lower_to_qnn`, `to_executorch`, and the program run in process. Nothing
of the pipeline's own lowering (its passes, folds, caches) is used; only the SDK is found and
activated the pipeline's way, since these machines cannot download one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from qnn_common.qnn_sdk import ready_qnn_sdk
from qnn_common.recipes import Recipe
from qnn_common.soc import Soc
from qnn_infer.measure import measure_latency
from qnn_infer.runner import HostRunner
from qnn_quant.quantizers.qnn import QNN_DTYPES


def plain_qnn(
    module: torch.nn.Module,
    example: tuple[Any, ...],
    calibration: Sequence[tuple[Any, ...]],
    recipe: Recipe,
    soc: Soc,
    runs: int,
    workdir: Path,
) -> dict[str, Any]:
    """Export, quantize (unless fp16), lower for `soc`, serialize and run `runs` times.

    Returns the seconds of each step (`steps_s`), their total, the lowering's seconds, the
    latency and the program's outputs on `example`.
    """
    ready_qnn_sdk()
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        to_edge_transform_and_lower_to_qnn,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    steps: dict[str, float] = {}
    t0 = t = time.perf_counter()
    program = torch.export.export(module, example)
    graph: torch.nn.Module = program.module()
    steps["export"], t = time.perf_counter() - t, time.perf_counter()
    if recipe.is_quantized:
        quantizer = QnnQuantizer(soc_model=QcomChipset(soc.chipset_id))
        quantizer.set_default_quant_config(getattr(QuantDtype, QNN_DTYPES[recipe]))
        prepared = prepare_pt2e(graph, quantizer)
        with torch.no_grad():
            for sample in calibration:
                prepared(*sample)
        graph = convert_pt2e(prepared)
        steps["quantize"], t = time.perf_counter() - t, time.perf_counter()
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=QcomChipset(soc.chipset_id),
        backend_options=generate_htp_compiler_spec(use_fp16=recipe is Recipe.FP16),
    )
    t_lower = time.perf_counter()
    edge = to_edge_transform_and_lower_to_qnn(graph, example, specs)
    pte = workdir / "plain.pte"
    pte.write_bytes(edge.to_executorch().buffer)
    lower_s = time.perf_counter() - t_lower
    steps["lower"], t = time.perf_counter() - t, time.perf_counter()
    runner = HostRunner(pte)
    outputs = runner.run(tuple(example))
    latency = measure_latency(runner, tuple(example), warmup=3, runs=runs)
    steps["execute"] = time.perf_counter() - t
    return {"total_s": time.perf_counter() - t0, "steps_s": steps, "lower_s": lower_s,
            "latency": latency, "outputs": outputs}
