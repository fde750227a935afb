"""Exported programs (`.pt2`) between stages: saved reproducibly, loaded without running code.

Every `.pt2` goes through `check_pt2_archive`, whose checked copy is all torch's loader sees: a
program may come from a user, and a pickle from outside must never execute code. A program is
serialized in memory and written atomically (torch names the zip's inner folder after the file
it writes, so a temp file's random name would reach the bytes). A stage's programs travel to the
next stage in memory as well (`SavedProgram`) when both run in one process.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from qnn_common.errors import ArtifactError
from qnn_common.llm_spec import LLM_CUSTOM_OPS_MODULE
from qnn_common.store.atomic import atomic_write_bytes
from qnn_common.store.hashing import sha256_file
from qnn_common.torchio import serde_speed
from qnn_common.torchio.known_weights import buffers_written, reusable_tensors, reusing_weights
from qnn_common.torchio.pt2_archive import MODEL, check_pt2_archive

log = logging.getLogger(__name__)

_OP_LIBRARIES = (
    "torchao.quantization.pt2e", "torchao.quantization.quant_primitives", LLM_CUSTOM_OPS_MODULE,
)


@dataclass(frozen=True, eq=False)
class SavedProgram:
    """A program as `save_program` wrote it: the object, and the sha256 of the bytes written.

    A stage returns the programs it saved (`qnn_common.artifact.Artifact.programs`)
    and a chained run hands them to the next stage's input: `load_program(path, saved)` then
    returns the object, while the file still holds those bytes, instead of rebuilding it (for
    MiniLM 8a8w, torch.export.load of its two programs was 0.8-1.2 s of a ~27 s run). The file is
    the contract all the same: it is written, sealed and verified, and a stage run alone reads it.
    The stage given the object owns it and may change it (lowering does).
    """

    program: torch.export.ExportedProgram
    sha256: str


def save_program(path: Path, program: torch.export.ExportedProgram) -> SavedProgram:
    """Save an ExportedProgram (.pt2) atomically; the same program gives the same bytes.

    Gives the nodes renumbered copies of their provenance metadata (see _stable_provenance).
    The caller must not change the program after saving if it hands the result on.
    """
    _stable_provenance(program)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    data = buffer.getvalue()
    atomic_write_bytes(path, data)
    return SavedProgram(program, hashlib.sha256(data).hexdigest())


def handed_on(saved: Mapping[str, SavedProgram]) -> dict[str, SavedProgram]:
    """The programs of `saved` a next stage may take in memory: those sharing no tensor with
    another one.

    Programs saved from one model share its tensors: a causal LM's prefill and decode methods
    hold the same weights and KV-cache buffers, which calibrating one of them mutates. Loaded
    from their files they are independent, so such programs are loaded from disk (measured:
    otherwise the quantized decode program's saved KV cache differed from a standalone run's).
    """
    storages = {name: _storages(s.program) for name, s in saved.items()}
    return {
        name: s for name, s in saved.items()
        if not any(storages[name] & other for o, other in storages.items() if o != name)
    }


def share_equal_weights(programs: Mapping[str, torch.export.ExportedProgram]) -> int:
    """Give each weight of a later program that equals the same-named weight of an earlier one
    (shape, dtype and values) the earlier one's tensor; return the bytes that frees.

    A model's methods (a causal LM's prefill and decode) exported together hold one set of
    weights; saved and loaded as separate files, each holds a copy (SmolLM2: its 0.54 GB of fp32
    weights twice, or its quantized ones, which PT2E registers as buffers). Weights are the
    parameters, the constants and the buffers no method updates: a buffer that one method
    writes (a KV cache) is state, and stays each method's own.
    """
    written = {fqn for program in programs.values() for fqn in buffers_written(program)}
    first: dict[tuple[str, str], torch.Tensor] = {}
    freed = 0
    for program in programs.values():
        signature = program.graph_signature
        for kind, names, table in (
            ("state", [*signature.parameters,
                       *(b for b in signature.buffers if b not in written)], program.state_dict),
            ("constant", list(program.constants), program.constants),
        ):
            for name in names:
                tensor = table.get(name)
                if not isinstance(tensor, torch.Tensor):
                    continue
                known = first.setdefault((kind, name), tensor)
                if known is tensor or known.shape != tensor.shape or known.dtype != tensor.dtype:
                    continue
                # Loaded as one already (`load_methods`): the same view, compared as bytes then.
                same_view = _same_storage(known, tensor) and (
                    known.storage_offset(), known.stride()
                ) == (tensor.storage_offset(), tensor.stride())
                if same_view or torch.equal(known, tensor):
                    if not _same_storage(known, tensor):
                        freed += tensor.numel() * tensor.element_size()
                    table[name] = known
    return freed


def _storages(program: torch.export.ExportedProgram) -> frozenset[int]:
    """Where the program's weights, buffers and constants live in memory."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    return frozenset(
        t.untyped_storage().data_ptr() for t in tensors
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() != 0
    )


def _stable_provenance(program: torch.export.ExportedProgram) -> None:
    """Replace the graph ids in `node.meta["from_node"]` by their order of appearance.

    torch records `id(graph)`, a memory address, for every graph a node came from (PT2E
    quantization adds several); saved as is, the same program gives different bytes in every
    process. The ids only tell graphs apart, which the renumbering keeps.

    The nodes get renumbered copies of their provenance; the NodeSource objects themselves are
    left alone, since other programs may share them (a program lowered by
    `qnn_compile.lower_program` shares them with its edge program). A source shared by several
    nodes is copied once and stays shared. The bytes are those of the former in-place renumbering
    (same order of appearance): MiniLM's programs saved before and after are identical.
    """
    from torch.fx.traceback import NodeSource

    numbers: dict[int, int] = {}
    copies: dict[int, NodeSource] = {}

    def renumbered(source: NodeSource) -> NodeSource:
        known = copies.get(id(source))
        if known is not None:
            return known
        new = copy.copy(source)
        info = source.node_info
        if info is not None and isinstance(info.graph_id, int):
            new.node_info = NodeSource.NodeInfo(
                info.name, info.target, numbers.setdefault(info.graph_id, len(numbers))
            )
        new._dict = None  # to_dict() caches the old id
        copies[id(source)] = new  # before the parents: numbered in the order they were before
        new.from_node = [renumbered(parent) for parent in source.from_node or ()]
        return new

    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                sources = node.meta.get("from_node", None)
                if sources:
                    node.meta["from_node"] = [
                        renumbered(s) if isinstance(s, NodeSource) else s for s in sources
                    ]


def load_methods(
    paths: Mapping[str, Path], saved: Mapping[str, SavedProgram] | None = None
) -> dict[str, torch.export.ExportedProgram]:
    """Load a model's methods, each from its own `.pt2`, holding one copy of their equal weights.

    Each method after the first is loaded reusing the earlier ones' equal weights
    (`known_weights`), so the load never holds two copies of a weight beside the archive's
    bytes; `share_equal_weights` then makes the equal tensors one object. A buffer a method
    writes (state, such as a KV cache) is never shared.
    """
    programs: dict[str, torch.export.ExportedProgram] = {}
    reused = 0
    for method, path in paths.items():
        known = reusable_tensors(list(programs.values()))
        program = load_program(path, (saved or {}).get(method), known=known)
        held = {t.untyped_storage().data_ptr() for t in known.values()}
        reused += sum(s.nbytes() for s in _storages_of(program) if s.data_ptr() in held)
        for fqn in buffers_written(program):  # state: its own, even where the bytes matched
            buffer = program.state_dict.get(fqn)
            if isinstance(buffer, torch.Tensor) and any(
                _same_storage(buffer, other) for other in known.values()
            ):
                program.state_dict[fqn] = buffer.clone()
        programs[method] = program
    freed = share_equal_weights(programs)
    if reused + freed > 0:
        log.info("methods %s hold one copy of %.0f MB of equal weights",
                 ", ".join(programs), (reused + freed) / 2**20)
    return programs


def _storages_of(program: torch.export.ExportedProgram) -> list[torch.UntypedStorage]:
    """The distinct storages of a program's weights, buffers and constants."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage()
        for t in (*program.state_dict.values(), *program.constants.values())
        if isinstance(t, torch.Tensor)
    }
    return list(storages.values())


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() != 0


def load_program(
    path: Path,
    saved: SavedProgram | None = None,
    *,
    known: Mapping[str, torch.Tensor] | None = None,
) -> torch.export.ExportedProgram:
    """Load a .pt2 written by torch.export.save, refusing anything else with a clear reason.

    Refused before torch sees it: any archive that would make torch.export.load unpickle more
    than plain tensors (see `pt2_archive`), since unpickling can run arbitrary code.
    `saved`: the program as its stage saved it in this process (`SavedProgram`), returned as is
    if the file still holds exactly those bytes. `known`: tensors already loaded (another
    method's, by name); a weight whose bytes equal its known tensor's storage is loaded as that
    storage (`known_weights`). A model's methods: `load_methods`.
    """
    if not path.is_file():
        raise ArtifactError(path, "does not exist")
    if saved is not None and sha256_file(path) == saved.sha256:
        return saved.program
    with path.open("rb") as file:
        checked = check_pt2_archive(path, file)
    # A PT2E-quantized program holds quantized_decomposed / torchao ops, a causal LM exported
    # with custom ops ExecuTorch's `llama` ops: their op libraries must be registered before
    # deserialization, or a fresh process (a stage run alone) can't load it.
    for library in _OP_LIBRARIES:
        with contextlib.suppress(ImportError):
            importlib.import_module(library)
    serde_speed.install()
    # torch.export.load is load_pt2 plus two fallbacks, neither wanted on a file from outside: on
    # a RuntimeError it logs the traceback and retries the archive in the pre-2.7 format, which
    # unpickles its state dict with a weights_only=False retry of its own.
    from torch.export.pt2_archive._package import load_pt2

    try:
        with reusing_weights(known or {}, checked.archive):
            program = load_pt2(io.BytesIO(checked.archive)).exported_programs[MODEL]
        program.example_inputs = checked.example_inputs  # checked against the input spec
    except Exception as err:  # zipfile, JSON and deserialization errors alike
        raise ArtifactError(
            path,
            f"is not an exported program ({type(err).__name__}: {_one_line(err)}); "
            "produce one with torch.export.save(torch.export.export(model, inputs), path)",
        ) from None
    return program


def _one_line(err: BaseException, limit: int = 300) -> str:
    """torch's message, which may span lines (it quotes whole nodes), as one short line."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else f"{text[:limit]}..."
