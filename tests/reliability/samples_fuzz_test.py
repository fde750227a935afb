"""Issue 49's fuzz test for nested pickles: sample `.pt` files built from seeded mutations.

Each case is a file `load_inputs` / `load_samples` may be given (`--inputs`, `--calibration-file`,
an artifact's eval inputs): deep nesting, lists and tuples sharing their children (DAGs that
expand past any bound), self-references, dict keys of odd types, leaves that are not tensors,
`__reduce__` payloads, very long lists, storages larger than their bytes, wrong top-level types,
and flipped bytes in an honest file's pickle. A child process loads each one, then does what the
stages do with what loads (flatten, describe, copy, compare, save again), under a per-case alarm;
the next child goes on after a case it died on. Every case must load or be one ArtifactError
line: 0 payloads run, 0 other exceptions, 0 tracebacks, 0 cases past `CASE_SECONDS`.
`QNN_FUZZ_SEED` picks other cases.
"""

from __future__ import annotations

import io
import os
import random
import struct
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from qnn_common.torchio.samples import ModelInputs, save_samples
from support.crafted_pt2 import Payload
from support.crafted_samples import deep_lists, self_containing_list, torch_bytes, with_pickle
from support.resumable_children import run_cases

CASES_PER_KIND = 8
CASE_SECONDS = 20
SEED = int(os.environ.get("QNN_FUZZ_SEED", "49"))

_LOADER = r"""
import json, signal, sys, tempfile
from pathlib import Path
from qnn_common.errors import ArtifactError
from qnn_common.torchio import samples as s

class Hang(Exception):
    pass

def alarm(*_):
    raise Hang()

signal.signal(signal.SIGALRM, alarm)
seconds, first, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
scratch = Path(tempfile.mkdtemp())

def use(path):
    loaded = s.load_inputs(path)
    for sample in loaded:  # what the stages do with samples once loaded
        sample.leaves(), sample.describe(), sample.clone(), sample.is_flat()
    s.inputs_mismatch(loaded, loaded[0])
    s.save_samples(scratch / "again.pt", loaded)
    s.load_inputs(scratch / "again.pt", like=loaded[0])
    try:
        s.load_samples(path)
    except ArtifactError:
        pass  # structured inputs are not flat samples: refusing them is right
    return len(loaded)

for index, path in enumerate(paths[first:], start=first):
    signal.alarm(seconds)
    try:
        outcome, message = "loaded", str(use(Path(path)))
    except ArtifactError as err:
        outcome, message = "error", str(err)
    except Hang:
        outcome, message = "hang", ""
    except Exception as err:
        outcome, message = "exception", f"{type(err).__name__}: {err}"
    signal.alarm(0)
    print(json.dumps({"index": index, "outcome": outcome, "message": message}), flush=True)
"""


def _leaf(rng: random.Random) -> object:
    makers: list[Callable[[], object]] = [
        lambda: torch.randn(rng.randint(1, 3), 2),
        lambda: torch.zeros(2, dtype=torch.int64),
        lambda: rng.randint(-5, 5), lambda: 0.5, lambda: None, lambda: True,
    ]
    return rng.choice(makers)()


def _nested(rng: random.Random, depth: int) -> object:
    wraps: list[Callable[[object], object]] = [
        lambda v: [v, _leaf(rng)], lambda v: (v,), lambda v: {"k": v, "x": _leaf(rng)},
    ]
    value = _leaf(rng)
    for _ in range(depth):
        value = rng.choice(wraps)(value)
    return value


def _shared(rng: random.Random, levels: int) -> object:
    """Each level holds the previous one two or three times: 2^levels paths or more."""
    value: object = [_leaf(rng)]
    for _ in range(levels):
        wrap = rng.choice([list, tuple])
        value = wrap([value] * rng.randint(2, 3))
        if rng.random() < 0.3:
            value = {"args": value} if rng.random() < 0.5 else {"a": value, "b": value}
    return value


_ODD_KEYS: list[object] = [1, 2.5, None, True, (1, 2), b"k", torch.float32, ("a", ("b",))]
_ODD_LEAVES: list[Callable[[], object]] = [
    lambda: "text", lambda: b"bytes", lambda: 1 + 2j, lambda: torch.float16,
    lambda: torch.Size([2, 3]), lambda: bytearray(b"x"), lambda: {1, 2}, lambda: frozenset({3}),
    lambda: range(4), lambda: slice(1, 2), lambda: torch.device("cpu"),
    lambda: torch.nn.Parameter(torch.ones(2)), lambda: 10**400,
]


def _flipped(rng: random.Random) -> bytes:
    """An honest structured file with bytes of its pickle flipped (CRC recomputed, so the flips
    reach the unpickler)."""
    buffer = io.BytesIO()
    torch.save({"qnn_inputs": 1, "samples": [{"args": (torch.ones(2), [1, None]),
                                               "kwargs": {"s": torch.zeros(1)}}]}, buffer)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for name in archive.namelist():
            data = bytearray(archive.read(name))
            if name.endswith("/data.pkl"):
                for _ in range(rng.randint(1, 3)):
                    data[rng.randrange(2, len(data))] ^= rng.randrange(1, 256)
            dst.writestr(name, bytes(data))
    return out.getvalue()


def _oversized_storage(rng: random.Random) -> bytes:
    """A tensor whose pickle declares far more elements (or a negative count) than its storage
    holds."""
    data = torch_bytes([torch.zeros(70_000)])
    numel = rng.choice([2**31 - 1, 2**28, -1, 70_001])
    return data.replace(b"J" + struct.pack("<i", 70_000), b"J" + struct.pack("<i", numel), 1)


def _cases(rng: random.Random, marker: Path, directory: Path) -> list[Path]:
    kinds: dict[str, Callable[[int, Path], object]] = {
        "nested": lambda i, p: p.write_bytes(torch_bytes([(_nested(rng, rng.randint(1, 80)),)])),
        "deep-raw": lambda i, p: deep_lists(p, rng.choice([65, 70, 1000, 200_000])),
        "shared": lambda i, p: p.write_bytes(torch_bytes(_shared(rng, rng.randint(1, 45)))),
        "self": lambda i, p: self_containing_list(p),
        "odd-keys": lambda i, p: p.write_bytes(torch_bytes(
            [{"args": (torch.ones(1),), "kwargs": {rng.choice(_ODD_KEYS): torch.ones(1)}}])),
        "odd-leaves": lambda i, p: p.write_bytes(torch_bytes(
            [(torch.ones(1), rng.choice(_ODD_LEAVES)())])),
        "payload": lambda i, p: p.write_bytes(torch_bytes(
            [(torch.ones(1), _nested(rng, 2), Payload(marker, "__import__('torch').ones(1)"))])),
        "long": lambda i, p: p.write_bytes(torch_bytes(
            rng.choice([[None] * 100_000, [(torch.ones(1),)] * 5_000, list(range(100_000))]))),
        "storage": lambda i, p: p.write_bytes(_oversized_storage(rng)),
        "wrong-type": lambda i, p: p.write_bytes(torch_bytes(rng.choice(
            ["text", 3, None, {"qnn_inputs": 99, "samples": []}, {"args": 1}, [], ()]))),
        "flipped": lambda i, p: p.write_bytes(_flipped(rng)),
        "raw-ops": lambda i, p: with_pickle(p, rng.choice([
            b"]" + b"h\x00" * 3 + b"a", b"(" * 5000 + b"l" * 5000, b"}q\x00h\x00h\x00s",
            b"c__builtin__\neval\nX\x01\x00\x00\x001\x85R", b"\x8c\x02os\x8c\x06system\x93",
        ])),
    }
    paths = []
    for kind, make in kinds.items():
        for i in range(CASES_PER_KIND):
            path = directory / f"{kind}-{i}.pt"
            make(i, path)
            paths.append(path)
    return paths


def test_mutated_sample_files_load_or_are_one_error_line(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    paths = _cases(random.Random(SEED), marker, tmp_path)
    results, stderr = run_cases(
        lambda first: [sys.executable, "-c", _LOADER, str(CASE_SECONDS), str(first),
                       *map(str, paths)],
        len(paths), timeout=900,
    )
    counts: dict[str, int] = {}
    for record in results.values():
        counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
    bad = {paths[i].name: r for i, r in results.items() if r["outcome"] not in ("error", "loaded")}
    assert not bad, f"{counts}: {dict(list(bad.items())[:5])}"
    assert not marker.exists(), "a payload ran"
    assert "Traceback" not in stderr, stderr[-3000:]
    messages = [r["message"] for r in results.values() if r["outcome"] == "error"]
    assert not [m for m in messages if "\n" in m or "weights_only" in m], messages[:3]
    assert counts.get("loaded", 0) >= CASES_PER_KIND and counts.get("error", 0) > len(paths) // 2
    print(f"samples fuzz, seed {SEED}: {counts}")


def test_the_fuzzers_honest_cases_do_load(tmp_path: Path) -> None:
    """The bounds leave real inputs alone: nesting, repeats and long lists well inside them."""
    from qnn_common.torchio.samples import load_inputs

    rng = random.Random(SEED)
    value = _nested(rng, 20)
    save_samples(tmp_path / "nested.pt", [ModelInputs((value,))] * 50)
    assert len(load_inputs(tmp_path / "nested.pt")) == 50
    (tmp_path / "long.pt").write_bytes(torch_bytes([(torch.ones(1),)] * 20_000))
    assert len(load_inputs(tmp_path / "long.pt")) == 20_000
