"""One entry per backend: what running its programs needs (`InferBackend`, `runtime.py`).
Backends whose kernels are linked into the runtime share `LINKED_KERNELS`; one that needs a
setup has its module here (`qnn.py` is the model), registered in `INFER_BACKENDS` below."""

from __future__ import annotations

from qnn_common.recipes import BACKENDS, Backend
from qnn_infer.backends import qnn
from qnn_infer.backends.runtime import LINKED_KERNELS, InferBackend, RuntimeInfo

INFER_BACKENDS: dict[Backend, InferBackend] = {
    Backend.XNNPACK: LINKED_KERNELS,
    Backend.PORTABLE: LINKED_KERNELS,
    Backend.QNN: qnn.BACKEND,
}

# ExecuTorch's backend ids, as a .pte's delegate entries name them (`BackendTraits.runtime_id`).
BY_RUNTIME_ID: dict[str, Backend] = {
    t.runtime_id: b for b, t in BACKENDS.items() if t.runtime_id is not None
}

__all__ = ["BY_RUNTIME_ID", "INFER_BACKENDS", "InferBackend", "RuntimeInfo"]
