"""nomic-bert encoders (NomicBertModel: nomic-embed-text v1 and v1.5, config.json in GPT-2's
key names) as llama.cpp's converter writes them: architecture `nomic-bert`, the fused Wqkv kept
as `attn_qkv`, fc11/fc12/fc2 as ffn_up/ffn_gate/ffn_down, the context cut to the positions it
was trained on, the pooling of its sentence-transformers module and BERT's WordPiece vocabulary.
Variants the forward pass does not follow (biases, pre-norm, partial or interleaved rotary, MoE)
are refused."""

import re
from typing import Any

from ember.convert.bert import BertEncoder
from ember.convert.source import ConvertError, HFConfig

_TOP = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "emb_ln.weight": "token_embd_norm.weight",
    "emb_ln.bias": "token_embd_norm.bias",
}
_LAYER = {
    "attn.Wqkv": "attn_qkv",
    "attn.out_proj": "attn_output",
    "norm1": "attn_output_norm",
    "mlp.fc11": "ffn_up",
    "mlp.fc12": "ffn_gate",  # SwiGLU: fc11(x) * silu(fc12(x))
    "mlp.fc2": "ffn_down",
    "norm2": "layer_output_norm",
}
_LAYER_NAME = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)")
# (key, NomicBertConfig's default, the value Ember's forward pass needs: nomic-embed-text's)
_REQUIRED = (("activation_function", "gelu_new", "swiglu"), ("prenorm", False, False),
             ("causal", False, False), ("rotary_emb_fraction", 0.0, 1.0),
             ("rotary_emb_interleaved", False, False), ("rotary_emb_scale_base", None, None),
             ("qkv_proj_bias", True, False), ("mlp_fc1_bias", True, False),
             ("mlp_fc2_bias", True, False), ("use_rms_norm", False, False),
             ("parallel_block", False, False), ("moe_every_n_layers", 0, 0))  # fmt: skip


class NomicBertEncoder(BertEncoder):
    arch = "nomic-bert"

    def __init__(self, config: HFConfig) -> None:  # not BertEncoder's: GPT-2's key names
        self.config = self.text = c = config
        for key, default, wanted in _REQUIRED:
            if (value := c.values.get(key, default)) != wanted:
                raise ConvertError(f"nomic-bert: {key}={value!r} is not supported")
        self.num_layers = _int(c, "n_layer", "num_hidden_layers", maximum=1024)
        self.hidden = _int(c, "n_embd", "hidden_size")
        self.num_heads = self.num_kv_heads = _int(c, "n_head", "num_attention_heads")
        if self.hidden % self.num_heads:
            raise ConvertError("nomic-bert: the heads must split the hidden size evenly")
        self.head_dim = self.hidden // self.num_heads
        # NomciBertGatedMLP rounds its width up to a multiple of 256 (8/3 hidden by default)
        self.ffn = _round_up(c.int("n_inner", int(8 * self.hidden / 3)), 256)
        self.vocab_size = _round_up(c.int("vocab_size"), c.int("pad_vocab_size_multiple", 1))
        self.context_length = min(
            c.int("max_trained_positions", 2048, maximum=1 << 20),
            _int(c, "n_positions", "max_position_embeddings", maximum=1 << 20),
        )
        self.type_vocab = c.int("type_vocab_size", 2, maximum=1024)
        self.is_tied = True
        self.pooling_type = 1

    def rename(self, hf_name: str) -> str | None:
        hf_name = hf_name.removeprefix("bert.")
        if hf_name in _TOP:
            return _TOP[hf_name]
        if hf_name.startswith(("pooler.", "cls.")) or hf_name.endswith(
            ("position_ids", "inv_freq")
        ):
            return None  # heads and buffers, not part of the encoder
        match = _LAYER_NAME.fullmatch(hf_name)
        if match is None or match.group(2) not in _LAYER:
            raise ConvertError(f"unexpected tensor {hf_name!r} for nomic-bert")
        layer, module, kind = match.groups()
        return f"blk.{layer}.{_LAYER[module]}.{kind}"

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, f = self.hidden, self.ffn
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.vocab_size, c),
            "token_types.weight": (self.type_vocab, c),
            "token_embd_norm.weight": (c,),
            "token_embd_norm.bias": (c,),
        }
        per_layer: dict[str, tuple[int, ...]] = {
            "attn_qkv.weight": (3 * c, c),
            "attn_output.weight": (c, c),
            "ffn_up.weight": (f, c),
            "ffn_gate.weight": (f, c),
            "ffn_down.weight": (c, f),
        }
        for norm in ("attn_output_norm", "layer_output_norm"):
            per_layer |= {f"{norm}.weight": (c,), f"{norm}.bias": (c,)}
        for i in range(self.num_layers):
            shapes |= {f"blk.{i}.{name}": shape for name, shape in per_layer.items()}
        return shapes, set(shapes)

    def metadata(self) -> dict[str, Any]:
        a, c = self.arch, self.config
        return {
            f"{a}.block_count": self.num_layers,
            f"{a}.context_length": self.context_length,
            f"{a}.embedding_length": self.hidden,
            f"{a}.feed_forward_length": self.ffn,
            f"{a}.attention.head_count": self.num_heads,
            f"{a}.attention.layer_norm_epsilon": c.float("layer_norm_epsilon", 1e-5),
            f"{a}.attention.causal": False,
            f"{a}.rope.freq_base": c.float("rotary_emb_base", 10_000.0),
            f"{a}.pooling_type": self.pooling_type,
        }


def _int(c: HFConfig, key: str, alias: str | None = None, *, maximum: int = 1 << 24) -> int:
    """An integer under GPT-2's key name, or the usual one (`alias`)."""
    if alias is not None and c.get(key) is None:
        key = alias
    return c.int(key, maximum=maximum)


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple
