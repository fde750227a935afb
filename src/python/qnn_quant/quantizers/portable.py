"""Portable: XNNPACK's quantizer. The portable runtime runs the standard quantized_decomposed
q/dq representation that quantizer produces, and its kernels then compute exactly what fake
quant computes."""

from __future__ import annotations

from qnn_quant.quantizers import xnnpack
from qnn_quant.quantizers.backend import QuantBackend

# A dynamic linear's activation scale is the one per tensor its choose_qparams op picks: the
# portable kernels run the program's ops as they are (no per-row qd8 GEMM).
BACKEND = QuantBackend(quantizer=xnnpack.quantizer, dynamic_scale_per_row=False)
