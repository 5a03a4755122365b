"""gpt-oss checkpoints: biased attention with a sink per head, a biased router, and experts
stored whole in 3-D tensors (gate and up interleaved) that become llama.cpp's
`ffn_{gate,up,down}_exps`: float ones transposed, MXFP4 ones (`*_blocks` + `*_scales`, as
released) repacked into GGUF's MXFP4 blocks without a change of value."""

import re
from collections.abc import Callable
from typing import Any

import torch

from ember.convert.decoder import Combined, TextDecoder
from ember.convert.source import ConvertError, HFConfig
from ember.gguf import GGMLType

_EXPERTS = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?")
_PACKED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)_blocks")
_SINKS = re.compile(r"model\.layers\.(\d+)\.self_attn\.sinks")
_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "post_attention_norm",
    "mlp.router": "ffn_gate_inp",
}
Part = Callable[[torch.Tensor], torch.Tensor]


def _even(t: torch.Tensor) -> torch.Tensor:
    return t[..., ::2]


def _odd(t: torch.Tensor) -> torch.Tensor:
    return t[..., 1::2]


def _swap(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


class GptOssDecoder(TextDecoder):
    arch = "gpt-oss"
    layer_names = _NAMES

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        self.num_experts = c.int("num_local_experts", maximum=4096)
        self.num_experts_used = c.int("num_experts_per_tok", maximum=self.num_experts)
        self.window = c.int("sliding_window", maximum=1 << 28)
        self.rope = c.rope()
        self.rope_type = self.rope.get("rope_type", self.rope.get("type", "default"))
        if self.rope_type not in ("default", "yarn"):
            raise ConvertError(f"gpt-oss: RoPE scaling {self.rope_type!r} is not supported")
        types = c.get("layer_types", [])
        alternating = ["sliding_attention", "full_attention"] * self.num_layers
        if types and types != alternating[: self.num_layers]:
            raise ConvertError("gpt-oss: only sliding-window layers alternating with full ones")
        if c.float("swiglu_limit", 7.0) != 7.0 or c.float("swiglu_alpha", 1.702) != 1.702:
            raise ConvertError("gpt-oss: swiglu_limit 7 and swiglu_alpha 1.702 only")

    def split(self, hf_name: str) -> dict[str, Part]:
        if (m := _SINKS.fullmatch(hf_name)) is not None:
            return {f"blk.{m.group(1)}.attn_sinks.weight": _same}
        if (m := _EXPERTS.fullmatch(hf_name)) is None:
            return super().split(hf_name)
        p, kind = f"blk.{m.group(1)}.", "bias" if m.group(3) else "weight"
        if m.group(2) == "down_proj":
            return {f"{p}ffn_down_exps.{kind}": _same if m.group(3) else _swap}
        if m.group(3):  # gate and up interleaved along the last axis
            return {f"{p}ffn_gate_exps.bias": _even, f"{p}ffn_up_exps.bias": _odd}
        return {
            f"{p}ffn_gate_exps.weight": lambda t: _even(t).transpose(-1, -2),
            f"{p}ffn_up_exps.weight": lambda t: _odd(t).transpose(-1, -2),
        }

    def combined(self, hf_names: list[str]) -> dict[str, Combined]:
        out, names = {}, set(hf_names)
        for m in filter(None, map(_PACKED.fullmatch, hf_names)):
            blocks = m.group(0)
            scales = blocks.removesuffix("_blocks") + "_scales"
            if scales not in names:
                raise ConvertError(f"{blocks!r} comes without {scales!r}")
            p, e, c, f = f"blk.{m.group(1)}.", self.num_experts, self.hidden, self.ffn
            if m.group(2) == "down_proj":
                out[p + "ffn_down_exps.weight"] = _mxfp4((blocks, scales), (e, c, f), slice(None))
            else:  # rows alternate gate, up
                out[p + "ffn_gate_exps.weight"] = _mxfp4(
                    (blocks, scales), (e, f, c), slice(0, None, 2)
                )
                out[p + "ffn_up_exps.weight"] = _mxfp4(
                    (blocks, scales), (e, f, c), slice(1, None, 2)
                )
        return out

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        shapes = {n: s for n, s in shapes.items() if not n.endswith("ffn_norm.weight")}
        c, f, e, h = self.hidden, self.ffn, self.num_experts, self.num_heads
        q, kv = h * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = {
            "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,),
            "attn_output.bias": (c,), "attn_sinks.weight": (h,), "post_attention_norm.weight": (c,),
            "ffn_gate_inp.bias": (e,), "ffn_gate_exps.bias": (e, f), "ffn_up_exps.bias": (e, f),
            "ffn_down_exps.bias": (e, c),
        }  # fmt: skip
        for i in range(self.num_layers):
            shapes |= {f"blk.{i}.{n}": s for n, s in per_layer.items()}
        return shapes, (required & set(shapes)) | {n for n in shapes if n.startswith("blk.")}

    def ffn_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f, e = self.hidden, self.ffn, self.num_experts
        return {
            "ffn_gate_inp.weight": (e, c),
            "ffn_gate_exps.weight": (e, f, c),
            "ffn_up_exps.weight": (e, f, c),
            "ffn_down_exps.weight": (e, c, f),
        }

    def metadata(self) -> dict[str, Any]:
        a, rope = self.arch, HFConfig(self.rope, "rope")
        meta = super().metadata() | self.expert_metadata(
            self.num_experts, self.num_experts_used, self.ffn
        ) | {
            f"{a}.rope.freq_base": rope.float("rope_theta", 150000.0),
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.attention.sliding_window": self.window,
        }
        if self.rope_type == "yarn":
            meta |= {
                f"{a}.rope.scaling.type": "yarn",
                f"{a}.rope.scaling.factor": rope.float("factor"),
                f"{a}.rope.scaling.original_context_length": rope.int(
                    "original_max_position_embeddings", 4096
                ),
            }
        return meta


def _mxfp4(sources: tuple[str, str], shape: tuple[int, int, int], rows: slice) -> Combined:
    return Combined(
        sources, shape, GGMLType.MXFP4, lambda t: mxfp4_blocks(t[0][:, rows], t[1][:, rows])
    )


def mxfp4_blocks(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """OpenAI's MXFP4 (blocks (..., G, 16): value 2i in the low nibble of byte i, 2i + 1 in its
    high one; scales (..., G): the E8M0 exponents) as GGUF's MXFP4 bytes (..., G * 17): each
    block its exponent, then byte j holding value j low and value j + 16 high."""
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # (..., G, 32)
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    return torch.cat([scales[..., None], packed], dim=-1).flatten(-2).contiguous()
