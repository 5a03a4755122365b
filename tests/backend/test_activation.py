"""The gated MLP's act(gate) * up in one native call, on every ISA path this CPU runs, against
torch's silu and tanh-GELU; and torch's own where the kernels cannot run. gated_mlp frees the
gate/up product before the down projection runs, and a prompt's never makes it whole."""

import weakref

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT
from native_isas import ISAS
from quant_data import quantized

from ember.backend import native
from ember.backend.activation import act_mul, gated_mlp
from ember.backend.precision import gemm8_prefill, gemm16_prefill
from ember.backend.weights import LinearWeight, NativeLinear

pytestmark = pytest.mark.skipif(not native.available(), reason="the native library was not built")


def reference(gate_up: torch.Tensor, ffn: int, act: str) -> torch.Tensor:
    gate, up = gate_up[:, :ffn].double(), gate_up[:, ffn:].double()
    return (F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")) * up


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(("rows", "ffn"), [(1, 5), (3, 8), (7, 37), (512, 2048)])
def test_act_mul_equals_torch_within_float32_rounding(monkeypatch, isa, act, rows, ffn):
    monkeypatch.setenv("EMBER_CPU_ISA", isa)
    gate_up = torch.randn(rows, 2 * ffn, generator=torch.Generator().manual_seed(rows)) * 4
    got = act_mul(gate_up, ffn, act)
    want = reference(gate_up, ffn, act)
    assert got.shape == (rows, ffn) and got.dtype == torch.float32
    scale = want.abs().max()
    assert float((got.double() - want).abs().max()) <= 1e-6 * float(scale)


def test_rows_may_be_a_wider_tensors_view(monkeypatch):
    wide = torch.randn(6, 50)
    gate_up = wide[:, 3:43]  # rows 50 floats apart, 2 × 20 wide
    assert torch.allclose(act_mul(gate_up, 20, "silu"), reference(gate_up, 20, "silu").float())


def test_a_path_without_the_kernels_takes_torch(monkeypatch):
    monkeypatch.setattr(native, "usable_kernels", lambda: None)
    gate_up = torch.randn(4, 16)
    want = F.gelu(gate_up[:, :8], approximate="tanh") * gate_up[:, 8:]
    assert torch.equal(act_mul(gate_up, 8, "gelu_tanh"), want)


def test_gated_mlp_frees_the_gate_up_product_before_down_runs():
    g = torch.Generator().manual_seed(3)
    gate_up = LinearWeight.from_dense(torch.randn(2 * 12, 8, generator=g))
    down = LinearWeight.from_dense(torch.randn(8, 12, generator=g))
    products: list[weakref.ref] = []

    class Watched:
        out_features = gate_up.out_features

        def __call__(self, x):
            y = gate_up(x)
            products.append(weakref.ref(y))
            return y

    def down_after_the_product_is_gone(h):
        assert products and products[0]() is None, "the gate/up product is still alive"
        return down(h)

    x = torch.randn(5, 8, generator=g)
    got = gated_mlp(x, Watched(), down_after_the_product_is_gone, "silu")
    assert torch.equal(got, down(act_mul(gate_up(x), 12, "silu")))


def test_act_mul_writes_into_a_column_slice():
    gate_up = torch.randn(5, 2 * 12)
    wide = torch.full((5, 30), float("nan"))
    got = act_mul(gate_up, 12, "gelu_tanh", out=wide[:, 7:19])
    assert got.data_ptr() == wide[:, 7:19].data_ptr()
    assert torch.equal(wide[:, 7:19], act_mul(gate_up, 12, "gelu_tanh"))
    assert wide[:, :7].isnan().all() and wide[:, 19:].isnan().all()


@pytest.mark.parametrize(
    ("kernels", "int8"),
    [(True, False), (True, True), (False, False)],
    ids=["native", "int8", "torch"],
)
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_a_prompts_gated_mlp_goes_by_blocks_of_the_gate(monkeypatch, kernels, int8, act):
    """On the float32 path (and gemm8's or gemm16's, where the ISA path has them) the gate's rows
    go a block at a time with the up's (blocks of 7 of the 20 here, the last shorter): the result
    is the whole product's, and no tensor of the whole product's size (T, 2 ffn) is ever made."""
    monkeypatch.setattr("ember.backend.weights.CHUNK_ROWS", 7)
    ffn, dim, rows = 20, 64, 40
    g = torch.Generator().manual_seed(5)
    raw = quantized(QT.Q8_0, (2 * ffn, dim), seed=1)
    gate_up = NativeLinear(raw, QT.Q8_0, 2 * ffn, dim, kernels=kernels, prefill_int8=int8)
    down = LinearWeight.from_dense(torch.randn(dim, ffn, generator=g))
    x = torch.randn(rows, dim, generator=g)
    assert gate_up.takes_int8(rows) == (int8 and gemm8_prefill(gate_up.isa, QT.Q8_0))
    assert gate_up.takes_int16(rows) == (
        not gate_up.takes_int8(rows) and gemm16_prefill(gate_up.isa, QT.Q8_0)
    )
    assert gate_up.takes_dense(rows) != gate_up.takes_codes(rows)
    want = down(act_mul(gate_up(x), ffn, act))
    made: list[tuple[int, ...]] = []
    empty = torch.Tensor.new_empty

    def watched(self, *size, **kwargs):
        made.append(tuple(size[0]) if len(size) == 1 else size)
        return empty(self, *size, **kwargs)

    monkeypatch.setattr(torch.Tensor, "new_empty", watched)
    got = gated_mlp(x, gate_up, down, act)
    assert (rows, 2 * ffn) not in made and (rows, 14) in made
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
