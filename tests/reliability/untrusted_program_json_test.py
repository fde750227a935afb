"""Issue 49, items 1-2: a `.pt2`'s program JSON ran code through torch's loader.

No pickle is involved: torch evaluates symbolic sizes with `sympy.sympify`, `exec`s `guards_code`
when `ExportedProgram.module()` runs, resolves node targets by name from `torch` (and the graph then
calls them), and imports the module a tree spec's enum or defaultdict names. Each class is shown
live in plain torch first (so the refusal below it proves something), then refused or defused by
`load_program`, the payload unrun; the CLI gives one `error:` line.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.errors import ArtifactError
from qnn_common.torchio.programs import load_program
from support.crafted_pt2 import (
    EXAMPLE_SHAPE,
    ProgramEdit,
    graph_nodes,
    guard_payload,
    save_plain_program,
    sympy_payload,
    with_program_json,
)
from support.pipeline_runs import child_env


@pytest.fixture(scope="module")
def plain_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "plain.pt2"
    save_plain_program(path)
    return path


def _target_payload(marker: Path) -> ProgramEdit:
    """The relu node becomes `torch.save(conv_output, marker)`: a file written by the graph."""
    def edit(program: dict[str, Any]) -> None:
        relu = graph_nodes(program)[-1]
        relu["target"] = "torch.save"
        relu["inputs"] = [
            {"name": "obj", "arg": relu["inputs"][0]["arg"], "kind": 1},
            {"name": "f", "arg": {"as_string": str(marker)}, "kind": 1},
        ]
    return edit


# --- 1. symbolic sizes -------------------------------------------------------------------------


def test_a_symbolic_size_runs_code_in_torch(plain_pt2: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", sympy_payload(marker))
    with contextlib.suppress(Exception):
        torch.export.load(evil)
    assert marker.exists(), "sympify no longer evaluates a .pt2's sizes: revisit program_json"


def test_a_symbolic_size_that_is_code_is_refused_unrun(plain_pt2: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", sympy_payload(marker))
    with pytest.raises(ArtifactError, match="symbolic size") as info:
        load_program(evil)
    assert "tensor_values.p_0_weight.sizes.0" in info.value.reason
    assert not marker.exists()


def test_qnn_compile_of_it_is_one_error_line(plain_pt2: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", sympy_payload(marker))
    done = subprocess.run(
        [sys.executable, "-m", "qnn_compile.cli", str(evil), "-o", str(tmp_path / "out")],
        env=child_env(), capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "symbolic size" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not marker.exists()


# --- 2. guards ---------------------------------------------------------------------------------


def test_guards_run_code_in_torch_on_every_forward(plain_pt2: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", guard_payload(marker))
    module = torch.export.load(evil).module()
    assert not marker.exists()  # built, not yet run
    with contextlib.suppress(Exception):
        module(torch.zeros(EXAMPLE_SHAPE))
    assert marker.exists(), "guards_code no longer runs: revisit program_json"


def test_guards_are_never_built_from_a_file(plain_pt2: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", guard_payload(marker))
    program = load_program(evil)
    assert program._guards_code == []
    x = torch.randn(EXAMPLE_SHAPE)
    assert torch.equal(program.module()(x), load_program(plain_pt2).module()(x))
    assert not marker.exists()


def test_range_constraints_still_check_inputs(tmp_path: Path) -> None:
    """Dropping guards drops no input check: the range constraints are kept, and enforced."""
    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    dim = torch.export.Dim("b", min=4, max=64)
    path = tmp_path / "dynamic.pt2"
    program = torch.export.export(Double(), (torch.randn(8, 3),), dynamic_shapes=({0: dim},))
    torch.export.save(program, path)
    module = load_program(path).module()
    assert module(torch.ones(5, 3)).sum() == 30
    with pytest.raises(AssertionError, match="<= 64|>= 4|b"):
        module(torch.ones(2, 3))


# --- node targets and operator arguments -------------------------------------------------------


def test_torch_resolves_any_torch_name_before_its_verifier_refuses_it(
    plain_pt2: Path, tmp_path: Path
) -> None:
    """torch's own last line: its verifier refuses a graph calling `torch.save`, but only after
    resolving the name (getattr on any torch attribute, importing submodules on the way)."""
    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", _target_payload(tmp_path / "m"))
    with pytest.raises(Exception, match="Operator '<function save") as info:
        torch.export.load(evil)
    assert type(info.value).__name__ == "SpecViolationError"


@pytest.mark.parametrize(
    "target",
    ["torch.save", "torch.utils.cpp_extension.load_inline", "torch.ops.aten.__class__",
     "builtins.eval", "#evil.ext", "torch.ops.aten"],
)
def test_node_targets_must_be_operators(plain_pt2: Path, tmp_path: Path, target: str) -> None:
    marker = tmp_path / "marker"
    edit = _target_payload(marker)

    def retarget(program: dict[str, Any]) -> None:
        edit(program)
        graph_nodes(program)[-1]["target"] = target

    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", retarget)
    with pytest.raises(ArtifactError, match="as an operator, which is not one in torch.ops"):
        load_program(evil)
    assert not marker.exists()


def test_an_operator_argument_must_be_an_operator(plain_pt2: Path, tmp_path: Path) -> None:
    def edit(program: dict[str, Any]) -> None:
        graph_nodes(program)[-1]["inputs"].append(
            {"name": "fn", "arg": {"as_operator": "torch.load"}, "kind": 1}
        )

    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", edit)
    with pytest.raises(ArtifactError, match="'torch.load' as an operator"):
        load_program(evil)


# --- tree specs --------------------------------------------------------------------------------


def _spec_with_context(program: dict[str, Any], type_: str, context: str) -> None:
    signature = program["graph_module"]["module_call_graph"][0]["signature"]
    signature["in_spec"] = (
        '[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": '
        f'"{type_}", "context": {context}, "children_spec": []}}]}}]'
    )


@pytest.fixture
def payload_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module on sys.path whose import writes a marker: what torch's enum hook would import."""
    marker = tmp_path / "imported"
    name = f"qnn_payload_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        f"import enum, pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
        "class E(enum.Enum):\n    A = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, marker


def test_a_tree_spec_enum_imports_a_module_in_torch(
    plain_pt2: Path, tmp_path: Path, payload_module: tuple[str, Path]
) -> None:
    name, marker = payload_module
    enum = f'{{"__enum__": true, "fqn": "{name}:E", "name": "A"}}'
    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2", lambda p: _spec_with_context(
        p, "builtins.dict", _json_string(f"[{enum}]")))
    with contextlib.suppress(Exception):
        torch.export.load(evil)
    assert marker.exists(), "torch's tree spec loader no longer imports enums: revisit"


@pytest.mark.parametrize("kind", ["enum", "defaultdict"])
def test_tree_specs_that_import_are_refused(
    plain_pt2: Path, tmp_path: Path, payload_module: tuple[str, Path], kind: str
) -> None:
    name, marker = payload_module
    if kind == "enum":
        enum = f'{{"__enum__": true, "fqn": "{name}:E", "name": "A"}}'
        type_, context, match = "builtins.dict", _json_string(f"[{enum}]"), "enum"
    else:
        context = _json_string(
            f'{{"default_factory_module": "{name}", "default_factory_name": "E", '
            '"dict_context": []}'
        )
        type_, match = "collections.defaultdict", "collections.defaultdict"
    evil = with_program_json(plain_pt2, tmp_path / "evil.pt2",
                             lambda p: _spec_with_context(p, type_, context))
    with pytest.raises(ArtifactError, match=match):
        load_program(evil)
    assert not marker.exists()


def _json_string(text: str) -> str:
    import json

    return json.dumps(text)


# --- what torch.export.save writes still loads -------------------------------------------------


def test_a_dynamic_program_with_symbolic_sizes_loads_and_runs(tmp_path: Path) -> None:
    class Halve(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return x[1:] * 2, {"zeros": torch.zeros(x.shape[0] // 2)}

    dim = torch.export.Dim("b", min=4, max=64)
    path = tmp_path / "dynamic.pt2"
    torch.export.save(
        torch.export.export(Halve(), (torch.randn(8, 3),), dynamic_shapes=({0: dim},)), path
    )
    program = load_program(path)
    out, rest = program.module()(torch.ones(10, 3))
    assert out.shape == (9, 3) and rest["zeros"].shape == (5,)


def test_a_program_with_aten_bitwise_operators_loads_and_runs(tmp_path: Path) -> None:
    """aten's bitwise operators have dunder names (`torch.ops.aten.__and__.Tensor`: Gemma 2's
    sliding-window mask exports one); they are operators, not attributes, and load. Other dunder
    names stay refused (`torch.ops.aten.__class__` above)."""

    class Masks(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return (a > 0).__and__(b > 0) | ((a < 0) ^ (b < 0))

    path = tmp_path / "bitwise.pt2"
    torch.export.save(torch.export.export(Masks(), (torch.randn(4), torch.randn(4))), path)
    targets = {str(n.target) for n in torch.export.load(path).graph.nodes
               if n.op == "call_function"}
    assert any("__and__" in t for t in targets)  # the program holds the dunder operator
    program = load_program(path)
    a, b = torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.tensor([1.0, 1.0, -1.0, -1.0])
    assert program.module()(a, b).tolist() == [True, True, True, False]
