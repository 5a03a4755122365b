"""The gated MLP's act(gate) * up in one native call, on every ISA path this CPU runs, against
torch's silu and tanh-GELU; and torch's own where the kernels cannot run. gated_mlp frees the
gate/up product before the down projection runs."""

import weakref

import pytest
import torch
import torch.nn.functional as F
from native_isas import ISAS

from ember.backend import native
from ember.backend.activation import act_mul, gated_mlp
from ember.backend.weights import LinearWeight

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
