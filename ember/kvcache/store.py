"""How one layer's keys and values are held: float (f32, f16, bf16) or quantized per block of 32
(q8_0, q4_0, as ggml's KV cache types), and read back as float32 for attention over a range.

Layout: keys and values of a layer share one buffer (2, H_kv, cells, D) when their sizes agree,
so a half-size or quantized cache converts both with one op. Quantization follows ggml's
reference code: q8_0 stores round(x / d) with d = max|x| / 127 (rounded half to even, as its
AVX2 path), q4_0 stores min(15, floor(x / d + 8.5)) with d = -(the signed value of largest
magnitude) / 8, both with d as float16, one scale per 32 values along D.
"""

import torch

QK = 32  # values per quantization block
FLOAT_TYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
QUANT_TYPES = ("q8_0", "q4_0")
KV_TYPES = (*FLOAT_TYPES, *QUANT_TYPES)
BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def kv_type_name(kind: str | torch.dtype) -> str:
    """The cache type name of kind: a name of KV_TYPES or a float torch dtype."""
    if isinstance(kind, torch.dtype):
        for name, dtype in FLOAT_TYPES.items():
            if dtype == kind:
                return name
        raise ValueError(f"no KV cache type holds {kind}")
    if kind not in KV_TYPES:
        raise ValueError(f"KV cache type {kind!r} is not one of {', '.join(KV_TYPES)}")
    return kind


class LayerStore:
    """One layer's keys (H, cells, Dk) and values (H, cells, Dv)."""

    def __init__(self, kind: str, heads: int, cells: int, k_dim: int, v_dim: int) -> None:
        if kind in QUANT_TYPES and (k_dim % QK or v_dim % QK):
            kind = "f16"  # ggml cannot block these head sizes either: keep them in float16
        self.kind, self.heads, self.cells = kind, heads, cells
        self.k_dim, self.v_dim = k_dim, v_dim
        self.joint = k_dim == v_dim
        if kind in FLOAT_TYPES:
            dtype = FLOAT_TYPES[kind]
            if self.joint:
                self.buf = torch.zeros(2, heads, cells, k_dim, dtype=dtype)
                self.k, self.v = self.buf[0], self.buf[1]
            else:
                self.k = torch.zeros(heads, cells, k_dim, dtype=dtype)
                self.v = torch.zeros(heads, cells, v_dim, dtype=dtype)
            self.tensors = [self.k, self.v] if not self.joint else [self.buf]
            return
        # quantized: codes (2, H, cells, D or D/2) and float16 scales (2, H, cells, D/32)
        packed = k_dim // 2 if kind == "q4_0" else k_dim
        if not self.joint:  # separate halves of the same layout
            self.parts = [QuantPart(kind, heads, cells, d) for d in (k_dim, v_dim)]
            self.tensors = [t for p in self.parts for t in (p.codes, p.scales)]
            return
        dtype = torch.uint8 if kind == "q4_0" else torch.int8
        self.codes = torch.zeros(2, heads, cells, packed, dtype=dtype)
        self.scales = torch.zeros(2, heads, cells, k_dim // QK, dtype=torch.float16)
        self.tensors = [self.codes, self.scales]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def put(
        self, locs: torch.Tensor, span: tuple[int, int] | None, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """k (T, H, Dk), v (T, H, Dv) into cells locs; span (start, end) when locs are a run."""
        kt, vt = k.transpose(0, 1), v.transpose(0, 1)  # (H, T, D)
        if self.kind in FLOAT_TYPES:
            _write(self.k, locs, span, kt)
            _write(self.v, locs, span, vt)
        elif not self.joint:
            self.parts[0].put(locs, span, kt)
            self.parts[1].put(locs, span, vt)
        else:
            codes, scales = quantize(self.kind, torch.stack((kt, vt)))
            _write(self.codes, locs, span, codes, dim=2)
            _write(self.scales, locs, span, scales, dim=2)

    def get(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (H, S, Dk) and values (H, S, Dv) of cells [lo, hi) as float32."""
        if self.kind == "f32":
            return self.k[:, lo:hi], self.v[:, lo:hi]
        if self.kind in FLOAT_TYPES:
            if self.joint:
                kv = self.buf[:, :, lo:hi].float()
                return kv[0], kv[1]
            return self.k[:, lo:hi].float(), self.v[:, lo:hi].float()
        if not self.joint:
            return self.parts[0].get(lo, hi), self.parts[1].get(lo, hi)
        kv = dequantize(self.kind, self.codes[:, :, lo:hi], self.scales[:, :, lo:hi])
        return kv[0], kv[1]

    def view(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Keys and values of cells [lo, hi) as stored, for a float kind; None otherwise."""
        if self.kind not in FLOAT_TYPES:
            return None
        return self.k[:, lo:hi], self.v[:, lo:hi]

    def keys_f32(self, cells: torch.Tensor) -> torch.Tensor:
        """The keys of cells (H, n, Dk) as float32 (for a shift)."""
        if self.kind in FLOAT_TYPES:
            return self.k[:, cells].float()
        if not self.joint:
            return self.parts[0].get_cells(cells)
        return dequantize(self.kind, self.codes[0][:, cells], self.scales[0][:, cells])

    def set_keys(self, cells: torch.Tensor, keys: torch.Tensor) -> None:
        """Writes keys (H, n, Dk) float32 back to cells."""
        if self.kind in FLOAT_TYPES:
            self.k[:, cells] = keys.to(self.k.dtype)
        elif not self.joint:
            self.parts[0].put(cells, None, keys)
        else:
            codes, scales = quantize(self.kind, keys)
            self.codes[0][:, cells] = codes
            self.scales[0][:, cells] = scales


class QuantPart:
    """Quantized keys or values of one layer when the two head sizes differ."""

    def __init__(self, kind: str, heads: int, cells: int, dim: int) -> None:
        self.kind = kind
        dtype = torch.uint8 if kind == "q4_0" else torch.int8
        self.codes = torch.zeros(heads, cells, dim // 2 if kind == "q4_0" else dim, dtype=dtype)
        self.scales = torch.zeros(heads, cells, dim // QK, dtype=torch.float16)

    def put(self, locs: torch.Tensor, span: tuple[int, int] | None, x: torch.Tensor) -> None:
        codes, scales = quantize(self.kind, x)
        _write(self.codes, locs, span, codes)
        _write(self.scales, locs, span, scales)

    def get(self, lo: int, hi: int) -> torch.Tensor:
        return dequantize(self.kind, self.codes[:, lo:hi], self.scales[:, lo:hi])

    def get_cells(self, cells: torch.Tensor) -> torch.Tensor:
        return dequantize(self.kind, self.codes[:, cells], self.scales[:, cells])


def _write(
    dst: torch.Tensor,
    locs: torch.Tensor,
    span: tuple[int, int] | None,
    src: torch.Tensor,
    dim: int = 1,
) -> None:
    """dst's cells (along dim) at locs = src, converted to dst's type."""
    if span is not None:  # one copy, converting as it goes
        dst.narrow(dim, span[0], span[1] - span[0]).copy_(src)
    else:
        dst.index_copy_(dim, locs, src.to(dst.dtype))


def quantize(kind: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) float32 -> codes (..., D) int8 or (..., D/2) uint8, scales (..., D/32) f16."""
    blocks = x.unflatten(-1, (-1, QK))
    if kind == "q8_0":
        d = blocks.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, 0.0, 1.0 / d)
        codes = (blocks * inv).round_().to(torch.int8).flatten(-2)
        return codes, d.squeeze(-1).half()
    # q4_0: the scale is the signed value of largest magnitude (the first such) over -8
    idx = blocks.abs().argmax(-1, keepdim=True)
    d = blocks.gather(-1, idx) / -8
    inv = torch.where(d == 0, 0.0, 1.0 / d)
    q = (blocks * inv).add_(8.5).floor_().clamp_(0, 15).to(torch.uint8)
    packed = q[..., : QK // 2] | (q[..., QK // 2 :] << 4)  # ggml: low nibbles the first half
    return packed.flatten(-2), d.squeeze(-1).half()


def dequantize(kind: str, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 values (..., D) of quantize's codes and scales."""
    d = scales.float().unsqueeze(-1)
    if kind == "q8_0":
        return (codes.unflatten(-1, (-1, QK)).float() * d).flatten(-2)
    packed = codes.unflatten(-1, (-1, QK // 2))
    q = torch.cat((packed & 15, packed >> 4), dim=-1)
    return ((q.float() - 8) * d).flatten(-2)
