"""Run ExecuTorch programs (.pte) in this process.

`HostRunner` executes in-process through `executorch.runtime` (XNNPACK, portable and, once
`qnn_infer.runtimes.prepare_runtime` has loaded the QNN libraries, QNN delegates on the x86 HTP
emulator). `qnn_infer.device.DeviceRunner` executes on an Android device over adb. Both satisfy
`Runner`, so latency and accuracy code (`qnn_infer.measure`) does not care where a program runs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from qnn_common.cli.noise import native_noise_filtered
from qnn_common.config import Stage
from qnn_common.errors import (
    ArtifactError,
    BackendNotAvailableError,
    ConfigValidationError,
    InputError,
    PipelineError,
    StageError,
)
from qnn_infer.backends import BY_RUNTIME_ID, INFER_BACKENDS
from qnn_infer.deadline import bound_for, bounded
from qnn_infer.pte import check_pte_header, user_output_count
from qnn_infer.runtimes import host_runtime

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
        return describe(self.dtype, self.shape)


def describe(dtype: torch.dtype, shape: Sequence[int]) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


# --- host -------------------------------------------------------------------------------------


class HostRunner:
    """Execute a .pte in this process through `executorch.runtime`.

    Inputs are the method's flat inputs: for a model called with structured arguments, the
    pytree leaves of its ``(args, kwargs)`` in order (`torchio.samples.ModelInputs.leaves`),
    ints, floats, bools and None included: torch.export bakes those into the program as
    constants but keeps them as inputs, and the .pte takes them too (measured: a model with 5
    tensor and 4 constant leaves has a 9-input method and refuses the 5 tensors alone).
    Inputs are checked against the method's metadata before execution, so a wrong count, dtype
    or shape is reported as an `InputError` naming expected and got instead of a bare
    runtime status code. `example_inputs`, if given, are checked the same way at construction,
    so a caller learns before any run that its data cannot fit the program.

    With `etdump_path`, event tracing is enabled: every `run` (warmup runs of `measure_latency`
    included) records per-op and per-delegate timings, and `write_etdump` writes them there.
    `debug_buffer_size` > 0 also captures intermediate outputs, written by `write_etdump` beside
    the ETDump as ``<etdump_path>.debug``.

    Only the program's user outputs are returned: a program that updates an input in place also
    returns the updated input, before its user outputs (see `user_output_indices`).
    `user_output_indices` overrides that choice (indices into the method's outputs), for
    callers that know it from the exported program's graph signature.
    """

    def __init__(
        self,
        pte_path: Path,
        *,
        method: str = "forward",
        example_inputs: Sequence[torch.Tensor] | None = None,
        etdump_path: Path | None = None,
        debug_buffer_size: int = 0,
        user_output_indices: Sequence[int] | None = None,
    ) -> None:
        self.pte_path = Path(pte_path)
        self.method_name = method
        self.name = f"host:{self.pte_path.name}"
        self.etdump_path = etdump_path
        if debug_buffer_size < 0:
            raise ConfigValidationError(
                "infer.debug_buffer_size", debug_buffer_size, "must be >= 0"
            )

        check_pte_header(self.pte_path)
        self._runtime: Any = host_runtime()
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
            tensor_spec(meta.input_tensor_meta, i) for i in range(meta.num_inputs())
        )
        self.program_output_specs: tuple[TensorSpec | None, ...] = tuple(
            tensor_spec(meta.output_tensor_meta, i) for i in range(meta.num_outputs())
        )
        self.user_output_indices: tuple[int, ...] = pick_user_outputs(
            self.pte_path, method, len(self.program_output_specs), user_output_indices
        )
        # What `run` returns: the user outputs only.
        self.output_specs: tuple[TensorSpec | None, ...] = tuple(
            self.program_output_specs[i] for i in self.user_output_indices
        )
        if example_inputs is not None:
            # Fail before the (possibly slow) method load when the caller's data cannot fit.
            self._check_inputs(tuple(example_inputs))
        try:
            # XNNPACK's cpuinfo prints five harmless lines on non-ARM hosts at the first load.
            with native_noise_filtered():
                self._method: Any = self._program.load_method(method)
        except RuntimeError as exc:
            raise self._explain_load_failure(exc) from exc
        self._bound = bound_for(f"running {method} of {self.pte_path}")

    def run(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Execute the method once on `inputs`.

        Raises:
            InputError: the inputs do not match the program's (count, dtype, rank, or
                a dimension the program cannot take).
            StageError: the runtime failed while executing.
        """
        self._check_inputs(inputs)
        try:
            # Bounded: a run that never returns (seen on the QNN emulator) ends the process
            # with one error line instead of hanging it (qnn_infer.deadline, --run-timeout).
            with bounded(self._bound):
                outputs = self._method.execute(inputs)
        except RuntimeError as exc:
            if "set_inputs" in str(exc):
                # Passed the checks above (which allow any size up to the planned one, as a
                # dynamic dimension would) but the dimension is static in the program.
                raise InputError(
                    "inputs",
                    _describe_inputs(inputs),
                    f"the runtime refused them; {self._expected()} ({exc})",
                ) from exc
            raise StageError(
                _STAGE, f"executing {self.method_name} of {self.pte_path} failed: {exc}", exc
            ) from exc
        return tuple(_as_tensor(outputs[i], i) for i in self.user_output_indices)

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
            raise InputError(
                "inputs", type(inputs).__name__, f"must be a tuple of tensors; {self._expected()}"
            )
        if len(inputs) != len(self.input_specs):
            raise InputError(
                "inputs",
                _describe_inputs(inputs),
                f"expected {len(self.input_specs)} input(s), got {len(inputs)}; "
                + self._expected()
                + " (a structured model's inputs are the pytree leaves of its (args, kwargs), "
                "in order, ints / floats / bools / None included: ModelInputs.leaves)",
            )
        for i, (tensor, spec) in enumerate(zip(inputs, self.input_specs, strict=True)):
            if spec is None:
                continue
            field = f"inputs[{i}]"
            if not isinstance(tensor, torch.Tensor):
                raise InputError(
                    field, type(tensor).__name__, f"expected a tensor {spec.describe()}"
                )
            got = describe(tensor.dtype, tensor.shape)
            if tensor.dtype != spec.dtype:
                raise InputError(
                    field, got, f"expected dtype {spec.describe()}, got {got}"
                )
            if tensor.dim() != len(spec.shape) or any(
                d > bound for d, bound in zip(tensor.shape, spec.shape, strict=True)
            ):
                raise InputError(
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
        for backend_id in sorted(backends):
            backend = BY_RUNTIME_ID.get(backend_id)
            explain = None if backend is None else INFER_BACKENDS[backend].start_failure
            if explain is not None:
                return BackendNotAvailableError(explain(self.pte_path, exc))
        # The file passed the header checks, so this is the runtime or a delegate refusing to
        # start (e.g. a backend's init failing), not a corrupt artifact.
        return StageError(
            _STAGE, f"loading method {self.method_name!r} of {self.pte_path} failed: {exc}", exc
        )

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


def pick_user_outputs(
    pte_path: Path, method: str, num_outputs: int, given: Sequence[int] | None
) -> tuple[int, ...]:
    """Indices of the method's user outputs among its `num_outputs` outputs.

    The runtime returns, in order, the inputs the program updates in place (its graph
    signature's USER_INPUT_MUTATION outputs; buffer mutations stay inside the program), then the
    user outputs. MethodMeta does not say which is which, but the execution plan's output
    pytree spec (ContainerMetadata.encoded_out_str) describes the user outputs only: its leaf
    count is how many trail the list.
    """
    if given is not None:
        indices = tuple(int(i) for i in given)
        bad = [i for i in indices if not 0 <= i < num_outputs]
        if bad:
            raise ConfigValidationError(
                "user_output_indices",
                list(indices),
                f"{pte_path.name} has {num_outputs} output(s); indices must be in "
                f"[0, {num_outputs})",
            )
        return indices
    user = user_output_count(pte_path, method)
    if user is None or user >= num_outputs:
        # No spec (hand-built program) or nothing extra: every output is a user output.
        return tuple(range(num_outputs))
    return tuple(range(num_outputs - user, num_outputs))


def tensor_spec(getter: Any, index: int) -> TensorSpec | None:
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
        describe(t.dtype, t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        for t in inputs
    ]
    return f"({', '.join(parts)})"


def _as_tensor(value: object, index: int) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool | int | float):
        return torch.tensor(value)
    raise StageError(_STAGE, f"output {index} is a {type(value).__name__}, not a tensor")
