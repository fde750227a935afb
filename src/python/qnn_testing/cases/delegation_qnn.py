"""What the QNN HTP leaves outside its partitions, per case and precision: measured on V75.

Recorded from the default V75 run (the whole catalogue, one precision per case dealt round-robin,
`tests/op/coverage.py --targets qnn-v75`, executorch 1.5.1, QNN 2.51 x86 emulator):
the ops QNN's partitioner refused, which then run on the portable kernels, with the outputs still
checked. Only measured (case, precision) pairs are listed: other precisions keep the default
(fully delegated) until a `QNN_OP_SUITE=full` run measures them. Keys as in
`qnn_testing.cases.delegation`: case -> precision pattern -> ops left outside (empty: no
delegate at all).
"""

from __future__ import annotations

_DIM_ORDER = "dim_order_ops._to_dim_order_copy.default"
_SCATTER_REDUCE = (
    "aten.add.Tensor",
    "aten.gt.Tensor",
    "aten.sum.dim_IntList",
    "aten.unsqueeze_copy.default",
    "aten.where.self",
)

# The type is `qnn_testing.cases.delegation.Outside` (which imports this table).
QNN_V75_OUTSIDE: dict[str, dict[str, tuple[str, ...]]] = {
    "erf": {"fp16": ("aten.erf.default",)},
    # Comparisons and casts: the dtype conversion of the bool result stays outside.
    "gt": {"16a8w": (_DIM_ORDER,)},
    "eq_round": {"16a16w": (_DIM_ORDER,)},
    "bitwise_and": {"fp16": ()},
    "relu6": {"16a4w": ("aten.hardtanh.default",)},
    "softplus": {"8a8w": ("aten.exp.default", "aten.gt.Scalar", "aten.where.self")},
    "mish": {"16a8w": ("aten.exp.default", "aten.gt.Scalar", "aten.mul.Tensor", "aten.where.self")},
    "softmax_4d_neg_dim": {"fp16": ("aten._softmax.default",)},
    "adaptive_max_pool2d_uneven": {"16a4w": ("aten.cat.default", "aten.slice_copy.Tensor")},
    "layer_norm_no_affine": {"16a4w_block": ("aten.native_layer_norm.default",)},
    "baddbmm": {"16a4w": ("aten.bmm.default", "aten.mul.Tensor")},
    "sum_all": {"16a8w": ("aten.sum.dim_IntList",)},
    "prod": {"16a8w": ("aten.prod.dim_int",)},
    "logsumexp": {"16a4w_block": ("aten.amax.default", "aten.eq.Scalar", "aten.sub.Tensor")},
    "sort_descending_dim0": {"16a4w": ("aten.topk.default",)},
    "scatter_reduce_sum": {"16a4w": _SCATTER_REDUCE},
    "scatter_reduce_amax": {
        "16a4w_block": (
            "aten.gt.Tensor",
            "aten.maximum.default",
            "aten.sum.dim_IntList",
            "aten.unsqueeze_copy.default",
            "aten.where.self",
        )
    },
    "scatter_reduce_amin": {"fp16": ("aten.gt.Tensor", "aten.sum.dim_IntList")},
    "scatter_reduce_mean": {"8a8w": _SCATTER_REDUCE},
    "slice_empty": {"16a16w": ("aten.add.Tensor", "aten.slice_copy.Tensor")},
    # QNN's op validation refuses one transpose of the decomposed LSTM (error 3110), measured in
    # a QNN_OP_SUITE=full run at every quantized recipe.
    "lstm": {p: ("aten.permute_copy.default",) for p in ("8a8w", "16a8w", "16a16w", "16a4w")},
    "grid_sample_3d": {"16a8w": ("aten.select_copy.int", "aten.view_copy.default")},
    "rand_like": {"16a4w": ("aten.rand.default", _DIM_ORDER)},
    "randn_like": {
        "16a4w_block": ("aten.mul.Tensor", "aten.ne.Scalar", "aten.randn.default", _DIM_ORDER)
    },
    # A cast between int32 and a quantized float stays on the CPU: QNN's Cast moves the codes,
    # not the values (qnn_compile.int_casts keeps it out), and its op validation refuses (3110)
    # the `x + 0.0` that stands for an int -> float cast (qnn_quant.quantizers.qnn). Measured in
    # a QNN_OP_SUITE=full run at every quantized recipe; the values are right on the CPU.
    "to_int_and_back": {
        p: ("aten.add.Tensor", _DIM_ORDER)
        for p in ("8a8w", "16a8w", "16a16w", "16a4w", "16a4w_block")
    },
    "int_to_float": {p: ("aten.add.Tensor",) for p in ("8a8w", "16a8w", "16a16w", "16a4w")},
    # Rewritten for QNN (qnn_compile.decompositions): at fp16 fully delegated; quantized, the
    # rewrite's float ops sit between the quantizer's q/dq and QNN leaves some of them.
    "lerp": {p: ("aten.add.Tensor", "aten.sub.Tensor") for p in ("8a8w", "16a8w")},
    "adaptive_avg_pool3d_uneven": {
        p: ("aten.cat.default", "aten.slice_copy.Tensor") for p in ("8a8w", "16a8w")
    },
}
