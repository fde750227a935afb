"""Lower an exported program to an ExecuTorch program (.pte bytes) for one backend.

Input is any `torch.export.ExportedProgram`: float, or PT2E-quantized (q/dq nodes in the graph)
and exported again. The result carries the serialized program and the numbers the compile report
shows: how many operator nodes a backend took over, how many stayed on the portable kernels, and
in how many delegate partitions.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import importlib
import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.fx

from qnn_common.config import Stage
from qnn_common.errors import StageError
from qnn_common.recipes import Backend
from qnn_common.store.atomic import atomic_path
from qnn_common.torchio.program_state import buffers
from qnn_compile.backends.lowering import BackendLowering
from qnn_compile.cia_ops import materializing_once
from qnn_compile.context_cache import ContextRecord
from qnn_compile.decompositions import check_kernels, check_ranks, decompose
from qnn_compile.lowering_errors import stage_error
from qnn_compile.native_log import NativeLog
from qnn_compile.node_sources import sharing_node_sources
from qnn_compile.op_counts import count_ops
from qnn_compile.partition_legalize import legalizing_in_place
from qnn_compile.partition_merge import merging_in_linear_checks
from qnn_compile.partition_recompile import recompiling_once

_STAGE = Stage.COMPILE
log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LoweredProgram:
    """A program lowered for one backend, serialized, with the counts the compile report needs.

    `delegated_ops` counts operator nodes inside delegate payloads (q/dq nodes a quantized graph
    hands to the backend included); `non_delegated_ops` counts operator nodes left in the top-level
    edge graph, which run on ExecuTorch's portable kernels; `op_counts` breaks the latter down by
    edge op name (e.g. ``aten.mean.dim``).
    """

    # The serialized program, held in pieces as ExecuTorch made it: `write_pte` streams them to a
    # file; `pte` joins them (a copy of the whole program: the size of the weights again).
    program: Any  # exir.ExecutorchProgramManager
    backend: Backend
    delegated_ops: int
    non_delegated_ops: int
    partitions: int
    op_counts: dict[str, int]
    # Per method, the payload bytes of each delegate in call order (for QNN, each HTP context).
    delegate_bytes: dict[str, list[int]] = field(default_factory=dict)
    # With a payload cache: each payload (one per partition, shared by the methods) built or
    # reused, in partition order.
    cached_payloads: list[ContextRecord] = field(default_factory=list)

    @functools.cached_property
    def pte(self) -> bytes:
        """The .pte's bytes, joined."""
        data: bytes = self.program.buffer
        return data

    def write_pte(self, path: Path) -> PteFile:
        """Write the .pte to `path` atomically, piece by piece, never joined in memory."""
        digest = hashlib.sha256()
        size = 0

        class _Tee(io.BufferedIOBase):
            def __init__(self, f: BinaryIO) -> None:
                self.f = f

            def write(self, b: Any) -> int:
                nonlocal size
                digest.update(b)
                size += len(b)
                return self.f.write(b)

        with atomic_path(path) as tmp, tmp.open("wb") as f:
            self.program.write_to_file(_Tee(f))
        return PteFile(path, size, digest.hexdigest())


@dataclass(frozen=True)
class PteFile:
    """A .pte as written: where, its size, the sha256 of the bytes written."""

    path: Path
    size: int
    sha256: str


def lower_program(
    ep: torch.export.ExportedProgram | Mapping[str, torch.export.ExportedProgram],
    lowering: BackendLowering,
    *,
    etrecord_path: Path | None = None,
    payload_cache: Path | None = None,
    share_provenance: bool = True,
    fast_partitioning: bool = True,
    materialize_cia_once: bool = True,
    check_ir: bool | None = None,
) -> LoweredProgram:
    """Lower `ep` with a backend's `lowering` (see `qnn_compile.backends`) to .pte bytes.

    `ep` is one program, or a mapping of method name -> program lowered into one .pte with
    several methods (a causal LM's prefill and decode). Methods that update buffers with the
    same names (a KV cache) share them in the .pte: one method writes what the next one reads.

    With `etrecord_path`, also write an ETRecord there (the exported, edge and ExecuTorch graphs
    plus debug handles) so devtools' Inspector can map ETDump events back to source ops.

    With `payload_cache`, a backend that builds costly payloads (QNN: HTP contexts) reuses those
    it built before from that directory and stores new ones there as each is built, so a
    killed compile resumes (`qnn_compile.context_cache`); other backends ignore it.

    `share_provenance=False` lowers with torch's own per-pass deep copies of every node's
    provenance (`qnn_compile.node_sources`), `fast_partitioning=False` with ExecuTorch's own
    partition merge (`qnn_compile.partition_merge`) and a code generation and a copy of the
    whole graph per partition cut (`qnn_compile.partition_recompile`,
    `qnn_compile.partition_legalize`), `materialize_cia_once=False` with torch materializing
    its CompositeImplicitAutograd ops once per op namespace per query (`qnn_compile.cia_ops`):
    the same bytes, slower; for comparisons (bench/).

    `check_ir`: run ExecuTorch's edge-dialect IR checks. None (the default) leaves a one-method
    program to its backend's choice (ExecuTorch's default checks; QNN's config does not) and
    turns them off for a causal LM's methods: the checks run the whole program again
    on fake tensors after every pass and after every constant a partition copies, which grows
    faster than the decoder's depth, and upstream's own LLM and XNNPACK exports turn them off
    (`EdgeCompileConfig(_check_ir_validity=False)`). They check, they change nothing: the same
    bytes either way.

    Raises:
        MissingKernelError: an operator left outside the delegates has no kernel in the
            ExecuTorch runtime (or refuses the program's tensor ranks); names each and what to do.
        StageError: lowering or serialization failed; the message names the failing operator when
            the upstream error does (and, for QNN, the library's own error lines), and the
            upstream exception is chained.
    """
    # 25 % of lowering was copying provenance (qnn_compile.node_sources); the stock partition
    # merge is cubic in a decoder's depth, cutting the partitions quadratic
    # (qnn_compile.partition_merge, qnn_compile.partition_recompile,
    # qnn_compile.partition_legalize); on small programs most
    # of `run_decompositions` was torch walking its CIA ops once per op namespace
    # (qnn_compile.cia_ops).
    # No autograd: serializing a program that updates a buffer in place from parameters that
    # require grad (as loaded) fails in ExecuTorch's passes ("a leaf Variable that requires grad
    # is being used in an in-place operation").
    with (
        torch.no_grad(),
        materializing_once() if materialize_cia_once else contextlib.nullcontext(),
        sharing_node_sources() if share_provenance else contextlib.nullcontext(),
        merging_in_linear_checks() if fast_partitioning else contextlib.nullcontext(),
        recompiling_once() if fast_partitioning else contextlib.nullcontext(),
        legalizing_in_place() if fast_partitioning else contextlib.nullcontext(),
    ):
        return _lower(ep, lowering, etrecord_path, check_ir, payload_cache)


def _edge_config(lowering: BackendLowering, check_ir: bool | None, methods: int) -> Any:
    """The backend's edge compile config with the IR checks `lower_program` asks for."""
    from executorch.exir import EdgeCompileConfig

    config = lowering.recipe.edge_compile_config
    if check_ir is None:
        if methods == 1:
            return config
        check_ir = False
    return dataclasses.replace(config or EdgeCompileConfig(), _check_ir_validity=check_ir)


def _lower(
    ep: torch.export.ExportedProgram | Mapping[str, torch.export.ExportedProgram],
    lowering: BackendLowering,
    etrecord_path: Path | None,
    check_ir: bool | None,
    payload_cache: Path | None = None,
) -> LoweredProgram:
    # Imported here so that importing this module (e.g. to read LoweredProgram) stays cheap.
    # The kernels import registers out variants of the quantized_decomposed q/dq ops: without it a
    # PT2E graph whose q/dq nodes stay outside a delegate (all of them, for portable) cannot be
    # serialized ("Missing out variants").
    importlib.import_module("executorch.kernels.quantized")  # imported for its side effect
    from executorch.exir import to_edge_transform_and_lower

    recipe = lowering.recipe
    backend = lowering.target.backend
    want_etrecord = etrecord_path is not None
    programs = dict(ep) if isinstance(ep, Mapping) else {"forward": ep}
    native = NativeLog()
    caching: contextlib.AbstractContextManager[list[ContextRecord]] = contextlib.nullcontext([])
    if payload_cache is not None and lowering.payload_cache is not None:
        caching = lowering.payload_cache(payload_cache)
    try:
        with native.capture(), lowering.context(), caching as cached:
            # Ops the stock flow cannot run become ones it can, for every backend, before any
            # backend pass or edge conversion sees them (qnn_compile.decompositions).
            programs = {m: decompose(p, backend) for m, p in programs.items()}
            for aten_pass in lowering.aten_passes:
                programs = {m: aten_pass(p) for m, p in programs.items()}
            transform_passes = None
            if recipe.edge_transform_passes:
                transform_passes = {
                    m: [q for make in recipe.edge_transform_passes for q in make(m, p)]
                    for m, p in programs.items()
                }
            # Decompositions and edge conversion of every method come first and log nothing of
            # their own: minutes on a deep decoder, so say what is under way.
            log.info(
                "converting %s to the edge dialect (%s ops), then partitioning for %s",
                ", ".join(programs),
                " + ".join(str(sum(1 for n in p.graph.nodes if n.op == "call_function"))
                           for p in programs.values()),
                backend.value,
            )
            edge = to_edge_transform_and_lower(
                programs,
                transform_passes=transform_passes,
                partitioner=recipe.partitioners or [],
                compile_config=_edge_config(lowering, check_ir, len(programs)),
                generate_etrecord=want_etrecord,
            )
    except Exception as exc:  # exir raises many unrelated types; each becomes one StageError
        raise stage_error(f"lowering for {backend.value} failed", exc, native) from exc

    # After edge conversion: exported programs keep in-place buffer writes, which functionalize
    # into buffer mutations only here.
    executorch_config = _executorch_config(
        {m: edge.exported_program(m) for m in programs}, lowering
    )
    delegated = partitions = 0
    outside: collections.Counter[str] = collections.Counter()
    payloads: dict[str, list[int]] = {}
    for method in programs:
        d, payloads[method], o = count_ops(edge.exported_program(method).graph_module)
        delegated, partitions = delegated + d, partitions + len(payloads[method])
        outside.update(o)
    unexpected = {k: v for k, v in outside.items() if k not in lowering.outside_by_design}
    if unexpected and lowering.expect_full_delegation:
        said = native.errors()
        log.warning(
            "%s refused %d op(s), which run on the portable CPU kernels instead: %s%s",
            backend.value, sum(unexpected.values()),
            ", ".join(f"{name} x{n}" for name, n in sorted(unexpected.items())),
            ("; the backend said:\n  " + "\n  ".join(said[-10:])) if said else "",
        )

    for method in programs:  # a 5-D convolution left outside a delegate fails at run time
        check_ranks(edge.exported_program(method).graph_module)
        _keep_initial_buffer_values(edge.exported_program(method))
    try:
        with native.capture():
            et_program = edge.to_executorch(executorch_config)
    except Exception as exc:  # as above: named, chained, with the failing op if known
        raise stage_error(f"serializing the {backend.value} program failed", exc, native) from exc
    # Every operator left to the CPU must have a kernel: fail here, naming it, not when run.
    check_kernels(et_program.executorch_program)

    if etrecord_path is not None:
        try:
            etrecord = et_program.get_etrecord()
            with atomic_path(etrecord_path) as tmp:
                etrecord.save(str(tmp))
        except Exception as exc:  # devtools' errors have no common base either
            raise StageError(
                _STAGE, f"writing the ETRecord to {etrecord_path} failed: {exc}", exc
            ) from exc

    return LoweredProgram(
        program=et_program,
        backend=backend,
        delegated_ops=delegated,
        non_delegated_ops=sum(outside.values()),
        partitions=partitions,
        op_counts=dict(sorted(outside.items())),
        delegate_bytes=payloads,
        cached_payloads=list(cached),
    )


def _keep_initial_buffer_values(ep: torch.export.ExportedProgram) -> None:
    """Serialize the initial value of each buffer the program updates in place, unless it is
    all zeros.

    ExecuTorch takes a mutated buffer's initial state to be meaningless: only its shape and dtype
    are written, and the runtime starts it at zeros. PyTorch starts it at the value the model
    registered, so a buffer that starts at anything else ran wrong, silently. A zero buffer (a
    KV cache) is left to the runtime's zeros: the same values, and no cache-sized bytes in the
    .pte.
    """
    signature = ep.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    values = buffers(ep)
    for node in ep.graph.nodes:
        fqn = signature.inputs_to_buffers.get(node.name) if node.op == "placeholder" else None
        if fqn in mutated and fqn in values and bool(values[fqn].any()):
            node.meta["et_init_buffer"] = True


def _mutates_buffers(ep: torch.export.ExportedProgram) -> bool:
    return bool(ep.graph_signature.buffers_to_mutate)


def _quantized_lookups(ep: torch.export.ExportedProgram) -> bool:
    """Whether an embedding reads a table torchao dequantizes (8da4w's, `qnn_quant.embedding`)."""
    for node in ep.graph.nodes:
        if node.op != "call_function" or "embedding" not in str(node.target):
            continue
        table = node.args[0] if node.args else None
        # Edge ops print as "<EdgeOpOverload: torchao.dequantize_affine.default>: schema = ...".
        if isinstance(table, torch.fx.Node) and "torchao.dequantize_affine" in str(table.target):
            return True
    return False


def _executorch_config(
    programs: Mapping[str, torch.export.ExportedProgram], lowering: BackendLowering
) -> Any:
    """The backend's serialization config; for several methods with state (a KV cache), one in
    which the methods share their mutable buffers. A program that looks rows up in a quantized
    table gets ExecuTorch's quant fusion, which makes each dequantize + embedding pair one
    ``quantized_decomposed.embedding_byte`` / ``embedding_4bit`` (rows dequantized as read)."""
    config = _sharing_config(programs, lowering)
    if not any(_quantized_lookups(p) for p in programs.values()):
        return config
    from executorch.exir import ExecutorchBackendConfig

    return dataclasses.replace(
        config or ExecutorchBackendConfig(), do_quant_fusion_and_const_prop=True
    )


def _sharing_config(
    programs: Mapping[str, torch.export.ExportedProgram], lowering: BackendLowering
) -> Any:
    if len(programs) < 2 or not any(_mutates_buffers(p) for p in programs.values()):
        return lowering.executorch_config
    if lowering.executorch_config is not None:
        raise StageError(
            _STAGE,
            f"{lowering.target.backend.value} cannot share mutable buffers between methods "
            f"({', '.join(programs)} update a KV cache): compile the program for xnnpack or "
            "portable",
        )
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    return ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
        emit_mutable_buffer_names=True,
    )
