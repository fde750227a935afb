"""Attention, recurrent cells, ops that update an input in place, and type conversions."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as fn
from torch import nn

from qnn_common.errors import ConfigValidationError
from qnn_testing.cases.base import (
    OpCase,
    concat,
    fn_case,
    lin_case,
    mod_case,
    nothing_to_quantize,
    qnn_lowering_fails,
    qnn_nothing_to_quantize,
    randn,
)
from qnn_testing.cases.conv import CONV3D_QNN
from qnn_testing.expect import Raises, Rule
from qnn_testing.structure import Delegation, Structure

F = "misc"


class _Sdpa(nn.Module):
    def __init__(self, causal: bool = False, masked: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.causal, self.masked = causal, masked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.reshape(2, 8, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        mask = None
        if self.masked:
            mask = torch.ones(8, 8).tril() - 1.0  # additive: 0 kept, -1 ... dampened
            mask = mask * 1e4
        return fn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)


class _Mha(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mha(x, x, x, need_weights=False)[0]
        return out


class _Cell(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.cell: nn.Module = nn.LSTMCell(16, 16) if kind == "lstm" else nn.GRUCell(16, 16)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> object:
        if self.kind == "lstm":
            return self.cell(x, (h, c))
        return self.cell(x, h)


class _Rnn(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.rnn: nn.Module = (nn.LSTM if kind == "lstm" else nn.GRU)(16, 16, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.rnn(x)[0]
        return out


class _InPlace(nn.Module):
    """Updates its input in place (the runtime returns the updated input too) and returns y."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.op = op

    def forward(self, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.fc(x)
        if self.op == "add_":
            buf.add_(y)
        elif self.op == "copy_":
            buf.copy_(y * 2.0)
        else:
            buf[:, :4] = y[:, :4]
        return y + 1.0


class _BufferUpdate(nn.Module):
    """Writes new rows into a registered buffer in place, the static-KV-cache pattern, and
    returns the buffer (or a value of it): the runtime must keep the write for the next call."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        initial = torch.randn(8, 16, generator=torch.Generator().manual_seed(7))
        self.register_buffer("cache", initial)
        self.op = op

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        rows: torch.Tensor = self.fc(x)
        cache = self.get_buffer("cache")
        if self.op == "index_copy":
            cache.index_copy_(0, pos, rows)
        elif self.op == "index_put":
            cache[pos] = rows
        elif self.op == "returned":
            cache.index_copy_(0, pos, rows)
            return cache
        else:
            cache[2:4] = rows
        return cache * 2.0


def _rows_and_positions(g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Two rows and two distinct row numbers of the 8-row buffer (duplicates would make the
    write order matter)."""
    return torch.randn(2, 16, generator=g), torch.randperm(8, generator=g)[:2]


# ExecuTorch's own check (`qnn_preprocess._check_io_binding`) refuses the fp16 program that adds
# into its input: QNN declares one graph output where the signature has two (measured).
INPLACE_QNN = qnn_lowering_fails(
    "fp16",
    "QNN's graph I/O does not match a program that updates its input in place",
    "QNN graph I/O does not match",
)

# The cast stays on the portable kernels; XNNPACK takes the float multiply after it (measured).
# At 8a8w the multiply is quantized (XNNPACK's quantizer annotates mul), so q/dq are expected.
INT_TO_FLOAT_XNNPACK = Rule(
    "xnnpack",
    structure=Structure(
        Delegation.PARTIAL,
        outside=frozenset({"dim_order_ops._to_dim_order_copy.default"}),
    ),
)
# LSTM / GRU export as whole aten.lstm / lstm_cell / gru_cell ops, which no host quantizer
# annotates: at 8a8w there is nothing to quantize, which is refused.
RNN_HOST = nothing_to_quantize("the LSTM / GRU ops (exported whole)")
# On QNN (V75): LPBQ finds no linear to block in them (measured on lstm); the cells' other
# quantized recipes quantize nothing (lstm_cell 16a16w, gru_cell 16a4w); the whole LSTM does
# quantize, but QNN then builds a graph with no inputs (16a8w).
_RNN_LPBQ = Rule(
    "qnn-*",
    "16a4w_block",
    outcome=Raises(
        ConfigValidationError,
        "the LSTM / GRU weights sit inside one whole op: no linear layer for LPBQ to block",
        match="block",
    ),
)
RNN_CELL_QNN = (_RNN_LPBQ, qnn_nothing_to_quantize("the LSTM / GRU cell ops (exported whole)"))
class _GridSample3d(nn.Module):
    """A 1x1x1 conv (the layer in front), then trilinear / nearest 3-D sampling."""

    def __init__(self, mode: str, padding: str) -> None:
        super().__init__()
        self.conv = nn.Conv3d(2, 2, 1)
        self.mode, self.padding = mode, padding

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return fn.grid_sample(
            self.conv(x), grid, mode=self.mode, padding_mode=self.padding, align_corners=False
        )


seq = randn((2, 8, 16))
state = randn((4, 16), (4, 16), (4, 16))

# grid_sampler_3d is outside the Core ATen opset (edge refuses it): rewritten as gathers.
GRID_3D = (*nothing_to_quantize("conv3d and grid_sample"), *CONV3D_QNN)
grid_inputs = concat(randn((1, 2, 4, 5, 6)), randn((1, 3, 4, 2, 3), scale=0.7))

CASES: tuple[OpCase, ...] = (
    mod_case(
        "grid_sample_3d",
        F,
        lambda: _GridSample3d("bilinear", "zeros"),
        grid_inputs,
        rules=GRID_3D,
    ),
    mod_case(
        "grid_sample_3d_nearest_border",
        F,
        lambda: _GridSample3d("nearest", "border"),
        grid_inputs,
        rules=GRID_3D,
    ),
    # Random ops outside Core ATen, rewritten as rand / randn: the values are checked where they
    # cannot differ (a uniform sample is below 1; a normal one is finite).
    lin_case("rand_like", F, lambda a: a + (torch.rand_like(a) < 1.0).to(a.dtype), randn((4, 16))),
    lin_case(
        "randn_like",
        F,
        lambda a: a * torch.isfinite(torch.randn_like(a)).to(a.dtype),
        randn((4, 16)),
    ),
    mod_case("sdpa", F, _Sdpa, seq, linear=True, qnn=True),
    mod_case(
        "sdpa_causal",
        F,
        lambda: _Sdpa(causal=True),
        seq,
        linear=True,
    ),
    mod_case(
        "sdpa_additive_mask",
        F,
        lambda: _Sdpa(masked=True),
        seq,
        linear=True,
    ),
    mod_case("multihead_attention", F, _Mha, seq, linear=True),
    mod_case(
        "lstm_cell",
        F,
        lambda: _Cell("lstm"),
        state,
        linear=True,
        rules=(*RNN_HOST, *RNN_CELL_QNN),
        note="two outputs (h, c)",
    ),
    mod_case(
        "gru_cell", F, lambda: _Cell("gru"), state, linear=True, rules=(*RNN_HOST, *RNN_CELL_QNN)
    ),
    mod_case("lstm", F, lambda: _Rnn("lstm"), seq, linear=True, rules=(*RNN_HOST, _RNN_LPBQ)),
    mod_case(
        "inplace_add_input",
        F,
        lambda: _InPlace("add_"),
        randn((4, 16), (4, 16)),
        linear=True,
        rules=(INPLACE_QNN,),
        note="updates an input in place",
    ),
    mod_case(
        "inplace_slice_assign",
        F,
        lambda: _InPlace("slice"),
        randn((4, 16), (4, 16)),
        linear=True,
        note="updates an input in place",
    ),
    *(
        mod_case(
            f"buffer_{op}",
            F,
            functools.partial(_BufferUpdate, op),
            _rows_and_positions,
            linear=True,
            rules=(),
            note="updates a registered buffer in place (a static KV cache)",
        )
        for op in ("index_copy", "index_put", "slice", "returned")
    ),
    lin_case("relu_inplace_intermediate", F, lambda a: torch.relu_(a * 1.0), randn((4, 16))),
    lin_case(
        "to_int_and_back", F, lambda a: (a * 4).to(torch.int32).to(torch.float32), randn((4, 16))
    ),
    lin_case(
        "arange_add", F, lambda a: a + torch.arange(16, dtype=torch.float32) / 16, randn((4, 16))
    ),
    lin_case("triu", F, lambda a: torch.triu(a, diagonal=1), randn((16, 16))),
    lin_case(
        "zeros_output",
        F,
        lambda a: (a * 0.0, a),
        randn((4, 16)),
        note="an all-zero output next to a real one",
    ),
    fn_case(
        "int_to_float",
        F,
        lambda a: a.to(torch.float32) * 0.5,
        concat(lambda g: (torch.randint(-8, 8, (4, 16), generator=g),)),
        rules=(INT_TO_FLOAT_XNNPACK,),
        note="integer input, float output",
    ),
)
