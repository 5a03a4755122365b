"""A whole decoder layer for a few tokens in one native call (native/layer.h): norms, the weight
products, bias, q/k norms, RoPE, the KV cache write, attention, activation and residuals, where
the Python layer dispatches ~35 torch ops. A model binds each layer once (`NativeLayer.bind`,
None where its weights or shape do not fit) and runs a decode step through them when every
layer's cache is stored as floats (`run`); anything else takes the Python layers."""

import ctypes
import weakref
from dataclasses import dataclass

import torch

from ember.backend import native
from ember.backend.weights import AnyLinear, FusedLinear, NativeLinear

MAX_ROWS = 16  # tokens a call takes (the matmul kernels' small-batch range)
ACT_SILU, ACT_GELU_TANH = 0, 1
_KV_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_i64, _i32, _ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p


class _Lin(ctypes.Structure):
    _fields_ = [("type", _i32), ("passes", _i32), ("data", _ptr), ("n", _i64), ("k", _i64)]


class LayerArgs(ctypes.Structure):
    """layer.h's em_layer, field for field."""

    _fields_ = [
        *[(n, _i64) for n in ("M", "C", "H", "Hkv", "D", "Dv", "F", "rope_dim")],
        *[(n, _i32) for n in ("neox", "act", "kv_type", "pad")],
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        *[(n, _ptr) for n in ("cos", "sin", "attn_norm", "qkv_bias", "q_norm", "k_norm")],
        *[(n, _ptr) for n in ("post_attn_norm", "ffn_norm", "post_ffn_norm")],
        ("qkv", _Lin * 3),
        ("gate_up", _Lin * 2),
        ("out", _Lin),
        ("down", _Lin),
        ("kc", _ptr),
        ("vc", _ptr),
        *[(n, _i64) for n in ("k_hs", "k_cs", "v_hs", "v_cs")],
        ("locs", _ptr),
        ("lo", _i64),
        ("S", _i64),
        ("mask", _ptr),
        ("x", _ptr),
    ]


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    ffn: int
    rope_dim: int
    neox: bool
    eps: float
    scale: float  # the attention scores' scale (queries are not prescaled here)
    act: int = ACT_SILU


@dataclass(frozen=True)
class StepView:
    """What one layer's cache gives a step: where the batch's cells are and what it sees."""

    locs: torch.Tensor  # (M,) int64
    lo: int
    cells: int
    mask: torch.Tensor | None  # (M, cells) float32

    def fields(self) -> tuple[int, int, int, int | None]:
        """(locs, lo, S, mask) as the native layer takes them: the tensors' addresses (kept
        alive by the view)."""
        mask = None if self.mask is None else self.mask.data_ptr()
        return self.locs.data_ptr(), self.lo, self.cells, mask


def _parts(w: AnyLinear, most: int) -> list[NativeLinear] | None:
    parts = w.parts if isinstance(w, FusedLinear) else [w]
    if len(parts) > most or not all(isinstance(p, NativeLinear) and p.isa for p in parts):
        return None
    return parts  # type: ignore[return-value]


def _set(lin: _Lin, w: NativeLinear) -> None:
    lin.type, lin.passes, lin.data = w.ggml_type, w.activation_passes, w.raw.data_ptr()
    lin.n, lin.k = w.out_features, w.in_features


def _ptr_of(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class NativeLayer:
    """One decoder layer's weights bound for ember_layer."""

    def __init__(self, args: LayerArgs, kernels: "native.Kernels", keep: list[object]) -> None:
        self.args, self.kernels, self._keep = args, kernels, keep
        self._address = ctypes.addressof(args)
        # the cache tensors the args point into, weakly (a dropped cache is freed), so that a
        # step sets only what changes (~3.5 us a layer of Python saved, of ~7.5)
        self._cache: tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor]] | None = None

    @classmethod
    def bind(
        cls,
        shape: LayerShape,
        *,
        attn_norm: torch.Tensor,
        qkv: AnyLinear,
        attn_output: AnyLinear,
        ffn_norm: torch.Tensor,
        gate_up: AnyLinear,
        down: AnyLinear,
        qkv_bias: torch.Tensor | None = None,
        q_norm: torch.Tensor | None = None,
        k_norm: torch.Tensor | None = None,
        post_attn_norm: torch.Tensor | None = None,
        post_ffn_norm: torch.Tensor | None = None,
    ) -> "NativeLayer | None":
        """The layer, or None where the native call cannot run it (no library, a weight on the
        torch path, more parts than it takes)."""
        qkv_parts, gu_parts = _parts(qkv, 3), _parts(gate_up, 2)
        out_parts, down_parts = _parts(attn_output, 1), _parts(down, 1)
        if not (qkv_parts and gu_parts and out_parts and down_parts):
            return None
        isas = {p.isa for p in [*qkv_parts, *gu_parts, *out_parts, *down_parts]}
        if len(isas) != 1:
            return None
        kernels = native.kernels(isas.pop())
        if kernels is None:
            return None
        s = shape
        keep = [
            t.float().contiguous() if t is not None else None
            for t in (attn_norm, qkv_bias, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffn_norm)
        ]
        args = LayerArgs(
            C=s.hidden, H=s.heads, Hkv=s.kv_heads, D=s.head_dim, Dv=s.value_dim, F=s.ffn,
            rope_dim=s.rope_dim, neox=int(s.neox), act=s.act, eps=s.eps, scale=s.scale,
        )  # fmt: skip
        names = ("attn_norm", "qkv_bias", "q_norm", "k_norm", "post_attn_norm", "ffn_norm")
        for name, t in zip((*names, "post_ffn_norm"), keep, strict=True):
            setattr(args, name, _ptr_of(t))
        for lin, w in zip(args.qkv, qkv_parts, strict=False):
            _set(lin, w)
        for lin, w in zip(args.gate_up, gu_parts, strict=False):
            _set(lin, w)
        _set(args.out, out_parts[0])
        _set(args.down, down_parts[0])
        return cls(args, kernels, [*keep, qkv, gate_up, attn_output, down])

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[int, int],
        keys: torch.Tensor,
        values: torch.Tensor,
        view: tuple[int, int, int, int | None],
        threads: int,
    ) -> None:
        """x (M, C) float32 contiguous, updated in place; rope: the addresses of cos and sin
        (M, rope_dim/2) float32 contiguous; keys (H_kv, cells, D) and values of one float type,
        unit stride along D; view: StepView.fields() of the layer's cache."""
        a = self.args
        if self._cache is None or self._cache[0]() is not keys or self._cache[1]() is not values:
            self._bind_cache(keys, values)
        a.M, a.x = x.shape[0], x.data_ptr()
        a.cos, a.sin = rope
        a.locs, a.lo, a.S, a.mask = view
        rc = self.kernels.layer(self._address, threads)
        if rc:
            raise native.NativeError(f"the native layer failed ({rc})")

    def _bind_cache(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        a = self.args
        a.kv_type = _KV_TYPES[keys.dtype]
        a.kc, a.vc = keys.data_ptr(), values.data_ptr()
        a.k_hs, a.k_cs = keys.stride(0), keys.stride(1)
        a.v_hs, a.v_cs = values.stride(0), values.stride(1)
        self._cache = weakref.ref(keys), weakref.ref(values)
