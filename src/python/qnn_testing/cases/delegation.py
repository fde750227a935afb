"""How much of each case a backend takes, where it is not everything: measured, not guessed.

Recorded from a coverage run (`tests/op/coverage.py`, executorch 1.5.1): the ops
XNNPACK left to the portable kernels, per case and precision; QNN's, measured on V75, in
`qnn_testing.cases.delegation_qnn`. Every case not listed must be fully delegated on XNNPACK and
QNN and not at all on portable. A failure here means a backend now takes more or less: check the
op list, then update the entry. Keys: case -> precision pattern -> ops left outside (empty: no
delegate).
"""

from __future__ import annotations

from qnn_testing.cases.delegation_qnn import QNN_V75_OUTSIDE
from qnn_testing.expect import Rule
from qnn_testing.structure import Delegation, Structure

Outside = dict[str, dict[str, tuple[str, ...]]]


XNNPACK_OUTSIDE: Outside = {
    "adaptive_avg_pool1d": {
        "*": (
            "aten._adaptive_avg_pool2d.default",
            "aten.squeeze_copy.dims",
            "aten.unsqueeze_copy.default",
        )
    },
    "adaptive_avg_pool2d": {"*": ("aten._adaptive_avg_pool2d.default",)},
    "add_alpha": {"*": ("aten.add.Tensor",)},
    "addmm": {"*": ("aten.addmm.default",)},
    "amax": {"*": ("aten.amax.default",)},
    "any": {"*": ("aten.any.dim", "aten.gt.Scalar")},
    "arange_add": {"*": ("aten.arange.start_step", "dim_order_ops._to_dim_order_copy.default")},
    "argmax": {"*": ("aten.argmax.default",)},
    "avg_pool1d": {"*": ("aten.squeeze_copy.dims", "aten.unsqueeze_copy.default")},
    "avg_pool2d_pad": {"*": ("aten.avg_pool2d.default",)},
    "baddbmm": {"*": ("aten.alias_copy.default",)},
    # A buffer's write-back (and for a slice, the scatter into it) stays on the portable kernels.
    "buffer_index_copy": {"*": ("aten.index_put.default",)},
    "buffer_index_put": {"*": ("aten.index_put.default",)},
    "buffer_returned": {"*": ("aten.index_put.default",)},
    "buffer_slice": {"*": ("aten.copy.default", "aten.slice_scatter.default")},
    "chunk": {"*": ("aten.split_with_sizes_copy.default",)},
    "cumsum": {"*": ("aten.cumsum.default",)},
    "div_floor": {"*": ("aten.div.Tensor_mode",)},
    "elu": {"*": ("aten.elu.default",)},
    "embedding": {"*": ("aten.embedding.default",)},
    "empty_batch": {
        "fp32": ("aten.addmm.default", "aten.mul.Tensor"),
        "8a8w": (
            "aten.addmm.default",
            "aten.mul.Tensor",
            "quantized_decomposed.dequantize_per_channel.default",
            "quantized_decomposed.dequantize_per_tensor.default",
            "quantized_decomposed.quantize_per_tensor.default",
        ),
    },
    "eq_round": {
        "*": ("aten.eq.Tensor", "aten.round.default", "dim_order_ops._to_dim_order_copy.default")
    },
    "erf": {"*": ("aten.erf.default",)},
    "expand": {"*": ("aten.expand_copy.default",)},
    "flip": {"*": ("aten.flip.default",)},
    "gather": {"*": ("aten.gather.default",)},
    "gather_input_index": {"*": ("aten.gather.default",)},
    "group_norm": {"*": ("aten.native_group_norm.default",)},
    "gru_cell": {"*": ("aten.split_with_sizes_copy.default",)},
    "gt": {"*": ("aten.gt.Tensor", "dim_order_ops._to_dim_order_copy.default")},
    "hardsigmoid": {"*": ("dim_order_ops._to_dim_order_copy.default",)},
    "index_put": {"*": ("aten.index_put.default",)},
    "index_select": {"*": ("aten.index_select.default",)},
    "index_select_input": {"*": ("aten.index_select.default",)},
    "index_tensor": {"*": ("aten.index.Tensor",)},
    "inplace_add_input": {"fp32": ("aten.copy.default",)},
    "inplace_slice_assign": {"*": ("aten.copy.default", "aten.slice_scatter.default")},
    "instance_norm2d": {"*": ("aten._native_batch_norm_legit.no_stats",)},
    "instance_norm2d_affine": {
        "*": ("aten._native_batch_norm_legit.no_stats", "aten.repeat.default")
    },
    "lerp": {
        "*": (
            "aten.full.default",
            "aten.ge.Scalar",
            "aten.where.self",
            "dim_order_ops._to_dim_order_copy.default",
        )
    },
    "log_softmax": {"*": ("aten._log_softmax.default",)},
    "logsumexp": {
        "*": (
            "aten.amax.default",
            "aten.eq.Scalar",
            "aten.scalar_tensor.default",
            "aten.squeeze_copy.dims",
            "aten.sum.dim_IntList",
            "aten.where.self",
        )
    },
    "lstm": {
        "*": (
            "aten.full.default",
            "aten.split_with_sizes_copy.default",
            "aten.squeeze_copy.dims",
            "aten.unsqueeze_copy.default",
        )
    },
    "lstm_cell": {"*": ("aten.split_with_sizes_copy.default",)},
    "masked_fill": {"*": ("aten.gt.Scalar", "aten.scalar_tensor.default", "aten.where.self")},
    "max_pool1d": {
        "*": (
            "aten.max_pool2d_with_indices.default",
            "aten.squeeze_copy.dims",
            "aten.unsqueeze_copy.default",
        )
    },
    "mean_dim_none": {"fp32": ("aten.mean.dim",)},
    "mean_keepdim_neg": {"*": ("aten.mean.dim",)},
    "mish": {"*": ("aten.gt.Scalar", "aten.log1p.default", "aten.where.self")},
    "mm": {"*": ("aten.mm.default",)},
    "multihead_attention": {
        "*": (
            "aten.any.dim",
            "aten.eq.Scalar",
            "aten.expand_copy.default",
            "aten.full_like.default",
            "aten.logical_not.default",
            "aten.mul.Scalar",
            "aten.select_copy.int",
            "aten.squeeze_copy.dims",
            "aten.unsqueeze_copy.default",
            "aten.where.self",
        )
    },
    "pad_reflect": {
        "*": ("aten.abs.default", "aten.arange.start_step", "aten.index.Tensor", "aten.sub.Tensor")
    },
    "pad_replicate": {"*": ("aten.arange.start_step", "aten.clamp.default", "aten.index.Tensor")},
    "prod": {"*": ("aten.prod.dim_int",)},
    "reciprocal": {"*": ("aten.reciprocal.default",)},
    "repeat": {"*": ("aten.repeat.default",)},
    "rms_norm": {"*": ("aten.add.Scalar", "aten.mean.dim")},
    "rms_norm_no_affine": {"*": ("aten.add.Scalar", "aten.mean.dim")},
    "roll": {
        "*": (
            "aten.add.Tensor",
            "aten.arange.start_step",
            "aten.fmod.Scalar",
            "aten.index_select.default",
        )
    },
    "round": {
        "fp32": ("aten.round.default", "dim_order_ops._to_dim_order_copy.default"),
        "8a8w": ("aten.round.default",),
    },
    "scatter": {"*": ("aten.scatter.src",)},
    "scatter_add": {"*": ("aten.scatter_add.default",)},
    "sdpa": {
        "*": (
            "aten.any.dim",
            "aten.eq.Scalar",
            "aten.expand_copy.default",
            "aten.full_like.default",
            "aten.logical_not.default",
            "aten.mul.Scalar",
            "aten.split_with_sizes_copy.default",
            "aten.where.self",
        )
    },
    "sdpa_additive_mask": {
        "*": (
            "aten.any.dim",
            "aten.arange.start_step",
            "aten.eq.Scalar",
            "aten.expand_copy.default",
            "aten.full.default",
            "aten.full_like.default",
            "aten.le.Scalar",
            "aten.logical_not.default",
            "aten.mul.Scalar",
            "aten.scalar_tensor.default",
            "aten.split_with_sizes_copy.default",
            "aten.sub.Tensor",
            "aten.unsqueeze_copy.default",
            "aten.where.self",
        )
    },
    "sdpa_causal": {
        "*": (
            "aten.any.dim",
            "aten.arange.start_step",
            "aten.eq.Scalar",
            "aten.expand_copy.default",
            "aten.full.default",
            "aten.full_like.default",
            "aten.le.Scalar",
            "aten.logical_and.default",
            "aten.logical_not.default",
            "aten.mul.Scalar",
            "aten.scalar_tensor.default",
            "aten.split_with_sizes_copy.default",
            "aten.sub.Tensor",
            "aten.unsqueeze_copy.default",
            "aten.where.self",
        )
    },
    "select_neg": {"*": ("aten.select_copy.int",)},
    "slice_empty": {
        "fp32": ("aten.add.Tensor", "aten.slice_copy.Tensor"),
        "8a8w": (
            "aten.add.Tensor",
            "aten.slice_copy.Tensor",
            "quantized_decomposed.dequantize_per_tensor.default",
            "quantized_decomposed.quantize_per_tensor.default",
        ),
    },
    "slice_step": {"*": ("aten.slice_copy.Tensor",)},
    "softmax_4d_neg_dim": {"*": ("aten._softmax.default",)},
    "softplus": {"*": ("aten.gt.Scalar", "aten.log1p.default", "aten.where.self")},
    "split": {"*": ("aten.split_with_sizes_copy.default",)},
    "squeeze": {"*": ("aten.squeeze_copy.dims",)},
    "sub_alpha": {"*": ("aten.sub.Tensor",)},
    "sum_all": {"*": ("aten.sum.dim_IntList",)},
    "sum_dim": {"*": ("aten.sum.dim_IntList",)},
    "sum_dims_keepdim": {"*": ("aten.sum.dim_IntList",)},
    "threshold": {"*": ("aten.le.Scalar", "aten.scalar_tensor.default", "aten.where.self")},
    "to_int_and_back": {"*": ("dim_order_ops._to_dim_order_copy.default",)},
    "triu": {
        "*": (
            "aten.arange.start_step",
            "aten.ge.Scalar",
            "aten.scalar_tensor.default",
            "aten.sub.Tensor",
            "aten.unsqueeze_copy.default",
            "aten.where.self",
        )
    },
    "unbind": {"*": ("aten.squeeze_copy.dims",)},
    "upsample_nearest2d": {"*": ("aten.upsample_nearest2d.vec",)},
    "var": {"*": ("aten.var.correction",)},
    "vector_norm": {"*": ("aten.pow.Tensor_Scalar", "aten.sum.dim_IntList")},
    "where": {"*": ("aten.gt.Scalar", "aten.where.self")},
    "where_scalar": {"*": ("aten.gt.Scalar", "aten.scalar_tensor.default", "aten.where.self")},
}


# Issue 8, class 6 (measured): ops qnn_compile.decompositions rewrites, and what of
# them XNNPACK leaves to the portable kernels. The 3-D cases' 2-D convolutions (from the conv3d
# in front) take weight slices, not parameters, which XNNPACK refuses.
DECOMPOSED_OUTSIDE: Outside = {
    "adaptive_avg_pool3d": {
        "fp32": ("aten.alias_copy.default", "aten.convolution.default", "aten.select_copy.int")
    },
    "adaptive_avg_pool3d_uneven": {
        "fp32": (
            "aten.alias_copy.default",
            "aten.convolution.default",
            "aten.mean.dim",
            "aten.select_copy.int",
        )
    },
    "adaptive_max_pool2d_uneven": {
        # At 8a8w a slice reads the int8 input and feeds max.dim (float, outside the delegate):
        # XNNPACK's static slice takes one datatype in and out, so qnn_compile's XNNPACK
        # lowering leaves such a slice to the portable kernels.
        "8a8w": ("aten.max.dim", "aten.slice_copy.Tensor", "aten.unsqueeze_copy.default"),
        "*": ("aten.max.dim", "aten.unsqueeze_copy.default"),
    },
    "argsort": {"*": ("aten.topk.default",)},
    "avg_pool3d": {
        "fp32": ("aten.alias_copy.default", "aten.convolution.default", "aten.select_copy.int")
    },
    "avg_pool3d_pad_ceil": {
        "fp32": (
            "aten.alias_copy.default",
            "aten.avg_pool2d.default",
            "aten.convolution.default",
            "aten.select_copy.int",
        )
    },
    "conv3d": {"fp32": ("aten.convolution.default", "aten.select_copy.int")},
    "max_pool3d": {
        "fp32": ("aten.alias_copy.default", "aten.convolution.default", "aten.select_copy.int")
    },
    "max_pool3d_pad_s2": {
        "fp32": ("aten.alias_copy.default", "aten.convolution.default", "aten.select_copy.int")
    },
    "scatter_reduce_amax": {
        "*": (
            "aten.amax.default",
            "aten.arange.start_step",
            "aten.eq.Tensor",
            "aten.full_like.default",
            "aten.gt.Scalar",
            "aten.sum.dim_IntList",
            "aten.unsqueeze_copy.default",
            "aten.view_copy.default",
            "aten.where.self",
        )
    },
    "scatter_reduce_amin": {
        "*": (
            "aten.amin.default",
            "aten.arange.start_step",
            "aten.eq.Tensor",
            "aten.full_like.default",
            "aten.gt.Scalar",
            "aten.sum.dim_IntList",
            "aten.unsqueeze_copy.default",
            "aten.view_copy.default",
            "aten.where.self",
        )
    },
    "scatter_reduce_mean": {
        "*": (
            "aten.add.Tensor",
            "aten.arange.start_step",
            "aten.eq.Tensor",
            "aten.full_like.default",
            "aten.gt.Scalar",
            "aten.sum.dim_IntList",
            "aten.unsqueeze_copy.default",
            "aten.view_copy.default",
            "aten.where.self",
            "dim_order_ops._to_dim_order_copy.default",
        )
    },
    "scatter_reduce_sum": {
        "*": (
            "aten.arange.start_step",
            "aten.eq.Tensor",
            "aten.full_like.default",
            "aten.gt.Scalar",
            "aten.sum.dim_IntList",
            "aten.unsqueeze_copy.default",
            "aten.view_copy.default",
            "aten.where.self",
        )
    },
    "sort": {"*": ("aten.topk.default",)},
    "sort_descending_dim0": {"*": ("aten.topk.default",)},
    "grid_sample_3d": {
        "fp32": (
            "aten.alias_copy.default",
            "aten.bitwise_and.Tensor",
            "aten.convolution.default",
            "aten.expand_copy.default",
            "aten.full.default",
            "aten.full_like.default",
            "aten.gather.default",
            "aten.ge.Scalar",
            "aten.le.Scalar",
            "aten.select_copy.int",
            "aten.where.self",
            "dim_order_ops._to_dim_order_copy.default",
        )
    },
    "grid_sample_3d_nearest_border": {
        "fp32": (
            "aten.alias_copy.default",
            "aten.bitwise_and.Tensor",
            "aten.convolution.default",
            "aten.expand_copy.default",
            "aten.full_like.default",
            "aten.gather.default",
            "aten.ge.Scalar",
            "aten.le.Scalar",
            "aten.round.default",
            "aten.select_copy.int",
            "aten.where.self",
            "dim_order_ops._to_dim_order_copy.default",
        )
    },
    "rand_like": {
        "*": ("aten.lt.Scalar", "aten.rand.default", "dim_order_ops._to_dim_order_copy.default")
    },
    "randn_like": {
        "*": (
            "aten.eq.Tensor",
            "aten.mul.Tensor",
            "aten.ne.Scalar",
            "aten.randn.default",
            "dim_order_ops._to_dim_order_copy.default",
        )
    },
}
XNNPACK_OUTSIDE.update(DECOMPOSED_OUTSIDE)


BY_TARGET: dict[str, Outside] = {"xnnpack": XNNPACK_OUTSIDE, "qnn-v75": QNN_V75_OUTSIDE}


def delegation_rules(case: str) -> tuple[Rule, ...]:
    """The structure rules for `case` on every target with an entry for it."""
    rules = []
    for target, table in BY_TARGET.items():
        for precision, ops in table.get(case, {}).items():
            structure = (
                Structure(Delegation.PARTIAL, outside=frozenset(ops))
                if ops
                else Structure(Delegation.NONE)
            )
            rules.append(Rule(target, precision, structure=structure))
    return tuple(rules)
