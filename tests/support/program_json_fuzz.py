"""Mutations of a `.pt2`'s program JSON, and the child that loads and runs each one.

`variants(...)` writes seeded mutations of a real program's `models/model.json`, in the classes
torch's loader turns into code or work: symbolic sizes (hostile Python, character-level damage
of real srepr text, huge numbers), guards, node targets, range constraints, tree specs, and any
value of the JSON replaced by another type. Every hostile string writes the same marker file if
it ever runs.

Run as `python -m support.program_json_fuzz FIRST PATH...` in a child process: each variant is
loaded with `load_program` and, when it loads, run on its sample inputs through
`ExportedProgram.module()` (where guards would run). One JSON line per variant:
`error` (a PipelineError at load, its message), `ran`, `run-error` (it loaded, and the graph
raised when run: data, not a loader failure), or `exception` (anything else at load: a defect).
"""

from __future__ import annotations

import copy
import json
import random
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Mutation = Callable[[dict[str, Any], random.Random], None]


def hostile(marker: Path) -> list[str]:
    """Python that writes `marker` when evaluated, in the shapes a size or a guard could take."""
    touch = f"__import__('pathlib').Path({str(marker)!r}).write_text('ran')"
    return [
        touch, f"({touch} and 16)", f"{touch} + 16", f"Integer(16) if {touch} else Integer(1)",
        f"Add(Integer(1), {touch})", f"Symbol('s0', integer={touch})", f"Integer({touch})",
        f"[{touch}][0]", f"(lambda: {touch})()", f"Add.__class__.__init__({touch})",
        f"Symbol({touch!r})", f"Float('1.5', precision={touch})",
    ]


_DAMAGE = "()[]{}'\",.:;+-*/%=!<>_ \\\n\x00eEabsS019"
_VALUES: list[Any] = [
    None, True, -1, 0, 2**63, -(2**63) - 1, 10**300, 1.5, float("inf"), "", "x" * 10_000,
    [], {}, [[[[[[]]]]]], {"as_expr": None}, "torch.load",
]
_TARGETS = [
    "torch.save", "torch.load", "torch.hub.load", "torch.utils.cpp_extension.load_inline",
    "torch.ops.aten.__class__", "torch.ops.aten.relu.default.__call__", "builtins.eval",
    "_operator.attrgetter", "math.__loader__", "#evil", "", "torch", "torch.ops",
    "torch.ops.aten.relu", "torch.ops.aten.add.Tensor", "torch.ops.higher_order.cond",
    "_operator.getitem", "torch.sym_max", "torch.ops.nonexistent.op.default",
]


def _sym_ints(node: Any) -> Iterator[dict[str, Any]]:
    stack = [node]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if ("as_expr" in value or "as_int" in value) and len(value) == 1:
                yield value
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _containers(node: Any) -> list[tuple[Any, Any]]:
    """(container, key or index) for every value of the JSON."""
    found: list[tuple[Any, Any]] = []
    stack = [node]
    while stack:
        value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            found.append((value, key))
            if isinstance(item, dict | list):
                stack.append(item)
    return found


def mutations(marker: Path) -> dict[str, Mutation]:
    payloads = hostile(marker)

    def expression(program: dict[str, Any], rng: random.Random) -> None:
        size = rng.choice(list(_sym_ints(program)))
        old = size.get("as_expr", {}) or {}
        text = old.get("expr_str") if isinstance(old, dict) else None
        if isinstance(text, str) and rng.random() < 0.5:
            chars = list(text)
            for _ in range(rng.randint(1, 4)):
                chars.insert(rng.randrange(len(chars) + 1), rng.choice(_DAMAGE))
            text = "".join(chars)
        else:
            text = rng.choice([
                *payloads, "Symbol('s0', positive=True, integer=True)",
                "Pow(Integer(10), Integer(10000000000))", "Integer(" + "9" * 5000 + ")",
                "Add(" * 500 + "Integer(1)" + ")" * 500,
                "Mul(Integer(2), Symbol('s0', integer=True))",
            ])
        size.clear()
        size["as_expr"] = {"expr_str": text, "hint": rng.choice([None, {"as_int": 4}])}

    def guards(program: dict[str, Any], rng: random.Random) -> None:
        program["guards_code"] = rng.choice([
            [rng.choice(payloads)], [rng.choice(payloads), "True"], "True", [1], None,
        ])

    def target(program: dict[str, Any], rng: random.Random) -> None:
        nodes = program["graph_module"]["graph"]["nodes"]
        rng.choice(nodes)["target"] = rng.choice([*_TARGETS, rng.choice(payloads)])

    def ranges(program: dict[str, Any], rng: random.Random) -> None:
        constraints = program.setdefault("range_constraints", {})
        name = rng.choice([*constraints, "s0", "x; import os", rng.choice(payloads)])
        constraints[name] = {
            "min_val": rng.choice([0, 4, -(2**70), 2**70, None, "0", 100]),
            "max_val": rng.choice([64, 2, 2**70, None, "inf", -5]),
        }

    def spec(program: dict[str, Any], rng: random.Random) -> None:
        signature = program["graph_module"]["module_call_graph"][0]["signature"]
        module = rng.choice(["os", "antigravity", "qnn_fuzz_payload"])
        context = rng.choice([
            json.dumps([{"__enum__": True, "fqn": f"{module}:E", "name": "A"}]),
            json.dumps({"default_factory_module": module, "default_factory_name": "getcwd",
                        "dict_context": []}),
            "null", "[", "{}",
        ])
        kind = rng.choice(["builtins.dict", "collections.defaultdict", "builtins.tuple",
                           "nonexistent.Type", None, 7])
        signature[rng.choice(["in_spec", "out_spec"])] = rng.choice([
            json.dumps([1, {"type": kind, "context": context, "children_spec": []}]),
            json.dumps([2, {}]), "[", None, 5,
        ])

    def anything(program: dict[str, Any], rng: random.Random) -> None:
        container, key = rng.choice(_containers(program))
        container[key] = copy.deepcopy(rng.choice([*_VALUES, rng.choice(payloads)]))

    return {"expression": expression, "guards": guards, "target": target, "ranges": ranges,
            "spec": spec, "anything": anything}


def variants(original: Path, directory: Path, marker: Path, seed: int,
             per_class: int) -> list[Path]:
    """`per_class` mutations of each class of `mutations`, written beside each other."""
    with zipfile.ZipFile(original) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    program_name = next(name for name in members if name.endswith("models/model.json"))
    program = json.loads(members[program_name])
    rng = random.Random(seed)
    paths = []
    for label, mutate in mutations(marker).items():
        for index in range(per_class):
            mutated = copy.deepcopy(program)
            for _ in range(rng.randint(1, 2)):
                mutate(mutated, rng)
            path = directory / f"{original.stem}-{label}-{index}.pt2"
            with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
                for name, data in members.items():
                    if name == program_name:
                        data = json.dumps(mutated).encode()
                    out.writestr(name, data)
            paths.append(path)
    return paths


def _load_and_run(path: Path) -> tuple[str, str]:
    from qnn_common.errors import PipelineError
    from qnn_common.torchio.programs import load_program

    try:
        program = load_program(path)
    except PipelineError as err:
        return "error", str(err)
    except Exception as err:
        return "exception", f"{type(err).__name__}: {str(err)[:300]}"
    args, kwargs = program.example_inputs or ((), {})
    try:
        program.module()(*args, **kwargs)
    except Exception as err:
        return "run-error", f"{type(err).__name__}: {str(err)[:300]}"
    return "ran", ""


def main(argv: list[str]) -> None:
    first, paths = int(argv[0]), argv[1:]
    for index, path in enumerate(paths[first:], start=first):
        outcome, message = _load_and_run(Path(path))
        print(json.dumps({"index": index, "outcome": outcome, "message": message}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
