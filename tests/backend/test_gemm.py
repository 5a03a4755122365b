"""Prefill's float32 matmul (ember/backend/gemm.py): torch.mm's results up to accumulation order,
and oneDNN only ever given blocks of BLOCK_ROWS rows."""

import pytest
import torch

from ember.backend import gemm


@pytest.mark.parametrize("rows", [1, 17, 63, 64, 100, 256, 300, 512, 777])
def test_matches_torch_mm_into_a_column_slice(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 200, generator=g), torch.randn(48, 200, generator=g)
    wide = torch.full((rows, 100), float("nan"))
    out = gemm.matmul_into(x, w, wide[:, 30:78])
    assert out.data_ptr() == wide[:, 30:78].data_ptr()
    torch.testing.assert_close(out, x @ w.t(), rtol=1e-5, atol=1e-4)
    assert wide[:, :30].isnan().all() and wide[:, 78:].isnan().all()


def test_onednn_sees_only_whole_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def linear(x: torch.Tensor, w: torch.Tensor, *rest: object) -> torch.Tensor:
        seen.append(x.shape[0])
        return x @ w.t()

    monkeypatch.setattr(gemm, "_LINEAR", linear)
    x, w = torch.randn(700, 32), torch.randn(8, 32)
    torch.testing.assert_close(gemm.matmul_into(x, w, torch.empty(700, 8)), x @ w.t())
    assert seen == [512, 64, 64]  # the last 60 rows: torch.mm
