"""RMSNorm over a prompt's rows, and its q and k heads' norm, rotation and scale, by the native
kernels, on every ISA path this CPU runs, against torch's; and torch's own where the kernels
cannot take x."""

import pytest
import torch
import torch.nn.functional as F
from native_isas import ISAS

from ember.backend import native
from ember.backend.norm import qk_rope_rows, rms_norm_rows
from ember.nn import RoPE, rms_norm

pytestmark = pytest.mark.skipif(not native.available(), reason="the native library was not built")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(1, 7), (3, 64), (5, 100), (512, 640), (4, 3, 256)])
@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "bare"])
def test_equals_torch_within_float32_rounding(monkeypatch, isa, shape, weighted):
    monkeypatch.setenv("EMBER_CPU_ISA", isa)
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g) * 3
    w = torch.randn(shape[-1], generator=g) if weighted else None
    got = rms_norm_rows(x, w, 1e-6)
    want = F.rms_norm(x.double(), shape[-1:], None if w is None else w.double(), 1e-6)
    assert got is not None and got.shape == x.shape and got.dtype == torch.float32
    assert float((got.double() - want).abs().max()) <= 1e-6 * float(want.abs().max())


def test_what_the_kernel_cannot_take_goes_to_torch():
    x = torch.randn(6, 32)
    assert rms_norm_rows(x.t(), None, 1e-6) is None  # not contiguous
    assert rms_norm_rows(x.double(), None, 1e-6) is None
    assert rms_norm_rows(x, torch.randn(2, 16), 1e-6) is None  # a weight over two dims
    w2 = torch.randn(3, 32)
    x3 = torch.randn(4, 3, 32)
    assert torch.allclose(rms_norm(x3, w2, 1e-6), F.rms_norm(x3, (3, 32), w2, 1e-6))
    assert torch.equal(rms_norm(x.t(), None, 1e-6), F.rms_norm(x.t(), (6,), None, 1e-6))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    ("rope_dim", "neox", "normed", "q_scale"),
    [(256, True, True, 0.0625), (64, False, False, 1.0), (32, True, True, 1.0)],
    ids=["gemma", "normal-bare", "partial"],
)
def test_qk_heads_equal_torchs_norm_rotation_and_scale(
    monkeypatch, isa, rope_dim, neox, normed, q_scale
):
    """Rotation.heads_of in one native pass against torch's ops on the same rows (q heads, k
    heads, then v's that stay out), from a row block of a wider qkv tensor."""
    monkeypatch.setenv("EMBER_CPU_ISA", isa)
    g = torch.Generator().manual_seed(rope_dim)
    tokens, q_heads, k_heads, dim = 37, 4, 2, rope_dim if rope_dim >= 64 else 64
    qkv = torch.randn(tokens, (q_heads + 2 * k_heads) * dim, generator=g) * 2
    norms = (torch.randn(dim, generator=g), torch.randn(dim, generator=g)) if normed else None
    rot = RoPE(rope_dim, 10_000.0, neox).rotation(
        torch.arange(100, 100 + tokens), dim, [(q_heads, q_scale), (k_heads, 1.0)]
    )
    heads = q_heads + k_heads
    got = qk_rope_rows(qkv, heads, dim, rot, norms, 1e-6)
    assert got is not None and got.shape == (tokens, heads, dim)
    want = qkv[:, : heads * dim].view(tokens, heads, dim)
    if norms is not None:
        want = F.rms_norm(want, (dim,), None, 1e-6)
        want = torch.cat((want[:, :q_heads] * norms[0], want[:, q_heads:] * norms[1]), 1)
    torch.testing.assert_close(got, rot(want), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr("ember.nn.rope.qk_rope_rows", lambda *args: None)  # torch's path
    torch.testing.assert_close(
        rot.heads_of(qkv, heads, dim, norms, 1e-6), got, rtol=1e-5, atol=1e-5
    )


def test_qk_heads_the_kernel_cannot_take_go_to_torch():
    rot = RoPE(16, 10_000.0, True).rotation(torch.arange(3), 16, [(2, 0.5), (1, 1.0)])
    qkv = torch.randn(3, 64)
    assert qk_rope_rows(qkv.double(), 3, 16, rot, None, 1e-6) is None
    assert qk_rope_rows(qkv[:2], 3, 16, rot, None, 1e-6) is None  # tables of 3 tokens
    three = RoPE(16, 10_000.0, True).rotation(torch.arange(3), 16, [(1, 0.5), (1, 1.0), (1, 2.0)])
    assert qk_rope_rows(qkv, 3, 16, three, None, 1e-6) is None
    assert qk_rope_rows(qkv, 3, 16, rot, (torch.ones(8), torch.ones(16)), 1e-6) is None
