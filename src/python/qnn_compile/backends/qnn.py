"""Qualcomm QNN HTP: an ahead-of-time compiled context binary for one SoC, inside the .pte.

The lowering mirrors executorch's `QNNRecipeProvider` / `to_edge_transform_and_lower_to_qnn`:
the QNN pass manager's export-pipeline passes on the ATen program, its edge transform passes,
`qnn_edge_config()`, a `QnnPartitioner` with HTP compile specs for the SoC (arch and VTCM come
from ExecuTorch's own table, keyed by the chipset id our SoC table carries), the whole of it inside
a `QnnManagerContext`, and serialization with graph inputs / outputs memory-planned and segments
aligned as the QNN runtime expects. Before any of that, the QNN SDK is found (QNN_SDK_ROOT, or the
project's x86 development SDK), checked for version skew, and activated in this process.

executorch 1.5.1 exposes no HTP graph optimization level from Python (its C++ side runs level 3);
the performance mode is exposed, as `CompileConfig.htp_performance_mode`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import torch
from torch.export import ExportedProgram

from qnn_common.config import HTP_PERFORMANCE_MODES, CompileConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.qnn_sdk import preflight_qnn_sdk, ready_qnn_sdk
from qnn_common.recipes import Recipe
from qnn_compile.backends.backend import CompileBackend
from qnn_compile.backends.lowering import BackendLowering
from qnn_compile.constant_subgraphs import folding_pass
from qnn_compile.context_cache import ContextCache, building_contexts, one_context_per_method
from qnn_compile.int_casts import keep_code_casts_on_cpu, truncation_pass
from qnn_compile.shards import FALLBACK_OP, ShardLayers
from qnn_compile.shared_constants import sharing_weights_with_qnn

log = logging.getLogger(__name__)

_POOLS = ("max_pool2d", "max_pool2d_with_indices", "avg_pool2d")


def explicit_pool_strides(ep: ExportedProgram) -> ExportedProgram:
    """Spell out pooling strides that export leaves at their default (the kernel size).

    ExecuTorch 1.5.1's QNN op builders read `node.args[2]` unconditionally: `max_pool2d(x, 2)`
    makes the partitioner crash with `IndexError: tuple index out of range` instead of lowering.
    PyTorch's default stride (None or []) means "the kernel size", so filling it in changes nothing.
    """
    for node in ep.graph_module.graph.nodes:
        name = getattr(node.target, "__name__", "")
        if node.op != "call_function" or name.split(".")[0] not in _POOLS:
            continue
        args = list(node.args)
        if len(args) == 2:
            args.append(args[1])
        elif len(args) > 2 and not args[2]:
            args[2] = args[1]
        node.args = tuple(args)
    ep.graph_module.recompile()
    return ep


def lowering(config: CompileConfig) -> BackendLowering:
    """HTP lowering for `config.target.soc` at `config.recipe` (fp16 or a quantized recipe).

    `config.num_shards` must be resolved to a number here (compile resolves "auto" from the
    program: qnn_compile/shard_sizes.py); before that, the lowering is built as for one shard.
    """
    shards = config.num_shards if isinstance(config.num_shards, int) else 1
    soc = config.target.soc
    assert soc is not None  # Target guarantees a SoC for qnn
    sdk = ready_qnn_sdk()

    from executorch.backends.qualcomm._passes import FoldQDQ
    from executorch.backends.qualcomm._passes.qnn_pass_manager import get_qnn_pass_manager_cls
    from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner
    from executorch.backends.qualcomm.serialization.qc_schema import (
        QcomChipset,
        QnnExecuTorchBackendType,
        QnnExecuTorchHtpPerformanceMode,
    )
    from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerContext
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        get_qnn_context_binary_alignment,
        qnn_edge_config,
    )
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.memory_planning_pass import MemoryPlanningPass
    from executorch.export import LoweringRecipe

    try:
        chipset = QcomChipset(soc.chipset_id)
    except ValueError as err:
        raise ConfigValidationError(
            "compile.soc", soc.name,
            f"this executorch build has no QcomChipset {soc.chipset_id}; upgrade executorch",
        ) from err
    mode = QnnExecuTorchHtpPerformanceMode(HTP_PERFORMANCE_MODES.index(config.htp_performance_mode))
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=chipset,
        backend_options=generate_htp_compiler_spec(
            use_fp16=config.recipe is Recipe.FP16, htp_performance_mode=mode,
            # All methods of a program are lowered in one call, so QNN builds one context
            # binary holding every method's graph (QnnBackend.preprocess_multimethod); with
            # weight sharing, that context stores each weight once instead of once per graph.
            use_weight_sharing=config.weight_sharing,
        ),
    )
    pass_manager_cls: Any = get_qnn_pass_manager_cls(QnnExecuTorchBackendType.kHtpBackend)

    def edge_passes(method: str, ep: Any) -> Any:
        passes = list(pass_manager_cls().get_to_edge_transform_passes(ep, compiler_specs=specs))
        if shards > 1:
            # After FoldQDQ, as upstream's SplitGraph: each cut carries its input's quant attrs.
            folded = [i for i, p in enumerate(passes) if isinstance(p, FoldQDQ)]
            passes.insert(folded[-1] + 1 if folded else len(passes), ShardLayers(shards))
        # Last, on QNN's annotations: a partition computed from constants alone would have no
        # graph inputs, which QNN cannot build (constant_subgraphs.py); a float-to-int cast
        # cast again, which QNN's preprocess would fuse away untruncated; and a quantized float
        # cast to an integer, which QNN would give the codes of (int_casts.py).
        return [*passes, folding_pass(), truncation_pass, keep_code_casts_on_cpu]

    def export_passes(ep: Any) -> Any:
        # Upstream runs these on the ATen program (LiftConstantScalarOperands and friends) so the
        # op builders find lifted constants; at the edge they would run too late.
        return pass_manager_cls().transform_for_export_pipeline(explicit_pool_strides(ep))

    per_method = one_context_per_method(config.weight_sharing)
    salt = json.dumps(
        {"executorch": version("executorch"), "torch": torch.__version__,
         "qnn_sdk": {k: v for k, v in sdk.record().items() if k not in ("root", "source")}},
        sort_keys=True, default=str)

    @contextlib.contextmanager
    def context() -> Iterator[None]:
        # The partitioner's op validation asks the active QnnManager; without one it makes its
        # own. Preprocess gets partitions sharing the program's weights, not copies of them.
        with (QnnManagerContext({"forward": specs}), sharing_weights_with_qnn(),
              building_contexts(salt, per_method=per_method)):
            yield

    return BackendLowering(
        target=config.target,
        recipe=LoweringRecipe(
            # A buffer the program updates in place (a static KV cache) stays a program input
            # and the runtime writes it back: delegated as upstream's default does, the HTP
            # graph binds it to one I/O address the runtime never fills, and the program
            # returned garbage, or failed to lower when the buffer itself is an output.
            # Programs without mutated buffers are partitioned the same either way.
            partitioners=[QnnPartitioner(specs, skip_mutable_buffer=True)],
            edge_transform_passes=[edge_passes],
            edge_compile_config=qnn_edge_config(),
        ),
        aten_passes=(export_passes,),
        executorch_config=ExecutorchBackendConfig(
            memory_planning_pass=MemoryPlanningPass(
                alloc_graph_input=True, alloc_graph_output=True
            ),
            segment_alignment=get_qnn_context_binary_alignment(),
        ),
        context=context,
        expect_full_delegation=True,
        # The shards' cuts run on the CPU by design (an identity each).
        outside_by_design=frozenset({FALLBACK_OP}) if shards > 1 else frozenset(),
        # A context is a function of its partition, the specs and these tools: kept, a killed
        # compile does not build again what it had built (qnn_compile.context_cache).
        payload_cache=lambda root: building_contexts(
            salt, per_method=per_method, cache=ContextCache(root)),
        tools={"qnn": sdk.qnn_version, "qnn_bridge": "yes" if sdk.bridged else "no"},
        record={
            **config.target.record(),
            "htp_performance_mode": config.htp_performance_mode,
            "weight_sharing": config.weight_sharing,
            "qnn_sdk": sdk.record(),
        },
    )


def toolchain_digests() -> dict[str, str]:
    """The QNN SDK that compiles the program: its version and build shape the context binary."""
    sdk = preflight_qnn_sdk()
    return {"qnn_sdk": f"{sdk.qnn_version}|{sdk.build_id}|bridged={sdk.bridged}"}


def preflight() -> None:
    """Before any stage runs: a missing or skewed QNN SDK must not cost a prepare + quantize."""
    sdk = preflight_qnn_sdk()
    log.info("QNN %s at %s%s", sdk.qnn_version, sdk.root,
             " (x86 dev SDK, bridged)" if sdk.bridged else "")


BACKEND = CompileBackend(lowering=lowering, toolchain_digests=toolchain_digests,
                         preflight=preflight)
