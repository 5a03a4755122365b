"""A gated MLP's act(gate) * up over a batch's rows in one native call (layer.h's em_act_mul:
eight values at a time, the rows shared among the threads), where torch takes two passes and a
scalar tanh: per Gemma 3 layer of a 512-token prompt 2.37 ms in torch, 0.44 ms here (2 threads,
AVX2; benchmarks/bench_activation.py). Torch computes it where the kernels cannot run."""

import torch
import torch.nn.functional as F

from ember.backend import native
from ember.backend.weights import AnyLinear, NativeLinear

_ACTS = {"silu": 0, "gelu_tanh": 1}


def act_mul(
    gate_up: torch.Tensor, ffn: int, act: str, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """act(gate) * up for gate_up (T, 2 ffn) = [gate | up], act "silu" or "gelu_tanh"; into
    `out` (T, ffn; a column slice of a wider tensor may do) where given."""
    kern = native.usable_kernels()
    if (
        kern is None
        or gate_up.dtype != torch.float32
        or gate_up.dim() != 2
        or gate_up.stride(1) != 1
        or (out is not None and (out.dtype != torch.float32 or out.stride(1) != 1))
    ):
        gate, up = gate_up[:, :ffn], gate_up[:, ffn:]
        y = (F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")) * up
        return y if out is None else out.copy_(y)
    if out is None:
        out = torch.empty(gate_up.shape[0], ffn)
    elif out.shape != (gate_up.shape[0], ffn):
        raise ValueError(f"act_mul(out=) needs ({gate_up.shape[0]}, {ffn}), got {tuple(out.shape)}")
    native.set_threads(torch.get_num_threads())
    rows, ld = gate_up.shape[0], gate_up.stride(0)
    rc = kern.act_mul(_ACTS[act], gate_up.data_ptr(), rows, ffn, ld, out.data_ptr(), out.stride(0))
    if rc != 0:
        raise native.NativeError(f"act_mul({act}, {tuple(gate_up.shape)}, {ffn}) failed: {rc}")
    return out


def gated_mlp(x: torch.Tensor, gate_up: AnyLinear, down: AnyLinear, act: str) -> torch.Tensor:
    """down(act(gate) * up) of x (T, C) through a fused [gate | up] projection. The (T, 2 ffn)
    product is freed once the activation has read it, before down runs: held to the end, it
    was 32 of the ~125 MB a 3B model's layer takes over a 512-token batch. Where the projection
    takes the float32 path (prefill), that product is never whole (_act_by_blocks)."""
    ffn = gate_up.out_features // 2
    if (
        isinstance(gate_up, NativeLinear)
        and x.dim() == 2
        and (gate_up.takes_dense(x.shape[0]) or gate_up.takes_codes(x.shape[0]))
    ):
        return down(_act_by_blocks(x, gate_up, ffn, act))
    return down(act_mul(gate_up(x), ffn, act))


def _act_by_blocks(x: torch.Tensor, gate_up: NativeLinear, ffn: int, act: str) -> torch.Tensor:
    """act(gate) * up a block of the gate's rows at a time, with the same block of the up's, so
    the product is a (T, 2 block) buffer, never (T, 2 ffn): a 3B model's 512-token batch made
    its 32 MiB anew in every layer (glibc maps an allocation that large afresh each time: 8,192
    page faults), and it was live at the prompt's peak memory."""
    x = x.float().contiguous()
    block = min(gate_up.chunk_rows, ffn)
    product = x.new_empty(x.shape[0], 2 * block)
    out = x.new_empty(x.shape[0], ffn)
    if gate_up.takes_codes(x.shape[0]):
        xq = gate_up.quantize_rows(x)  # once for every block

        def rows_into(start: int, stop: int, dst: torch.Tensor) -> None:
            gate_up.codes_into(xq, start, stop, dst)
    else:
        chunk = torch.empty(block, gate_up.in_features)  # the weight rows, expanded

        def rows_into(start: int, stop: int, dst: torch.Tensor) -> None:
            gate_up.dense_into(x, start, stop, dst, chunk)

    for first in range(0, ffn, block):
        n = min(block, ffn - first)
        rows_into(first, first + n, product[:, :n])
        rows_into(ffn + first, ffn + first + n, product[:, n : 2 * n])
        act_mul(product[:, : 2 * n], n, act, out=out[:, first : first + n])
    return out
