"""RMSNorm over a prompt's rows by the native kernel, on every ISA path this CPU runs, against
torch's; and torch's own where the kernel cannot take x."""

import pytest
import torch
import torch.nn.functional as F
from native_isas import ISAS

from ember.backend import native
from ember.backend.norm import rms_norm_rows
from ember.nn import rms_norm

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
