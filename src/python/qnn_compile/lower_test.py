"""Tests of qnn_compile.lower on tiny real models: float and PT2E 8a8w, xnnpack and portable.

Programs go through torch.export.save / torch.export.load first, as they do between stages, and
the lowered bytes are executed through executorch.runtime and compared with eager PyTorch.
"""

from __future__ import annotations

import functools
import hashlib
import zipfile
from pathlib import Path

import pytest
import torch

from qnn_common.config import CompileConfig
from qnn_common.errors import StageError
from qnn_common.recipes import Backend, Recipe
from qnn_compile.backends import lowering_for
from qnn_compile.lower import LoweredProgram, lower_program
from qnn_compile.op_counts import op_name


def _lower(
    ep: torch.export.ExportedProgram,
    backend: Backend,
    recipe: Recipe = Recipe.FP32,
    etrecord_path: Path | None = None,
) -> LoweredProgram:
    lowering = lowering_for(CompileConfig(backend=backend, recipe=recipe))
    return lower_program(ep, lowering, etrecord_path=etrecord_path)


class TinyConvNet(torch.nn.Module):
    """conv -> relu -> global mean -> linear: one op XNNPACK leaves out (mean.dim) on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        out: torch.Tensor = self.fc(y.mean(dim=(2, 3)))
        return out


def _example() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)


@functools.cache
def _model() -> TinyConvNet:
    torch.manual_seed(0)
    return TinyConvNet().eval()


@functools.cache
def _quantized_module() -> torch.fx.GraphModule:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    captured = torch.export.export(_model(), _example(), strict=False).module()
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    prepared = prepare_pt2e(captured, quantizer)
    gen = torch.Generator().manual_seed(2)
    for _ in range(8):
        prepared(torch.randn(1, 3, 8, 8, generator=gen))
    converted: torch.fx.GraphModule = convert_pt2e(prepared)
    return converted


def _reference(recipe: Recipe) -> torch.Tensor:
    """fp32 eager for fp32; the converted (fake-quant) model for 8a8w: what a backend should hit."""
    with torch.no_grad():
        if recipe is Recipe.FP32:
            out: torch.Tensor = _model()(*_example())
        else:
            out = _quantized_module()(*_example())
    return out


@pytest.fixture(scope="module")
def pt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pt2")


def _exported(recipe: Recipe, pt2_dir: Path) -> torch.export.ExportedProgram:
    """Export, save to .pt2 and load it back: lower_program must take anybody's .pt2."""
    module = _model() if recipe is Recipe.FP32 else _quantized_module()
    ep = torch.export.export(module, _example(), strict=False)
    path = pt2_dir / f"{recipe.value}.pt2"
    torch.export.save(ep, path)
    return torch.export.load(path)


class _LazyLowered(dict[tuple[Recipe, Backend], LoweredProgram]):
    """Lowers each (recipe, backend) on first use: only the cases a test run selects pay."""

    def __init__(self, pt2_dir: Path) -> None:
        super().__init__()
        self._pt2_dir = pt2_dir

    def __missing__(self, key: tuple[Recipe, Backend]) -> LoweredProgram:
        recipe, backend = key
        value = _lower(_exported(recipe, self._pt2_dir), backend, recipe)
        self[key] = value
        return value


@pytest.fixture(scope="module")
def lowered(pt2_dir: Path) -> _LazyLowered:
    return _LazyLowered(pt2_dir)


def _execute(pte: bytes) -> torch.Tensor:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)
    out: torch.Tensor = program.load_method("forward").execute(_example())[0]
    return out


def _sqnr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    noise = (ref.double() - x.double()).pow(2).sum()
    if noise == 0:
        return float("inf")
    return float(10 * torch.log10(ref.double().pow(2).sum() / noise))


CASES = [
    (Recipe.FP32, Backend.XNNPACK),
    (Recipe.FP32, Backend.PORTABLE),
    (Recipe.A8W8, Backend.XNNPACK),
    (Recipe.A8W8, Backend.PORTABLE),
]


@pytest.mark.parametrize(("recipe", "backend"), CASES)
def test_lowered_program_runs_and_matches_eager(
    lowered: _LazyLowered, recipe: Recipe, backend: Backend
) -> None:
    program = lowered[recipe, backend]
    assert program.backend is backend
    assert program.pte[4:8] == b"ET12"
    sqnr = _sqnr_db(_reference(recipe), _execute(program.pte))
    # Measured: fp32 ~140 dB on both; 8a8w bit-exact with fake-quant on both for this one-output
    # net (XNNPACK's integer kernels can differ by a rounding step elsewhere: ~40 dB).
    assert sqnr > (60.0 if recipe is Recipe.FP32 else 40.0), f"{recipe}/{backend}: {sqnr:.1f} dB"


def test_the_pte_streams_to_its_file_as_the_same_bytes(
    lowered: _LazyLowered, tmp_path: Path
) -> None:
    """`write_pte` writes ExecuTorch's pieces one by one (never joined: at a model's size that
    join is the compile's peak); the file holds the joined bytes, and says their size and hash."""
    program = lowered[Recipe.A8W8, Backend.XNNPACK]
    written = program.write_pte(tmp_path / "model.pte")
    data = (tmp_path / "model.pte").read_bytes()
    assert data == program.pte
    assert written.size == len(data) and written.sha256 == hashlib.sha256(data).hexdigest()
    assert [p.name for p in tmp_path.iterdir()] == ["model.pte"]  # no temp file left


@pytest.mark.parametrize("recipe", [Recipe.FP32, Recipe.A8W8])
def test_xnnpack_delegates_conv_and_linear(lowered: _LazyLowered, recipe: Recipe) -> None:
    program = lowered[recipe, Backend.XNNPACK]
    assert program.delegated_ops > 0
    assert program.partitions >= 1
    # XNNPACK takes conv/relu/linear (and, quantized, their q/dq); mean.dim stays outside.
    assert program.op_counts == {"aten.mean.dim": 1}
    assert program.non_delegated_ops == sum(program.op_counts.values())


@pytest.mark.parametrize("recipe", [Recipe.FP32, Recipe.A8W8])
def test_portable_delegates_nothing(lowered: _LazyLowered, recipe: Recipe) -> None:
    program = lowered[recipe, Backend.PORTABLE]
    assert program.delegated_ops == 0
    assert program.partitions == 0
    assert program.op_counts["aten.convolution.default"] == 1
    assert program.non_delegated_ops == sum(program.op_counts.values())
    quant_ops = {k: v for k, v in program.op_counts.items() if k.startswith("quantized_decomposed")}
    assert bool(quant_ops) == recipe.is_quantized


def test_quantized_xnnpack_delegates_more_nodes_than_fp32(
    lowered: _LazyLowered,
) -> None:
    # The q/dq nodes around conv and linear travel into the delegate with them.
    fp32 = lowered[Recipe.FP32, Backend.XNNPACK]
    a8w8 = lowered[Recipe.A8W8, Backend.XNNPACK]
    assert a8w8.delegated_ops > fp32.delegated_ops


def test_lowering_leaves_the_input_program_unchanged(pt2_dir: Path) -> None:
    ep = _exported(Recipe.FP32, pt2_dir)
    before = [str(n.target) for n in ep.graph.nodes]
    first = _lower(ep, Backend.PORTABLE)
    assert [str(n.target) for n in ep.graph.nodes] == before
    assert _lower(ep, Backend.PORTABLE).op_counts == first.op_counts


def test_etrecord_is_written(pt2_dir: Path, tmp_path: Path) -> None:
    from executorch.devtools.etrecord import parse_etrecord

    path = tmp_path / "sub" / "etrecord.bin"
    program = _lower(_exported(Recipe.FP32, pt2_dir), Backend.XNNPACK, etrecord_path=path)
    assert program.delegated_ops > 0
    assert zipfile.is_zipfile(path)
    record = parse_etrecord(str(path))
    assert record.edge_dialect_program is not None
    assert record._debug_handle_map  # what Inspector needs to map ETDump events to ops
    assert not list(path.parent.glob(".*.tmp"))


@torch.library.custom_op("qnn_lower_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _twice_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _UsesCustomOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.qnn_lower_test.twice(torch.relu(x))
        return out


class _UsesNonCoreOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.lgamma(x)


@pytest.mark.parametrize("backend", [Backend.PORTABLE, Backend.XNNPACK])
@pytest.mark.parametrize(
    ("module", "op", "when"),
    [
        # Not in the Core ATen opset and not decomposed: the edge verifier rejects it.
        (_UsesNonCoreOp(), "aten.lgamma.default", "lowering"),
        # A custom op with no out variant: serialization to ExecuTorch cannot place it.
        (_UsesCustomOp(), "qnn_lower_test.twice", "serializing"),
    ],
    ids=["non_core_aten", "custom_op_without_out_variant"],
)
def test_lowering_failure_names_the_op(
    backend: Backend, module: torch.nn.Module, op: str, when: str
) -> None:
    ep = torch.export.export(module, (torch.rand(2, 3),), strict=False)
    with pytest.raises(StageError) as info:
        _lower(ep, backend)
    err = info.value
    assert err.stage == "compile"
    assert f"{when} " in str(err)
    assert f"at operator {op}:" in str(err)
    assert isinstance(err.__cause__, Exception)


def test_op_name() -> None:
    assert op_name(torch.ops.aten.mean.dim) == "aten.mean.dim"
    assert op_name(torch.ops.aten.relu.default) == "aten.relu.default"
    from executorch.exir.dialects._ops import ops as exir_ops

    assert op_name(exir_ops.edge.aten.convolution.default) == "aten.convolution.default"
    assert op_name(len) == "len"
