"""Loading a program whose weights an already-loaded program holds, without a second copy.

A causal LM's prefill and decode are saved as separate `.pt2` files holding equal weights. Loaded
one after the other, the second load held the first's weights, the second's checked archive bytes
and a fresh copy of every tensor in it: three times the weights at once, the peak of the 1B
decoder's quantize stage. Inside `reusing_weights(known, archive)`, torch's loader takes each
weight record whose bytes equal the same-named tensor of `known` as that tensor's storage instead
of copying it out of the archive; records are compared in place (views of the archive's bytes),
so the load holds the first method's weights and the second's archive, and nothing more of it.

Only a record byte-identical to the storage its entries' known tensors share is reused, and torch
views it with each entry's own sizes and strides as it would the copy, so the loaded program sees
exactly the values its file holds. The records still come from the archive
`pt2_archive` checked: nothing here reads the file again.

The hook is torch's `torch.export.pt2_archive._package._build_file_map(archive_reader, config,
base_dir)` (torch 2.13): it turns the archive's weight or constant records into flat tensors,
which `_load_state_dict` / `_load_constants` view with each entry's sizes and strides. If torch
moves it, loading falls back to copying (a warning says so) and `known_weights_test` fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import os
import struct
import threading
import warnings
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

_LOCAL = b"PK\x03\x04"  # a zip member's local header
_HOOK_PARAMETERS = ("archive_reader", "config", "base_dir")
_lock = threading.Lock()


def reusable_tensors(programs: Sequence[torch.export.ExportedProgram]) -> dict[str, torch.Tensor]:
    """The tensors of `programs` a later load may share, by fully qualified name: parameters,
    constants and buffers none of them writes (a written buffer is state)."""
    written = {fqn for program in programs for fqn in buffers_written(program)}
    known: dict[str, torch.Tensor] = {}
    for program in programs:
        signature = program.graph_signature
        names = [*signature.parameters,
                 *(b for b in signature.buffers if b not in written)]
        for table, keys in ((program.state_dict, names), (program.constants, program.constants)):
            for name in keys:
                tensor = table.get(name)
                if isinstance(tensor, torch.Tensor) and _plain(tensor):
                    known.setdefault(name, tensor)
    return known


def buffers_written(program: torch.export.ExportedProgram) -> set[str]:
    """The buffers a program may write: those its signature says it mutates, and those an op
    takes as an aliased argument (an in-place update, or a view one could update through).
    Programs keep in-place writes until edge conversion functionalizes them, so the signature
    alone does not tell."""
    signature = program.graph_signature
    written = set(signature.buffers_to_mutate.values())
    for node in program.graph.nodes:
        fqn = signature.inputs_to_buffers.get(node.name) if node.op == "placeholder" else None
        if fqn is None:
            continue
        for user in node.users:
            if user.op == "output":
                continue
            schema = getattr(user.target, "_schema", None) if user.op == "call_function" else None
            if schema is None:  # not an ATen op: assume the worst
                written.add(fqn)
                break
            arguments = {a.name: a for a in schema.arguments}
            uses = [schema.arguments[i] for i, a in enumerate(user.args)
                    if a is node and i < len(schema.arguments)]
            uses += [arguments[k] for k, a in user.kwargs.items() if a is node and k in arguments]
            if len(uses) == 0 or any(a.alias_info is not None for a in uses):
                written.add(fqn)
                break
    return written


def hook_available() -> bool:
    """Whether this torch has the loader function `reusing_weights` hooks, as read."""
    from torch.export.pt2_archive import _package

    build = getattr(_package, "_build_file_map", None)
    if build is None:
        return False
    return tuple(inspect.signature(build).parameters) == _HOOK_PARAMETERS


@contextlib.contextmanager
def reusing_weights(known: Mapping[str, torch.Tensor], archive: bytes) -> Iterator[None]:
    """While inside, torch's loader, given `archive` (a checked `.pt2`'s bytes), takes each
    record equal to its known tensors' storage as that storage instead of a copy."""
    if not known:
        yield
        return
    if not hook_available():
        warnings.warn(
            "torch.export's loader changed (no _build_file_map(archive_reader, config, base_dir)):"
            " equal weights are copied again; qnn_common.torchio.known_weights needs updating",
            stacklevel=3,
        )
        yield
        return
    from torch.export.pt2_archive import _package

    original = _package._build_file_map
    records = _stored_records(archive)

    def build_file_map(archive_reader: Any, config: Any, base_dir: str) -> dict[str, torch.Tensor]:
        shared = _shared_records(records, config, base_dir, known)
        rest = dataclasses.replace(config, config={
            fqn: meta for fqn, meta in config.config.items() if meta.path_name not in shared
        })
        file_map: dict[str, torch.Tensor] = original(archive_reader, rest, base_dir)
        file_map.update(shared)
        return file_map

    with _lock:
        _package._build_file_map = build_file_map
        try:
            yield
        finally:
            _package._build_file_map = original


def _stored_records(archive: bytes) -> dict[str, memoryview]:
    """Each uncompressed member of the zip `archive`, by its name below the top folder (the name
    torch's reader looks up), as a view of its bytes in `archive`: compared without a copy."""
    view = memoryview(archive)
    records: dict[str, memoryview] = {}
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        for info in zf.infolist():
            start = info.header_offset
            if info.compress_type != zipfile.ZIP_STORED or archive[start:start + 4] != _LOCAL:
                continue
            name_len, extra_len = struct.unpack_from("<HH", archive, start + 26)
            data = start + 30 + name_len + extra_len
            _, _, inner = info.filename.partition("/")
            records[inner] = view[data:data + info.file_size]
    return records


def _shared_records(records: Mapping[str, memoryview], config: Any, base_dir: str,
                    known: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The records of `config` whose bytes equal the storage their entries' known tensors share,
    as flat tensors on that storage. torch views each entry into its record with the entry's own
    sizes, strides and offset, so tied weights (one record, several names) are kept tied."""
    from torch._export.serde.serialize import deserialize_scalar_type

    by_path: dict[str, list[tuple[str, Any]]] = {}
    for fqn, meta in config.config.items():
        by_path.setdefault(meta.path_name, []).append((fqn, meta))
    shared: dict[str, torch.Tensor] = {}
    for path_name, entries in by_path.items():
        tensors = [known.get(fqn) for fqn, _ in entries]
        metas = [meta for _, meta in entries]
        if any(t is None for t in tensors) or any(
            m.use_pickle or m.tensor_meta is None for m in metas
        ):
            continue
        dtypes = {deserialize_scalar_type(m.tensor_meta.dtype) for m in metas}
        storages = {t.untyped_storage().data_ptr() for t in tensors if t is not None}
        first = tensors[0]
        assert first is not None
        if len(storages) != 1 or dtypes != {first.dtype}:
            continue
        data = records.get(os.path.join(base_dir, path_name))
        storage = first.untyped_storage()
        if data is None or storage.nbytes() == 0 or data.nbytes != storage.nbytes():
            continue
        with warnings.catch_warnings():  # read-only bytes: compared, never written
            warnings.simplefilter("ignore", UserWarning)
            stored = torch.frombuffer(data, dtype=torch.uint8)
        held = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
        if not torch.equal(stored, held):
            continue
        numel = storage.nbytes() // first.element_size()
        shared[path_name] = torch.empty(0, dtype=first.dtype).set_(storage, 0, (numel,), (1,))
    return shared


def _plain(tensor: torch.Tensor) -> bool:
    """A dense CPU tensor (not a subclass): its storage can stand for a record's bytes."""
    return (
        tensor.layout == torch.strided
        and tensor.device.type == "cpu"
        and type(tensor) in (torch.Tensor, torch.nn.Parameter)
    )
