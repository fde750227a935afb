"""HTP contexts kept by what they are built from, so a compile resumes where it stopped.

A QNN compile builds context binaries: one per partition and method (with `--num-shards N`, per
shard), or one per partition for every method with weight sharing. Each is a pure function
of the partition's programs (graph, node metadata, constants), the compile specs, the method names
and the toolchain. So each is stored under a digest of exactly those, the moment QNN returns it:
a compile killed at shard k finds shards 1..k-1 on its rerun and builds k..N; a compile whose
program changed in one layer range rebuilds the shards whose partitions changed and reuses the
rest.

The cut is `QnnBackend.preprocess_multimethod` (ExecuTorch calls it once with every partition of
every method): replaced while `building_contexts` is active, it builds each missing partition with
the stock code, one partition at a time. Outside, the stock code runs.

What the digest leaves out is metadata QNN does not read to build a context: source locations,
provenance, the module stack, debug handles and partition tags. Node names are in it (QNN names
its tensors after them), so a program whose earlier layers gained ops may rebuild later shards
too. An entry is written atomically and carries the sha256 of its payload, checked when read: a
damaged one is rebuilt, never used.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qnn_common.store.atomic import atomic_write_bytes, is_temp_name
from qnn_compile.scoped_patch import Replacement, ScopedPatch

log = logging.getLogger(__name__)

# Metadata that does not shape a context (where a node came from, how it was tagged), and that
# would tie a digest to the run that traced it: from_node holds graph ids, debug handles and
# partition tags count nodes of the whole program.
_IGNORED_META = frozenset({
    "stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "torch_fn", "seq_nr",
    "debug_handle", "delegation_tag", "partitioner_tag", "original_aten", "is_submodule",
})
_MAGIC = b"QNNCTX1\n"
_SUFFIX = ".ctx"
# Entries beyond this many bytes are evicted, least recently used first (never those of the
# compile that just ran). A SmolLM2-135M context pair is about 0.4 GB.
DEFAULT_BUDGET_BYTES = 8 * 1024**3


@dataclass(frozen=True)
class ContextRecord:
    """One context of a compile: its partition index, the methods whose graphs it holds, its
    key (empty without a cache), payload bytes, whether it came from the cache, and the seconds
    spent building it (0 when reused)."""

    index: int
    methods: tuple[str, ...]
    key: str
    bytes: int
    reused: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "seconds": round(self.seconds, 3)}


class ContextCache:
    """A directory of context binaries, one file per key."""

    def __init__(self, root: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.root = Path(root)
        self.budget_bytes = budget_bytes

    def _path(self, key: str) -> Path:
        return self.root / f"{key}{_SUFFIX}"

    def get(self, key: str, methods: Sequence[str]) -> list[bytes] | None:
        """Each method's payload stored under `key`, or None (absent, or damaged: then removed)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            blobs = _decode(data, methods)
        except ValueError as err:
            log.warning("HTP context cache entry %s is damaged (%s): building it again", path, err)
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recently used: evicted last
        return blobs

    def put(self, key: str, methods: Sequence[str], blobs: Sequence[bytes]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self._path(key), _encode(methods, blobs))

    def prune(self, keep: set[str]) -> None:
        """Evict least recently used entries beyond the budget, and temp files a killed write
        left; never the entries in `keep`."""
        if not self.root.is_dir():
            return
        entries = []
        for path in self.root.iterdir():
            if is_temp_name(path.name) and time.time() - path.stat().st_mtime > 3600:
                path.unlink(missing_ok=True)
            elif path.suffix == _SUFFIX:
                st = path.stat()
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.budget_bytes:
                break
            if path.name.removesuffix(_SUFFIX) in keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
            log.info("HTP context cache over %d bytes: evicted %s", self.budget_bytes, path.name)


def _encode(methods: Sequence[str], blobs: Sequence[bytes]) -> bytes:
    unique: list[bytes] = []
    of_method: list[int] = []
    for blob in blobs:  # methods of one partition share one context: stored once
        if blob not in unique:
            unique.append(blob)
        of_method.append(unique.index(blob))
    payload = b"".join(unique)
    header = {"methods": list(methods), "sizes": [len(b) for b in unique],
              "of_method": of_method, "sha256": hashlib.sha256(payload).hexdigest()}
    return _MAGIC + json.dumps(header).encode() + b"\n" + payload


def _decode(data: bytes, methods: Sequence[str]) -> list[bytes]:
    if not data.startswith(_MAGIC):
        raise ValueError("not a context cache entry")
    line_end = data.find(b"\n", len(_MAGIC))
    if line_end < 0:
        raise ValueError("no header")
    try:
        header = json.loads(data[len(_MAGIC):line_end])
    except json.JSONDecodeError as err:
        raise ValueError(f"unreadable header: {err}") from None
    payload = data[line_end + 1:]
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise ValueError("payload does not match its sha256")
    if header.get("methods") != list(methods):
        raise ValueError(f"holds methods {header.get('methods')}, not {list(methods)}")
    unique, offset = [], 0
    for size in header["sizes"]:
        unique.append(payload[offset:offset + size])
        offset += size
    return [unique[i] for i in header["of_method"]]


# --- the digest ---------------------------------------------------------------------------------


def _tensor_digest(t: torch.Tensor) -> str:
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    plain = t.detach().to("cpu").contiguous()
    if plain.is_quantized:  # the codes, then the scheme and its parameters
        per_tensor = plain.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric)
        params = ((plain.q_scale(), plain.q_zero_point()) if per_tensor else
                  (_tensor_digest(plain.q_per_channel_scales()),
                   _tensor_digest(plain.q_per_channel_zero_points()),
                   plain.q_per_channel_axis()))
        h.update(f"{plain.qscheme()}|{params}|".encode())
        plain = plain.int_repr()
    if plain.numel():
        h.update(plain.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _canonical(value: Any) -> Any:
    """A JSON-able form of a metadata / argument value that differs wherever the value does.
    An object with no faithful form (a repr naming its address) gives a digest no run repeats:
    never a false hit."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, torch.Tensor):
        if isinstance(value, torch._subclasses.fake_tensor.FakeTensor) or value.is_meta:
            return {"fake": [str(value.dtype), [str(d) for d in value.shape]]}
        return {"tensor": _tensor_digest(value)}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, torch.dtype | torch.device | torch.memory_format | torch.SymInt):
        return str(value)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    module = getattr(value, "__module__", None)
    if callable(value) and isinstance(name, str):
        return f"{module}.{name}|{value}"
    return repr(value)


def program_digest(ep: torch.export.ExportedProgram) -> str:
    """What a partition's context is built from: its nodes in order (op, name, target,
    arguments, metadata QNN may read), its signature, and its constants' bytes."""
    h = hashlib.sha256()
    for node in ep.graph.nodes:
        meta = {k: v for k, v in node.meta.items() if k not in _IGNORED_META}
        record = [node.op, node.name, _canonical(node.target) if node.op == "call_function"
                  else str(node.target), _canonical(node.args), _canonical(node.kwargs),
                  _canonical(meta)]
        h.update(json.dumps(record, sort_keys=True).encode())
    h.update(str(ep.graph_signature).encode())
    for name, tensor in sorted({**ep.state_dict, **ep.constants}.items()):
        if isinstance(tensor, torch.Tensor):
            h.update(f"{name}:{_tensor_digest(tensor)}".encode())
        else:  # a script object: no faithful bytes
            h.update(f"{name}:{tensor!r}".encode())
    return h.hexdigest()


def partition_key(
    programs: Mapping[str, torch.export.ExportedProgram], specs: Mapping[str, Sequence[Any]],
    salt: str,
) -> str:
    """The key of one partition's context: each method's program digest and compile specs
    (their serialized bytes), in method order, and `salt` (toolchain versions)."""
    h = hashlib.sha256(salt.encode())
    for method, program in programs.items():
        h.update(f"|{method}|{program_digest(program)}|".encode())
        for spec in specs[method]:
            h.update(f"{spec.key}=".encode() + bytes(spec.value))
    return h.hexdigest()[:40]


# --- the cut ------------------------------------------------------------------------------------


def one_context_per_method(weight_sharing: bool) -> bool:
    """Whether each method of a QNN program gets contexts of its own. Without weight sharing
    each method's graph holds its own weights anyway, so apart they take the same bytes, and
    QNN holds one method's graph and weights at a time while building instead of all of them
    (a decoder compile's peak memory). Weight sharing needs every method in one context."""
    return not weight_sharing


@dataclass
class _Session:
    cache: ContextCache | None
    salt: str
    per_method: bool
    records: list[ContextRecord]


_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar(
    "htp_context_cache", default=None
)


def _preprocess_multimethod(
    edge_programs: dict[str, list[torch.export.ExportedProgram]],
    compile_specs: dict[str, list[list[Any]]],
) -> dict[str, list[Any]]:
    original: Callable[..., dict[str, list[Any]]] = _PATCH.original("preprocess_multimethod")
    session = _SESSION.get()
    if session is None:
        return original(edge_programs, compile_specs)
    from executorch.exir.backend.backend_details import PreprocessResult

    methods = list(edge_programs)
    count = len(edge_programs[methods[0]])
    if any(len(p) != count for p in edge_programs.values()):
        return original(edge_programs, compile_specs)  # upstream's own error says why
    groups = [[m] for m in methods] if session.per_method else [methods]
    total = count * len(groups)
    results: dict[str, list[Any]] = {m: [] for m in methods}
    for i in range(count):
        for group in groups:
            n = len(session.records) + 1
            programs = {m: edge_programs[m][i] for m in group}
            specs = {m: compile_specs[m][i] for m in group}
            # Hashing every weight is only worth it where there is a cache to look in.
            key = partition_key(programs, specs, session.salt) if session.cache is not None else ""
            blobs = session.cache.get(key, group) if session.cache is not None else None
            reused, seconds = blobs is not None, 0.0
            if blobs is None:
                log.info("building HTP context %d/%d (%s)", n, total, ", ".join(group))
                t = time.perf_counter()
                built = original({m: [programs[m]] for m in group}, {m: [specs[m]] for m in group})
                seconds = time.perf_counter() - t
                blobs = [bytes(built[m][0].processed_bytes) for m in group]
                del built
                if session.cache is not None:
                    session.cache.put(key, group, blobs)
                log.info("built HTP context %d/%d in %.1f s (%d bytes)", n, total, seconds,
                         len(blobs[0]))
            else:
                log.info("HTP context %d/%d (%s) reused (%d bytes)", n, total, ", ".join(group),
                         len(blobs[0]))
            session.records.append(
                ContextRecord(i, tuple(group), key, len(blobs[0]), reused, seconds))
            for method, blob in zip(group, blobs, strict=True):
                results[method].append(PreprocessResult(processed_bytes=blob, debug_handle_map={}))
    return results


def _replacements() -> list[Replacement]:
    from executorch.backends.qualcomm.qnn_preprocess import QnnBackend

    return [(QnnBackend, "preprocess_multimethod", staticmethod(_preprocess_multimethod))]


_PATCH = ScopedPatch(_replacements)


@contextlib.contextmanager
def building_contexts(
    salt: str, *, per_method: bool, cache: ContextCache | None = None
) -> Iterator[list[ContextRecord]]:
    """While inside, QNN builds its contexts one partition at a time, and with `per_method` one
    context per method (each method's graph apart: the methods' weights are not built at once);
    with a `cache`, contexts built before come from it and new ones go into it as each is
    built. Yields the records of the contexts built or reused, in order; prunes the cache after
    (keeping this block's)."""
    records: list[ContextRecord] = []
    token = _SESSION.set(_Session(cache, salt, per_method, records))
    try:
        with _PATCH.active():
            yield records
    finally:
        _SESSION.reset(token)
        if cache is not None:
            cache.prune({r.key for r in records})
