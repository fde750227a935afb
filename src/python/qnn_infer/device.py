"""Choosing what an Android device run needs: the runner binary and the libraries each backend
pushes beside the program (`InferBackend.device_libs`: for QNN, the SDK's Android and Hexagon
libraries, `qnn_infer.backends.qnn`).
"""

from __future__ import annotations

import math
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from qnn_common.config import InferConfig, Stage
from qnn_common.errors import ArtifactError, BackendNotAvailableError, StageError
from qnn_common.recipes import Backend
from qnn_common.soc import HtpArch
from qnn_infer.backends import INFER_BACKENDS
from qnn_infer.backends.runtime import RuntimeInfo
from qnn_infer.pte import check_pte_header
from qnn_infer.runner import TensorSpec, pick_user_outputs, tensor_spec

_STAGE = Stage.INFER


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

        adb_path, device = _ready_device(runner_binary, serial, adb)
        assert runner_binary is not None
        self._adb = adb_path
        self.serial = device.serial
        self._runner_binary = Path(runner_binary)
        self.name = f"device:{self.serial}"
        program_outputs = _read_output_specs(self.pte_path)
        # The runner writes every program output; only the user outputs are pulled (see
        # HostRunner: updated inputs come first).
        self.user_output_indices = pick_user_outputs(
            self.pte_path, "forward", len(program_outputs), None
        )
        self.output_specs = tuple(program_outputs[j] for j in self.user_output_indices)
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
            for j, spec in zip(self.user_output_indices, self.output_specs, strict=True):
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


def check_device_ready(cfg: InferConfig) -> None:
    """Raise BackendNotAvailableError naming everything a run on `cfg.device` lacks on this host
    (the executor runner built for Android, adb, the device itself); nothing without a device.

    At most one `adb devices`: cheap enough for the pipeline to call before any stage runs, so
    that a missing adb does not cost a prepare, a quantize and a compile first.
    """
    if cfg.device is not None:
        _ready_device(cfg.device_runner, None if cfg.device == "auto" else cfg.device, "adb")


def _ready_device(
    runner_binary: Path | None, serial: str | None, adb: str
) -> tuple[str, _AdbDevice]:
    """adb's path and the device to run on, or BackendNotAvailableError naming every problem."""
    problems: list[str] = []
    runner_problem = _check_android_binary(runner_binary)
    if runner_problem:
        problems.append(runner_problem)
    adb_path = shutil.which(adb)
    device: _AdbDevice | None = None
    if adb_path is None:
        problems.append(f"the adb binary ({adb!r} is not on PATH; install Android platform-tools)")
    else:
        device, device_problem = _pick_device(adb_path, serial)
        if device_problem:
            problems.append(device_problem)
    if problems:
        raise BackendNotAvailableError("running on an Android device needs: " + "; ".join(problems))
    assert adb_path is not None and device is not None
    return adb_path, device


def _check_android_binary(path: Path | None) -> str | None:
    """Why `path` is not a usable Android (arm64) executor runner, or None if it looks right."""
    what = "the executor runner built for Android (arm64-v8a, e.g. qnn_executor_runner)"
    if path is None:
        return f"{what}; pass --device-runner"
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
    check_pte_header(pte_path)
    from executorch.runtime import Runtime

    try:
        program = Runtime.get().load_program(pte_path)
        meta = program.metadata("forward")
    except RuntimeError as exc:
        raise ArtifactError(pte_path, f"the ExecuTorch runtime rejected it ({exc})") from exc
    return tuple(tensor_spec(meta.output_tensor_meta, j) for j in range(meta.num_outputs()))


def _decode_raw(data: bytes, spec: TensorSpec | None, index: int) -> torch.Tensor:
    if spec is None:
        raise StageError(
            _STAGE, f"output {index} is not a tensor; the device runner cannot read it"
        )
    flat = torch.frombuffer(bytearray(data), dtype=spec.dtype) if data else torch.empty(0)
    if flat.numel() == math.prod(spec.shape):
        return flat.reshape(spec.shape)
    return flat  # a dynamic shape smaller than its bound: the raw file does not say which


def device_runner(
    pte: Path, cfg: InferConfig, backends: set[Backend], runtime: RuntimeInfo,
    arch: HtpArch | None = None,
) -> DeviceRunner:
    """A DeviceRunner for `pte` per `cfg.device`, or an error naming everything that is missing.

    For a QNN program `arch` (from the compile artifact's SoC) picks the stub and skel libraries.
    """
    assert cfg.device is not None
    libs: list[Path] = []
    problems: list[str] = []
    for backend in sorted(backends):
        found, missing = INFER_BACKENDS[backend].device_libs(runtime, arch)
        libs += found
        problems += missing
    try:
        runner = DeviceRunner(
            pte,
            runner_binary=cfg.device_runner,
            serial=None if cfg.device == "auto" else cfg.device,
            device_libs=libs,
        )
    except BackendNotAvailableError as err:
        if not problems:
            raise
        raise BackendNotAvailableError(f"{err}; and {'; '.join(problems)}") from None
    if problems:
        raise BackendNotAvailableError(
            "running on an Android device needs: " + "; ".join(problems)
        )
    return runner
