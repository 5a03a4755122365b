"""Gemma 3n checkpoints (Gemma3nForCausalLM, and the text model of Gemma3nForConditionalGeneration)
with Ollama's `gemma3n` keys and names: AltUp's (`altup.*`, `altup_proj` and
`altup_unembd_proj` stacked from their per-stream projections), LAuReL's, the per-layer
embeddings, the sliding pattern, the shared-KV layers, each layer's MLP width, and each layer's
activation sparsity as the normal quantile of its target (0 where there is none), as Ollama's
converter writes them; norm weights as they are (Gemma 3n's RMSNorm has no +1), and the final
logit softcap where the config has one (transformers applies it). The vision and audio towers
are left out: Ember runs Gemma 3n's text only."""

import re
from statistics import NormalDist
from typing import Any

from ember.convert.gemma_text import KINDS, GemmaTextDecoder, text_name
from ember.convert.source import ConvertError, HFConfig

_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "post_feedforward_layernorm": "post_ffw_norm", "per_layer_input_gate": "inp_gate",
    "per_layer_projection": "proj", "post_per_layer_input_norm": "post_norm",
    "altup.modality_router": "altup_router", "altup.router_norm": "altup_router_norm",
    "altup.prediction_coefs": "altup_predict_coef", "altup.correction_coefs": "altup_correct_coef",
    "laurel.linear_left": "laurel_l", "laurel.linear_right": "laurel_r",
    "laurel.post_laurel_norm": "laurel_post_norm",
}  # fmt: skip
_TENSORS = {f"{hf}.weight": f"{ours}.weight" for hf, ours in _LAYER.items()} | {
    "altup.correct_output_scale": "altup_correct_scale.weight"
}
_STREAMS = re.compile(r"model\.altup_(unembed_)?projections\.(\d+)\.weight")


class Gemma3nDecoder(GemmaTextDecoder):
    arch = "gemma3n"
    layer_tensors = _TENSORS
    global_every = 5

    def text_config(self, config: HFConfig) -> HFConfig:
        text = super().text_config(config)
        widths = text.get("intermediate_size")
        if isinstance(widths, list):  # one per layer: the base reads the first
            return HFConfig({**text.values, "intermediate_size": widths[0] if widths else None,
                             "_widths": widths})  # fmt: skip
        return text

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c, n = self.text, self.num_layers
        self.read_layout()
        widths = c.get("_widths") or [self.ffn] * n
        if len(widths) != n or not all(isinstance(f, int) and f > 0 for f in widths):
            raise ConvertError("gemma3n: intermediate_size must give each layer's width")
        self.ffns = widths
        self.per_layer = c.int("hidden_size_per_layer_input", maximum=1 << 16)
        self.per_layer_vocab = c.int("vocab_size_per_layer_input", self.vocab_size, maximum=1 << 22)
        self.streams = c.int("altup_num_inputs", 4, maximum=64)
        self.laurel = c.int("laurel_rank", 64, maximum=1 << 16)
        sparsity = c.get("activation_sparsity_pattern") or [0.0] * n
        if len(sparsity) != n or not all(0.0 <= p < 1.0 for p in sparsity):
            raise ConvertError("gemma3n: activation_sparsity_pattern must give each layer's")
        self.sparsity = [NormalDist().inv_cdf(p) if p > 0 else 0.0 for p in sparsity]
        for kind in KINDS:
            if c.rope(kind).get("rope_type", "default") != "default":
                raise ConvertError("gemma3n: only default RoPE is supported")

    # ------------------------------------------------------------ names and shapes

    def stacked(self, hf_name: str) -> tuple[str, int] | None:
        """AltUp's per-stream projections, stacked as Ollama's `altup_proj` and
        `altup_unembd_proj`."""
        if m := _STREAMS.fullmatch(text_name(hf_name)):
            kind = "altup_unembd_proj" if m.group(1) else "altup_proj"
            return f"{kind}.weight", int(m.group(2))
        return None

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, p, n, d = self.hidden, self.per_layer, self.num_layers, self.head_dim
        shapes, required = self.top_shapes()
        extra = self.streams - 1
        top = {"per_layer_token_embd.weight": (self.per_layer_vocab, n * p),
               "per_layer_model_proj.weight": (n * p, c), "per_layer_proj_norm.weight": (p,),
               "altup_proj.weight": (extra, c, c), "altup_unembd_proj.weight": (extra, c, c)}
        shapes |= top
        required |= set(top)
        q, kv, s, r = self.num_heads * d, self.num_kv_heads * d, self.streams, self.laurel
        for i in range(n):
            f = self.ffns[i]
            layer = {
                "attn_norm.weight": (c,), "attn_q.weight": (q, c), "attn_q_norm.weight": (d,),
                "attn_output.weight": (c, q), "post_attention_norm.weight": (c,),
                "ffn_norm.weight": (c,), "ffn_gate.weight": (f, c), "ffn_up.weight": (f, c),
                "ffn_down.weight": (c, f), "post_ffw_norm.weight": (c,),
                "inp_gate.weight": (p, c), "proj.weight": (c, p), "post_norm.weight": (c,),
                "altup_router.weight": (s, c), "altup_router_norm.weight": (c,),
                "altup_predict_coef.weight": (s * s, s), "altup_correct_coef.weight": (s, s),
                "altup_correct_scale.weight": (c,), "laurel_l.weight": (r, c),
                "laurel_r.weight": (c, r), "laurel_post_norm.weight": (c,),
            }  # fmt: skip
            if i < n - self.shared:
                layer |= {"attn_k.weight": (kv, c), "attn_v.weight": (kv, c),
                          "attn_k_norm.weight": (d,)}  # fmt: skip
            named = {f"blk.{i}.{k}": v for k, v in layer.items()}
            shapes |= named
            required |= set(named)
        return shapes, required

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        a, c = self.arch, self.text
        meta = super().metadata() | {
            f"{a}.context_length": c.int("max_position_embeddings", 32768, maximum=1 << 28),
            f"{a}.feed_forward_length": self.ffns if len(set(self.ffns)) > 1 else self.ffn,
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.attention.sliding_window": c.int("sliding_window", 512, maximum=1 << 28),
            f"{a}.attention.sliding_window_pattern": self.sliding,
            f"{a}.attention.shared_kv_layers": self.shared,
            f"{a}.embedding_length_per_layer_input": self.per_layer,
            f"{a}.altup.num_inputs": self.streams,
            f"{a}.altup.active_idx": c.get("altup_active_idx", 0),
            f"{a}.altup.correct_scale": c.bool("altup_correct_scale", True),
            f"{a}.activation_sparsity_scale": self.sparsity,
            f"{a}.rope.freq_base": _theta(c, "full_attention", 1e6),
            f"{a}.rope.freq_base_local": _theta(c, "sliding_attention", 1e4),
        }
        if cap := c.get("final_logit_softcapping"):
            meta[f"{a}.final_logit_softcapping"] = float(cap)
        return meta


def _theta(c: HFConfig, kind: str, default: float) -> float:
    return HFConfig(c.rope(kind)).float("rope_theta", default)
