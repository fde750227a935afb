"""Run ExecuTorch programs (.pte) and judge their outputs.

`HostRunner` executes in-process through `executorch.runtime` (XNNPACK, portable and, with the
QNN libraries on the library path, QNN delegates). `DeviceRunner` executes on an Android device
over adb with an executor runner built for Android. Both satisfy `Runner`, so latency and
accuracy code does not care where a program runs.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from qnn_common import metrics
from qnn_common.config import Stage
from qnn_common.errors import (
    ArtifactError,
    BackendNotAvailableError,
    ConfigValidationError,
    PipelineError,
    StageError,
)

_STAGE = Stage.INFER

# ExecuTorch's ScalarType codes (the same numbering as c10::ScalarType), as MethodMeta reports them.
_SCALAR_TYPES: dict[int, torch.dtype] = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    11: torch.bool,
    15: torch.bfloat16,
}

# A .pte is a flatbuffer: 4 bytes root offset, then the file identifier "ET" + 2-digit version.
_PTE_IDENTIFIER = re.compile(rb"ET\d\d")
# Optional extended header right after the identifier: magic, length, then uint64 fields.
_EXT_HEADER_MAGIC = b"eh00"
_HEAD_BYTES = 64


class Runner(Protocol):
    """Something that executes one compiled program on a tuple of input tensors."""

    name: str

    def run(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Execute once and return the outputs, in the program's output order."""
        ...


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one program input or output, as the .pte's method metadata records it.

    For a dynamic dimension, `shape` holds its upper bound (the size memory planning used).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype

    def describe(self) -> str:
        return _describe(self.dtype, self.shape)


def _describe(dtype: torch.dtype, shape: Sequence[int]) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


# --- host -------------------------------------------------------------------------------------


class HostRunner:
    """Execute a .pte in this process through `executorch.runtime`.

    Inputs are checked against the method's metadata before execution, so a wrong count, dtype
    or shape is reported as a `ConfigValidationError` naming expected and got instead of a bare
    runtime status code. `example_inputs`, if given, are checked the same way at construction,
    so a caller learns before any run that its data cannot fit the program.

    With `etdump_path`, event tracing is enabled: every `run` (warmup runs of `measure_latency`
    included) records per-op and per-delegate timings, and `write_etdump` writes them there.
    `debug_buffer_size` > 0 also captures intermediate outputs, written by `write_etdump` beside
    the ETDump as ``<etdump_path>.debug``.
    """

    def __init__(
        self,
        pte_path: Path,
        *,
        method: str = "forward",
        example_inputs: Sequence[torch.Tensor] | None = None,
        etdump_path: Path | None = None,
        debug_buffer_size: int = 0,
    ) -> None:
        self.pte_path = Path(pte_path)
        self.method_name = method
        self.name = f"host:{self.pte_path.name}"
        self.etdump_path = etdump_path
        if debug_buffer_size < 0:
            raise ConfigValidationError(
                "infer.debug_buffer_size", debug_buffer_size, "must be >= 0"
            )

        _check_pte_header(self.pte_path)
        # The kernels import registers the quantized_decomposed q/dq kernels with the runtime, so
        # that programs with q/dq ops outside a delegate (portable 8a8w, say) can load.
        importlib.import_module("executorch.kernels.quantized")  # imported for its side effect
        from executorch.runtime import Runtime

        self._runtime: Any = Runtime.get()
        try:
            self._program: Any = self._runtime.load_program(
                self.pte_path,
                enable_etdump=etdump_path is not None,
                debug_buffer_size=debug_buffer_size,
            )
        except RuntimeError as exc:
            raise ArtifactError(
                self.pte_path,
                f"the ExecuTorch runtime rejected it as truncated or corrupt ({exc})",
            ) from exc
        if etdump_path is not None and not self._has_etdump():
            raise BackendNotAvailableError(
                "ETDump was requested but this executorch runtime was built without event "
                "tracing (EXECUTORCH_ENABLE_EVENT_TRACER=ON); run without etdump_path"
            )

        methods = sorted(self._program.method_names)
        if method not in methods:
            raise ArtifactError(
                self.pte_path, f"has no method {method!r} (it has: {', '.join(methods)})"
            )
        meta = self._program.metadata(method)
        self.input_specs: tuple[TensorSpec | None, ...] = tuple(
            _tensor_spec(meta.input_tensor_meta, i) for i in range(meta.num_inputs())
        )
        self.output_specs: tuple[TensorSpec | None, ...] = tuple(
            _tensor_spec(meta.output_tensor_meta, i) for i in range(meta.num_outputs())
        )
        if example_inputs is not None:
            # Fail before the (possibly slow) method load when the caller's data cannot fit.
            self._check_inputs(tuple(example_inputs))
        try:
            self._method: Any = self._program.load_method(method)
        except RuntimeError as exc:
            raise self._explain_load_failure(exc) from exc

    def run(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Execute the method once on `inputs`.

        Raises:
            ConfigValidationError: the inputs do not match the program's (count, dtype, rank, or
                a dimension the program cannot take).
            StageError: the runtime failed while executing.
        """
        self._check_inputs(inputs)
        try:
            outputs = self._method.execute(inputs)
        except RuntimeError as exc:
            if "set_inputs" in str(exc):
                # Passed the checks above (which allow any size up to the planned one, as a
                # dynamic dimension would) but the dimension is static in the program.
                raise ConfigValidationError(
                    "inputs",
                    _describe_inputs(inputs),
                    f"the runtime refused them; {self._expected()} ({exc})",
                ) from exc
            raise StageError(
                _STAGE, f"executing {self.method_name} of {self.pte_path} failed: {exc}", exc
            ) from exc
        return tuple(_as_tensor(o, i) for i, o in enumerate(outputs))

    def write_etdump(self, path: Path | None = None) -> list[Path]:
        """Write the events recorded so far (and the debug buffer, if any); return the paths.

        `path` defaults to the constructor's `etdump_path`. Tracing itself must have been enabled
        by passing `etdump_path` to the constructor: the runtime decides at load time.

        Raises:
            PipelineError: event tracing was not enabled (no `etdump_path` given).
        """
        if self.etdump_path is None:
            raise PipelineError(
                "write_etdump needs event tracing, which is enabled when the program is loaded: "
                "create the HostRunner with etdump_path"
            )
        target = Path(path) if path is not None else self.etdump_path
        debug_path = target.with_name(target.name + ".debug")
        target.parent.mkdir(parents=True, exist_ok=True)
        # Written into a scratch directory beside the target and renamed into place, so a reader
        # never sees a partial file; the runtime writes the debug file only if it has a buffer.
        with tempfile.TemporaryDirectory(prefix=".etdump.", dir=target.parent) as tmp:
            etdump_tmp = Path(tmp) / "etdump"
            debug_tmp = Path(tmp) / "debug"
            try:
                self._program.write_etdump_result_to_file(str(etdump_tmp), str(debug_tmp))
            except RuntimeError as exc:
                raise BackendNotAvailableError(
                    f"this executorch runtime recorded no ETDump ({exc}); it needs event "
                    "tracing compiled in (EXECUTORCH_ENABLE_EVENT_TRACER=ON)"
                ) from exc
            os.replace(etdump_tmp, target)
            written = [target]
            if debug_tmp.exists():
                os.replace(debug_tmp, debug_path)
                written.append(debug_path)
        return written

    # -- internals --

    def _has_etdump(self) -> bool:
        inner = getattr(self._program, "_program", None)
        has = getattr(inner, "has_etdump", None)
        # Without the probe (an older binding) assume tracing works; write_etdump reports if not.
        return bool(has()) if callable(has) else True

    def _expected(self) -> str:
        specs = ", ".join(s.describe() if s else "non-tensor" for s in self.input_specs)
        return f"{self.method_name} of {self.pte_path.name} takes ({specs})"

    def _check_inputs(self, inputs: tuple[torch.Tensor, ...]) -> None:
        if not isinstance(inputs, tuple | list):
            raise ConfigValidationError(
                "inputs", type(inputs).__name__, f"must be a tuple of tensors; {self._expected()}"
            )
        if len(inputs) != len(self.input_specs):
            raise ConfigValidationError(
                "inputs",
                _describe_inputs(inputs),
                f"expected {len(self.input_specs)} input(s), got {len(inputs)}; "
                + self._expected(),
            )
        for i, (tensor, spec) in enumerate(zip(inputs, self.input_specs, strict=True)):
            if spec is None:
                continue
            field = f"inputs[{i}]"
            if not isinstance(tensor, torch.Tensor):
                raise ConfigValidationError(
                    field, type(tensor).__name__, f"expected a tensor {spec.describe()}"
                )
            got = _describe(tensor.dtype, tensor.shape)
            if tensor.dtype != spec.dtype:
                raise ConfigValidationError(
                    field, got, f"expected dtype {spec.describe()}, got {got}"
                )
            if tensor.dim() != len(spec.shape) or any(
                d > bound for d, bound in zip(tensor.shape, spec.shape, strict=True)
            ):
                raise ConfigValidationError(
                    field, got, f"expected shape {spec.describe()}, got {got}"
                )

    def _explain_load_failure(self, exc: RuntimeError) -> PipelineError:
        """Name the kernels or backends this runtime lacks, if that is why loading failed."""
        missing_ops, missing_backends, backends = self._missing_kernels()
        if missing_ops or missing_backends:
            parts = []
            if missing_ops:
                parts.append(f"operators without a kernel: {', '.join(missing_ops)}")
            if missing_backends:
                parts.append(f"delegates of unregistered backends: {', '.join(missing_backends)}")
            return BackendNotAvailableError(
                f"{self.pte_path} needs what this executorch runtime lacks ({'; '.join(parts)}); "
                "lower it for a backend this runtime has, or use a runtime built with them"
            )
        if "QnnBackend" in backends:
            return BackendNotAvailableError(
                f"{self.pte_path} holds a QNN delegate and the QNN backend failed to start "
                f"({exc}); it needs the QNN libraries loaded first: qnn-infer does that, and "
                "library callers call qnn_infer.runtimes.prepare_runtime({Backend.QNN}) (the "
                "SDK from QNN_SDK_ROOT, or the project's x86 development SDK)"
            )
        return ArtifactError(self.pte_path, f"loading method {self.method_name!r} failed: {exc}")

    def _missing_kernels(self) -> tuple[list[str], list[str], set[str]]:
        try:
            from executorch.exir._serialize._program import deserialize_pte_binary

            program = deserialize_pte_binary(self.pte_path.read_bytes()).program
        except Exception:  # a diagnosis only: never mask the load failure being explained
            return [], [], set()
        registered_ops = set(self._runtime.operator_registry.operator_names)
        needed_ops: set[str] = set()
        backends: set[str] = set()
        for plan in program.execution_plan:
            if plan.name != self.method_name:
                continue
            for op in plan.operators:
                needed_ops.add(f"{op.name}.{op.overload}" if op.overload else op.name)
            backends.update(d.id for d in plan.delegates)
        missing_backends = sorted(
            b for b in backends if not self._runtime.backend_registry.is_available(b)
        )
        return sorted(needed_ops - registered_ops), missing_backends, backends


def _tensor_spec(getter: Any, index: int) -> TensorSpec | None:
    try:
        info = getter(index)
    except Exception:  # a non-tensor input or output (int, bool, ...) has no tensor metadata
        return None
    dtype = _SCALAR_TYPES.get(int(info.dtype()))
    if dtype is None:
        return None
    return TensorSpec(shape=tuple(int(d) for d in info.sizes()), dtype=dtype)


def _describe_inputs(inputs: Sequence[object]) -> str:
    parts = [
        _describe(t.dtype, t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        for t in inputs
    ]
    return f"({', '.join(parts)})"


def _as_tensor(value: object, index: int) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool | int | float):
        return torch.tensor(value)
    raise StageError(_STAGE, f"output {index} is a {type(value).__name__}, not a tensor")


def _check_pte_header(path: Path) -> None:
    """Reject files that are not (complete) ExecuTorch programs before the runtime sees them.

    Not just for a nicer message: the runtime logs the file identifier it found, and the Python
    log bridge of executorch 1.5.1 aborts the whole process (std::terminate on a
    UnicodeDecodeError) when those bytes are not UTF-8, as in a random file.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except FileNotFoundError:
        raise ArtifactError(path, "does not exist") from None
    except OSError as exc:
        raise ArtifactError(path, f"cannot be read: {exc}") from exc
    if size < 8:
        raise ArtifactError(path, f"is {size} bytes, too short to be an ExecuTorch program")
    identifier = head[4:8]
    if not _PTE_IDENTIFIER.fullmatch(identifier):
        raise ArtifactError(
            path,
            f"is not an ExecuTorch program: its file identifier is {identifier!r}, "
            "expected b'ET' and a 2-digit version",
        )
    if head[8:12] != _EXT_HEADER_MAGIC or len(head) < 40:
        return
    # Fields (little-endian): u32 header length, u64 program size (header included),
    # u64 segment base offset, and, if the header is longer than 24 bytes, u64 segment size.
    header_length = int.from_bytes(head[12:16], "little")
    program_size = int.from_bytes(head[16:24], "little")
    segment_base = int.from_bytes(head[24:32], "little")
    segment_size = int.from_bytes(head[32:40], "little") if header_length > 24 else 0
    expected = max(program_size, segment_base + segment_size if segment_base else 0)
    if expected > size:
        raise ArtifactError(
            path, f"is truncated: its header says {expected} bytes, the file has {size}"
        )


# --- Android device ----------------------------------------------------------------------------

# ELF e_machine of arm64; Android phones run aarch64 userspace.
_EM_AARCH64 = 183
_EM_NAMES = {3: "x86", 40: "arm", 62: "x86-64", 183: "aarch64"}


@dataclass(frozen=True)
class _AdbDevice:
    serial: str
    state: str


class DeviceRunner:
    """Execute a .pte on an Android device over adb with an executor runner built for Android.

    The runner binary must speak the qnn_executor_runner protocol of ExecuTorch's Qualcomm
    examples (``--model_path``, ``--input_list_path``, ``--output_folder_path``; raw input
    files; outputs written as ``output_<run>_<index>.raw``). `device_libs` are pushed beside it
    and put on LD_LIBRARY_PATH / ADSP_LIBRARY_PATH (e.g. the QNN HTP libraries and skels).

    Output dtypes and shapes come from the program's metadata, read on the host. Latency
    measured through `run` includes adb round trips; use the runner's own timing log for
    on-device latency.

    Raises (from the constructor):
        BackendNotAvailableError: naming each thing missing: the adb binary, a connected and
            authorized device, or the executor runner built for Android (arm64).
    """

    def __init__(
        self,
        pte_path: Path,
        *,
        runner_binary: Path | None,
        serial: str | None = None,
        adb: str = "adb",
        device_libs: Sequence[Path] = (),
        device_dir: str = "/data/local/tmp/qnn_pipeline",
        timeout_s: float = 300.0,
    ) -> None:
        self.pte_path = Path(pte_path)
        self.device_dir = device_dir
        self.timeout_s = timeout_s
        self._device_libs = tuple(Path(p) for p in device_libs)

        problems: list[str] = []
        runner_problem = _check_android_binary(runner_binary)
        if runner_problem:
            problems.append(runner_problem)
        adb_path = shutil.which(adb)
        device: _AdbDevice | None = None
        if adb_path is None:
            problems.append(
                f"the adb binary ({adb!r} is not on PATH; install Android platform-tools)"
            )
        else:
            device, device_problem = _pick_device(adb_path, serial)
            if device_problem:
                problems.append(device_problem)
        if problems:
            raise BackendNotAvailableError(
                "running on an Android device needs: " + "; ".join(problems)
            )
        assert adb_path is not None and device is not None and runner_binary is not None
        self._adb = adb_path
        self.serial = device.serial
        self._runner_binary = Path(runner_binary)
        self.name = f"device:{self.serial}"
        self.output_specs = _read_output_specs(self.pte_path)
        self._pushed = False

    def run(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Push the inputs, execute once on the device, pull and decode the outputs."""
        if not self._pushed:
            self._push_program()
        with tempfile.TemporaryDirectory(prefix="qnn_device_run_") as tmp_name:
            tmp = Path(tmp_name)
            remote_inputs = []
            for i, tensor in enumerate(inputs):
                raw = tmp / f"input_{i}.raw"
                raw.write_bytes(tensor.detach().cpu().contiguous().numpy().tobytes())
                self._adb_run("push", str(raw), f"{self.device_dir}/input_{i}.raw")
                remote_inputs.append(f"{self.device_dir}/input_{i}.raw")
            input_list = tmp / "input_list.txt"
            input_list.write_text(" ".join(remote_inputs) + "\n")
            self._adb_run("push", str(input_list), f"{self.device_dir}/input_list.txt")
            d = shlex.quote(self.device_dir)
            self._adb_run(
                "shell",
                f"cd {d} && rm -rf outputs && mkdir -p outputs && "
                f"LD_LIBRARY_PATH={d} ADSP_LIBRARY_PATH={d} "
                f"./{shlex.quote(self._runner_binary.name)} --model_path model.pte "
                "--input_list_path input_list.txt --output_folder_path outputs",
            )
            outputs = []
            for j, spec in enumerate(self.output_specs):
                local = tmp / f"output_0_{j}.raw"
                self._adb_run("pull", f"{self.device_dir}/outputs/output_0_{j}.raw", str(local))
                outputs.append(_decode_raw(local.read_bytes(), spec, j))
        return tuple(outputs)

    def _push_program(self) -> None:
        self._adb_run("shell", f"mkdir -p {shlex.quote(self.device_dir)}")
        self._adb_run("push", str(self.pte_path), f"{self.device_dir}/model.pte")
        remote_runner = f"{self.device_dir}/{self._runner_binary.name}"
        self._adb_run("push", str(self._runner_binary), remote_runner)
        self._adb_run("shell", f"chmod 755 {shlex.quote(remote_runner)}")
        for lib in self._device_libs:
            self._adb_run("push", str(lib), f"{self.device_dir}/{lib.name}")
        self._pushed = True

    def _adb_run(self, *args: str) -> str:
        cmd = [self._adb, "-s", self.serial, *args]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise StageError(
                _STAGE, f"`{shlex.join(cmd)}` timed out after {self.timeout_s} s", exc
            ) from exc
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise StageError(
                _STAGE, f"`{shlex.join(cmd)}` failed with exit code {done.returncode}: {tail}"
            )
        return done.stdout


def _check_android_binary(path: Path | None) -> str | None:
    """Why `path` is not a usable Android (arm64) executor runner, or None if it looks right."""
    what = "the executor runner built for Android (arm64-v8a, e.g. qnn_executor_runner)"
    if path is None:
        return f"{what}; pass runner_binary"
    path = Path(path)
    if not path.is_file():
        return f"{what}; {path} does not exist"
    with path.open("rb") as fh:
        head = fh.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return f"{what}; {path} is not an ELF executable"
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    if machine != _EM_AARCH64:
        arch = _EM_NAMES.get(machine, f"e_machine {machine}")
        return f"{what}; {path} is built for {arch}, not aarch64"
    return None


def _pick_device(adb_path: str, serial: str | None) -> tuple[_AdbDevice | None, str | None]:
    """The device to use from `adb devices`, or why there is none."""
    try:
        done = subprocess.run(
            [adb_path, "devices"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"a working adb (`{adb_path} devices` failed: {exc})"
    if done.returncode != 0:
        return None, f"a working adb (`{adb_path} devices` exited {done.returncode})"
    devices = _parse_adb_devices(done.stdout)
    if serial is not None:
        devices = [d for d in devices if d.serial == serial]
        if not devices:
            return None, f"a connected Android device with serial {serial!r} (adb does not list it)"
    if not devices:
        return None, "a connected Android device (`adb devices` lists none)"
    ready = [d for d in devices if d.state == "device"]
    if not ready:
        states = ", ".join(f"{d.serial} is {d.state}" for d in devices)
        return None, f"an authorized, online Android device ({states}; accept USB debugging)"
    if len(ready) > 1 and serial is None:
        serials = ", ".join(d.serial for d in ready)
        return None, f"one device chosen by serial (several are connected: {serials})"
    return ready[0], None


def _parse_adb_devices(stdout: str) -> list[_AdbDevice]:
    devices = []
    for line in stdout.splitlines():
        line = line.strip()
        # Skip the banner, daemon start-up chatter and blank lines.
        if not line or line.startswith(("List of devices", "*")):
            continue
        parts = line.split()
        if len(parts) >= 2:
            devices.append(_AdbDevice(serial=parts[0], state=parts[1]))
    return devices


def _read_output_specs(pte_path: Path) -> tuple[TensorSpec | None, ...]:
    _check_pte_header(pte_path)
    from executorch.runtime import Runtime

    try:
        program = Runtime.get().load_program(pte_path)
        meta = program.metadata("forward")
    except RuntimeError as exc:
        raise ArtifactError(pte_path, f"the ExecuTorch runtime rejected it ({exc})") from exc
    return tuple(_tensor_spec(meta.output_tensor_meta, j) for j in range(meta.num_outputs()))


def _decode_raw(data: bytes, spec: TensorSpec | None, index: int) -> torch.Tensor:
    if spec is None:
        raise StageError(
            _STAGE, f"output {index} is not a tensor; the device runner cannot read it"
        )
    flat = torch.frombuffer(bytearray(data), dtype=spec.dtype) if data else torch.empty(0)
    if flat.numel() == math.prod(spec.shape):
        return flat.reshape(spec.shape)
    return flat  # a dynamic shape smaller than its bound: the raw file does not say which


# --- measuring --------------------------------------------------------------------------------


def measure_latency(
    runner: Runner,
    inputs: tuple[torch.Tensor, ...],
    *,
    warmup: int = 3,
    runs: int = 20,
) -> dict[str, float]:
    """Time `runs` executions after `warmup` untimed ones: p50_ms, p90_ms, mean_ms, min_ms."""
    if warmup < 0:
        raise ConfigValidationError("infer.warmup", warmup, "must be >= 0")
    if runs < 1:
        raise ConfigValidationError("infer.runs", runs, "must be >= 1")
    for _ in range(warmup):
        runner.run(inputs)
    times_ms = []
    for _ in range(runs):
        start = time.perf_counter()
        runner.run(inputs)
        times_ms.append((time.perf_counter() - start) * 1e3)
    return {
        "p50_ms": float(np.percentile(times_ms, 50)),
        "p90_ms": float(np.percentile(times_ms, 90)),
        "mean_ms": statistics.fmean(times_ms),
        "min_ms": min(times_ms),
    }


def compare_outputs(
    reference: Sequence[torch.Tensor], actual: Sequence[torch.Tensor]
) -> list[dict[str, float]]:
    """Per output: sqnr_db, cosine and max_abs_error of `actual` against `reference`.

    Raises:
        ConfigValidationError: the two differ in output count or in an output's shape.
    """
    if len(reference) != len(actual):
        raise ConfigValidationError(
            "outputs",
            len(actual),
            f"the program returned {len(actual)} output(s), the reference has {len(reference)}",
        )
    results = []
    for i, (ref, got) in enumerate(zip(reference, actual, strict=True)):
        if tuple(ref.shape) != tuple(got.shape):
            raise ConfigValidationError(
                f"outputs[{i}]",
                _describe(got.dtype, got.shape),
                f"the reference is {_describe(ref.dtype, ref.shape)}",
            )
        ref_np = _to_float64(ref)
        got_np = _to_float64(got)
        results.append(
            {
                "sqnr_db": metrics.sqnr_db(ref_np, got_np),
                "cosine": metrics.cosine(ref_np, got_np),
                "max_abs_error": metrics.max_abs_error(ref_np, got_np),
            }
        )
    return results


def _to_float64(t: torch.Tensor) -> np.ndarray[Any, np.dtype[np.float64]]:
    return t.detach().cpu().to(torch.float64).numpy()
