"""Tests of qnn_infer.runner with real .pte files lowered from tiny models.

Nothing is mocked: programs are lowered with ExecuTorch's own calls (a stage never imports
another stage, not even in tests) and executed by executorch.runtime.
The device tests can only reach the error paths (no phone here); one of them puts a scripted
`adb` on PATH that prints what real adb prints, to exercise the `adb devices` handling.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from qnn_common.errors import (
    ArtifactError,
    BackendNotAvailableError,
    ConfigValidationError,
    InputError,
    PipelineError,
)
from qnn_common.recipes import Backend, Recipe
from qnn_infer.device import DeviceRunner
from qnn_infer.measure import compare_outputs, measure_latency
from qnn_infer.runner import HostRunner, Runner, TensorSpec


class TinyNet(torch.nn.Module):
    """conv -> relu -> global mean -> linear, two outputs to check output order."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(pooled), pooled


SHAPE = (1, 3, 8, 8)


def _inputs(seed: int = 1) -> tuple[torch.Tensor, ...]:
    return (torch.randn(*SHAPE, generator=torch.Generator().manual_seed(seed)),)


@functools.cache
def _model() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet().eval()


@functools.cache
def _quantized() -> torch.fx.GraphModule:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    captured = torch.export.export(_model(), _inputs(), strict=False).module()
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    prepared = prepare_pt2e(captured, quantizer)
    for seed in range(8):
        prepared(*_inputs(100 + seed))
    converted: torch.fx.GraphModule = convert_pt2e(prepared)
    return converted


def _eager(recipe: Recipe, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    module = _model() if recipe is Recipe.FP32 else _quantized()
    with torch.no_grad():
        return tuple(module(*inputs))


class _Ptes(dict[tuple[Recipe, Backend], Path]):
    """.pte files lowered on first use, so a filtered test run lowers only what it needs."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self._root = root

    def __missing__(self, key: tuple[Recipe, Backend]) -> Path:
        recipe, backend = key
        module = _model() if recipe is Recipe.FP32 else _quantized()
        ep = torch.export.export(module, _inputs(), strict=False)
        path = self._root / f"{recipe.value}_{backend.value}.pte"
        path.write_bytes(_to_pte(ep, backend))
        self[key] = path
        return path


def _to_pte(ep: torch.export.ExportedProgram, backend: Backend) -> bytes:
    """The plain ExecuTorch lowering calls (what qnn_compile wraps)."""
    importlib.import_module("executorch.kernels.quantized")  # imported for its side effect
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    partitioners = [XnnpackPartitioner()] if backend is Backend.XNNPACK else []
    edge = to_edge_transform_and_lower(ep, partitioner=partitioners)
    return bytes(edge.to_executorch().buffer)


@pytest.fixture(scope="module")
def ptes(tmp_path_factory: pytest.TempPathFactory) -> _Ptes:
    return _Ptes(tmp_path_factory.mktemp("pte"))


@pytest.fixture(scope="module")
def fp32_pte(ptes: _Ptes) -> Path:
    return ptes[Recipe.FP32, Backend.XNNPACK]


# --- execution ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recipe", "backend", "min_sqnr_db", "max_abs"),
    [
        # References: fp32 eager for fp32, the converted (fake-quant) model for 8a8w. Measured
        # here: fp32 138-147 dB on both backends; 8a8w portable is bit-exact with fake-quant
        # (its q/dq kernels compute what the eager reference computes), 8a8w xnnpack 38-43 dB
        # (integer kernels round differently) with max abs error up to ~8e-3.
        (Recipe.FP32, Backend.XNNPACK, 60.0, 1e-5),
        (Recipe.FP32, Backend.PORTABLE, 60.0, 1e-5),
        (Recipe.A8W8, Backend.XNNPACK, 30.0, 5e-2),
        (Recipe.A8W8, Backend.PORTABLE, 60.0, 1e-5),
    ],
)
def test_host_runner_matches_eager(
    ptes: _Ptes, recipe: Recipe, backend: Backend, min_sqnr_db: float, max_abs: float
) -> None:
    runner = HostRunner(ptes[recipe, backend])
    for seed in (1, 2):
        inputs = _inputs(seed)
        stats = compare_outputs(_eager(recipe, inputs), runner.run(inputs))
        assert len(stats) == 2
        for s in stats:
            assert s["sqnr_db"] > min_sqnr_db, stats
            assert s["cosine"] > 0.999, stats
            assert s["max_abs_error"] < max_abs, stats


def test_quantized_program_is_close_to_fp32(ptes: _Ptes) -> None:
    inputs = _inputs(3)
    out = HostRunner(ptes[Recipe.A8W8, Backend.XNNPACK]).run(inputs)
    stats = compare_outputs(_eager(Recipe.FP32, inputs), out)
    # 8-bit quantization of a tiny net: measured 30-40 dB against fp32.
    assert all(s["sqnr_db"] > 20.0 for s in stats), stats


def test_outputs_are_not_overwritten_by_the_next_run(fp32_pte: Path) -> None:
    runner = HostRunner(fp32_pte)
    first = runner.run(_inputs(1))
    kept = [t.clone() for t in first]
    runner.run(_inputs(2))
    assert all(torch.equal(a, b) for a, b in zip(first, kept, strict=True))


def test_specs_come_from_method_metadata(fp32_pte: Path) -> None:
    runner = HostRunner(fp32_pte)
    assert runner.input_specs == (TensorSpec(SHAPE, torch.float32),)
    assert runner.output_specs == (
        TensorSpec((1, 4), torch.float32),
        TensorSpec((1, 8), torch.float32),
    )
    assert runner.name == f"host:{fp32_pte.name}"


def test_host_runner_satisfies_runner_protocol(fp32_pte: Path) -> None:
    runner: Runner = HostRunner(fp32_pte)
    assert len(runner.run(_inputs())) == 2


# --- bad files ---------------------------------------------------------------------------------


def _bad_file(kind: str, good: Path, tmp_path: Path) -> Path:
    data = good.read_bytes()
    path = tmp_path / f"{kind}.pte"
    if kind == "first_half":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random":
        gen = torch.Generator().manual_seed(7)
        path.write_bytes(
            torch.randint(0, 256, (4096,), generator=gen, dtype=torch.uint8).numpy().tobytes()
        )
    elif kind == "text":
        path.write_text("this is not a model\n" * 20)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "corrupt_flatbuffer":
        # Damage the program tables after the header; the verifier must catch it.
        body = bytearray(data)
        for i in range(200, 600, 7):
            body[i] ^= 0xFF
        path.write_bytes(bytes(body))
    elif kind == "missing":
        pass
    else:
        raise AssertionError(kind)
    return path


@pytest.mark.parametrize(
    "kind", ["first_half", "random", "text", "empty", "corrupt_flatbuffer", "missing"]
)
def test_bad_pte_raises_artifact_error(fp32_pte: Path, tmp_path: Path, kind: str) -> None:
    # "random" once killed the interpreter (the runtime's log bridge aborts on non-UTF-8 bytes);
    # getting an exception here at all is the point.
    path = _bad_file(kind, fp32_pte, tmp_path)
    with pytest.raises(ArtifactError) as info:
        HostRunner(path)
    assert info.value.path == path


def test_truncated_pte_error_says_truncated(fp32_pte: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="truncated"):
        HostRunner(_bad_file("first_half", fp32_pte, tmp_path))


def test_unknown_method_is_an_artifact_error(fp32_pte: Path) -> None:
    with pytest.raises(ArtifactError, match="has no method 'decode'.*forward"):
        HostRunner(fp32_pte, method="decode")


# --- bad inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "field", "fragment"),
    [
        ((), "inputs", "expected 1 input(s), got 0"),
        ((torch.randn(*SHAPE), torch.randn(*SHAPE)), "inputs", "expected 1 input(s), got 2"),
        ((torch.randn(1, 3, 9, 9),), "inputs[0]", "float32[1, 3, 8, 8], got float32[1, 3, 9, 9]"),
        ((torch.randn(*SHAPE).double(),), "inputs[0]", "float32[1, 3, 8, 8], got float64"),
        ((torch.randn(3, 8, 8),), "inputs[0]", "got float32[3, 8, 8]"),
        # Within the bound, but the program's shape is static: the runtime refuses it.
        ((torch.randn(1, 3, 4, 4),), "inputs", "takes (float32[1, 3, 8, 8])"),
    ],
    ids=["none", "two", "larger", "dtype", "rank", "smaller_static"],
)
def test_wrong_inputs_name_expected_and_got(
    fp32_pte: Path, inputs: tuple[torch.Tensor, ...], field: str, fragment: str
) -> None:
    runner = HostRunner(fp32_pte)
    with pytest.raises(InputError) as info:
        runner.run(inputs)
    assert info.value.field == field
    assert fragment in str(info.value)
    # The runner stays usable after a rejected call.
    assert len(runner.run(_inputs())) == 2


def test_example_inputs_are_checked_at_construction(fp32_pte: Path) -> None:
    assert HostRunner(fp32_pte, example_inputs=_inputs()).input_specs[0] is not None
    with pytest.raises(InputError, match=r"expected dtype float32\[1, 3, 8, 8\]"):
        HostRunner(fp32_pte, example_inputs=(torch.zeros(*SHAPE, dtype=torch.int64),))


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x).relu()
        return out


def test_dynamic_batch_takes_smaller_and_rejects_larger(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Linear().eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    ep = torch.export.export(
        model, (torch.randn(2, 4),), dynamic_shapes=({0: batch},), strict=False
    )
    path = tmp_path / "dynamic.pte"
    path.write_bytes(_to_pte(ep, Backend.PORTABLE))
    runner = HostRunner(path)
    assert runner.input_specs == (TensorSpec((8, 4), torch.float32),)  # the upper bound
    x = torch.randn(3, 4)
    (out,) = runner.run((x,))
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    with pytest.raises(InputError, match=r"got float32\[9, 4\]"):
        runner.run((torch.randn(9, 4),))


# --- in-place updates ----------------------------------------------------------------------------


class _UpdatesInputs(torch.nn.Module):
    """Updates a buffer and its first input in place (add_, then rows by index_put_) and returns
    a nested structure: the runtime returns the updated input too, as a leading output."""

    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(
        self, x: torch.Tensor, rows: torch.Tensor
    ) -> dict[str, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        self.count.add_(1)
        x.add_(1)
        x.index_put_((rows,), torch.full((2, 3), 5.0))
        # The buffer stays out of the outputs: ExecuTorch does not serialize a mutated buffer's
        # initial value, so anything computed from it is arbitrary.
        return {"a": x * 2, "b": (x.sum(), x + 1)}


@pytest.mark.parametrize("backend", [Backend.XNNPACK, Backend.PORTABLE])
def test_updated_inputs_are_not_returned(tmp_path: Path, backend: Backend) -> None:
    x, rows = torch.arange(12.0).reshape(4, 3), torch.tensor([0, 2])
    ep = torch.export.export(_UpdatesInputs(), (x.clone(), rows), strict=False)
    path = tmp_path / "inplace.pte"
    path.write_bytes(_to_pte(ep, backend))
    runner = HostRunner(path)
    # 4 program outputs: the updated x, then the three user outputs.
    assert len(runner.program_output_specs) == 4
    assert runner.user_output_indices == (1, 2, 3)
    got = runner.run((x.clone(), rows))
    expected = torch.utils._pytree.tree_leaves(_UpdatesInputs()(x.clone(), rows))
    assert len(got) == 3
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
    # A caller that knows better (e.g. from the graph signature) can pick the outputs itself.
    (updated,) = HostRunner(path, user_output_indices=[0]).run((x.clone(), rows))
    torch.testing.assert_close(updated, expected[0] / 2)
    with pytest.raises(ConfigValidationError, match=r"has 4 output\(s\)"):
        HostRunner(path, user_output_indices=[4])


# --- missing kernels ----------------------------------------------------------------------------


class _Sorts(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=-1).values


def test_missing_kernel_is_named(tmp_path: Path) -> None:
    # aten.sort is Core ATen, so it lowers and serializes, but the pip runtime of executorch
    # 1.5.1 registers no sort kernel: loading the method fails.
    ep = torch.export.export(_Sorts(), (torch.randn(2, 3),), strict=False)
    path = tmp_path / "sort.pte"
    path.write_bytes(_to_pte(ep, Backend.PORTABLE))
    with pytest.raises(BackendNotAvailableError, match=r"without a kernel: aten::sort\.values"):
        HostRunner(path)


# --- ETDump -------------------------------------------------------------------------------------


def test_etdump_is_written_and_readable(fp32_pte: Path, tmp_path: Path) -> None:
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    etdump = tmp_path / "out" / "etdump.etdp"
    runner = HostRunner(fp32_pte, etdump_path=etdump)
    runner.run(_inputs())
    runner.run(_inputs(2))
    assert runner.write_etdump() == [etdump]
    parsed = deserialize_from_etdump_flatcc(etdump.read_bytes())
    names = {
        event.profile_event.name
        for run in parsed.run_data
        for event in (run.events or [])
        if event.profile_event is not None
    }
    assert "Method::execute" in names
    assert "DELEGATE_CALL" in names
    assert sorted(p.name for p in etdump.parent.iterdir()) == ["etdump.etdp"]


def test_etdump_debug_buffer_is_written_beside_it(fp32_pte: Path, tmp_path: Path) -> None:
    etdump = tmp_path / "etdump.etdp"
    runner = HostRunner(fp32_pte, etdump_path=etdump, debug_buffer_size=1 << 20)
    runner.run(_inputs())
    written = runner.write_etdump()
    assert written == [etdump, tmp_path / "etdump.etdp.debug"]
    assert all(p.stat().st_size > 0 for p in written)


def test_write_etdump_to_another_path(fp32_pte: Path, tmp_path: Path) -> None:
    runner = HostRunner(fp32_pte, etdump_path=tmp_path / "default.etdp")
    runner.run(_inputs())
    other = tmp_path / "artifact" / "etdump.etdp"
    assert runner.write_etdump(other) == [other]
    assert other.stat().st_size > 0
    assert not (tmp_path / "default.etdp").exists()


def test_write_etdump_needs_tracing_enabled(fp32_pte: Path) -> None:
    with pytest.raises(PipelineError, match="etdump_path"):
        HostRunner(fp32_pte).write_etdump()


# --- latency and comparison ----------------------------------------------------------------------


def test_measure_latency(fp32_pte: Path) -> None:
    stats = measure_latency(HostRunner(fp32_pte), _inputs(), warmup=2, runs=15)
    assert set(stats) == {"p50_ms", "p90_ms", "mean_ms", "min_ms"}
    assert 0 < stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"]
    assert stats["min_ms"] <= stats["mean_ms"]


@pytest.mark.parametrize(("warmup", "runs"), [(-1, 5), (0, 0)])
def test_measure_latency_rejects_bad_counts(fp32_pte: Path, warmup: int, runs: int) -> None:
    with pytest.raises(ConfigValidationError):
        measure_latency(HostRunner(fp32_pte), _inputs(), warmup=warmup, runs=runs)


def test_compare_outputs_values() -> None:
    ref = torch.tensor([1.0, 2.0, 3.0])
    (same,) = compare_outputs([ref], [ref.clone()])
    assert same == {"sqnr_db": math.inf, "cosine": 1.0, "max_abs_error": 0.0}
    (off,) = compare_outputs([ref], [ref + 0.5])
    assert off["max_abs_error"] == pytest.approx(0.5)
    assert off["sqnr_db"] == pytest.approx(10 * math.log10(14 / 0.75))
    (half,) = compare_outputs([ref.half()], [ref.half()])
    assert half["sqnr_db"] == math.inf


def test_compare_outputs_rejects_mismatches() -> None:
    with pytest.raises(ConfigValidationError, match="1 output"):
        compare_outputs([torch.zeros(2), torch.zeros(2)], [torch.zeros(2)])
    with pytest.raises(ConfigValidationError, match=r"float32\[2\]"):
        compare_outputs([torch.zeros(2)], [torch.zeros(3)])


# --- Android device (error paths only: there is no phone here) ----------------------------------


def test_device_runner_without_adb_says_what_is_missing(
    fp32_pte: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no adb anywhere
    with pytest.raises(BackendNotAvailableError) as info:
        DeviceRunner(fp32_pte, runner_binary=None)
    message = str(info.value)
    assert "adb binary" in message
    assert "not on PATH" in message
    assert "executor runner built for Android" in message


def test_device_runner_rejects_a_host_binary(fp32_pte: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendNotAvailableError, match="not aarch64") as info:
        DeviceRunner(fp32_pte, runner_binary=Path(sys.executable), adb=str(tmp_path / "no-adb"))
    assert "adb binary" in str(info.value)


def _scripted_adb(tmp_path: Path, devices_output: str) -> Path:
    adb = tmp_path / "adb"
    adb.write_text(f"#!/bin/sh\nprintf '{devices_output}'\n")
    adb.chmod(adb.stat().st_mode | stat.S_IXUSR)
    return adb


def _arm64_elf(tmp_path: Path) -> Path:
    # Just an ELF header for aarch64 (e_machine 183): all the constructor inspects.
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4] = 2  # 64-bit
    header[5] = 1  # little-endian
    header[18:20] = (183).to_bytes(2, "little")
    path = tmp_path / "qnn_executor_runner"
    path.write_bytes(bytes(header))
    return path


@pytest.mark.parametrize(
    ("devices_output", "fragment"),
    [
        ("List of devices attached\\n\\n", "lists none"),
        ("List of devices attached\\nR58M123\\tunauthorized\\n\\n", "R58M123 is unauthorized"),
    ],
    ids=["no_device", "unauthorized"],
)
def test_device_runner_reports_device_state(
    fp32_pte: Path, tmp_path: Path, devices_output: str, fragment: str
) -> None:
    adb = _scripted_adb(tmp_path, devices_output)
    with pytest.raises(BackendNotAvailableError, match=fragment) as info:
        DeviceRunner(fp32_pte, runner_binary=_arm64_elf(tmp_path), adb=str(adb))
    assert "adb binary" not in str(info.value)
    assert "executor runner" not in str(info.value)
    assert os.access(adb, os.X_OK)


def _logging_adb(tmp_path: Path, log: Path) -> Path:
    """An adb stand-in: one device, records every call, and 'pulls' zero-filled outputs."""
    adb = tmp_path / "adb"
    adb.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'case "$1" in devices) printf "List of devices attached\\nR58M123\\tdevice\\n\\n";;\n'
        "esac\n"
        'if [ "$3" = pull ]; then\n'
        '  case "$4" in *output_0_0.raw) n=16;; *) n=32;; esac\n'  # TinyNet: (1,4), (1,8) f32
        '  head -c $n /dev/zero > "$5"\n'
        "fi\n"
    )
    adb.chmod(adb.stat().st_mode | stat.S_IXUSR)
    return adb


def test_device_runner_commands(fp32_pte: Path, tmp_path: Path) -> None:
    log = tmp_path / "adb.log"
    lib = tmp_path / "libQnnHtp.so"
    lib.write_bytes(b"\0")
    runner = DeviceRunner(fp32_pte, runner_binary=_arm64_elf(tmp_path),
                          adb=str(_logging_adb(tmp_path, log)), device_libs=[lib])
    assert runner.name == "device:R58M123"
    outputs = runner.run(_inputs())
    assert [tuple(o.shape) for o in outputs] == [(1, 4), (1, 8)]
    calls = log.read_text().splitlines()
    d = "/data/local/tmp/qnn_pipeline"
    assert calls[0] == "devices"
    assert f"-s R58M123 push {fp32_pte} {d}/model.pte" in calls
    assert f"-s R58M123 push {lib} {d}/libQnnHtp.so" in calls
    assert f"-s R58M123 shell chmod 755 {d}/qnn_executor_runner" in calls
    (run,) = (c for c in calls if "--model_path" in c)
    assert f"LD_LIBRARY_PATH={d} ADSP_LIBRARY_PATH={d}" in run
    assert "./qnn_executor_runner --model_path model.pte --input_list_path input_list.txt " \
        "--output_folder_path outputs" in run
    assert calls[-2:] == [
        f"-s R58M123 pull {d}/outputs/output_0_0.raw {tmp_path}/output_0_0.raw".replace(
            f"{tmp_path}/", calls[-2].split()[-1].rsplit("/", 1)[0] + "/"
        ),
        calls[-1],
    ]
