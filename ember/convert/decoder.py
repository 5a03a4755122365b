"""What the text architectures share: HF -> GGUF tensor names of a decoder stack, the shapes a
config implies (checked before anything is written), and the common hyperparameters."""

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from ember.convert.source import ConvertError, HFConfig
from ember.convert.vocab import tokenizer_metadata

_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_attention_layernorm": "ffn_norm",  # llama and qwen2: the norm before the MLP
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_BASE_MODEL = ("layers.", "embed_tokens.", "norm.")
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
# Prefixes of the text model inside multimodal checkpoints (transformers 5 and 4).
_TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                  ("language_model.lm_head.", "lm_head."))  # fmt: skip


def expert_pattern(module: str, kind: str = r"(gate|up|down)_proj") -> re.Pattern[str]:
    """HF's per-expert tensors `model.layers.L.<module>.E.<kind>.weight`: (layer, expert, kind)."""
    return re.compile(rf"model\.layers\.(\d+)\.{re.escape(module)}\.(\d+)\.{kind}\.weight")


@dataclass(frozen=True, slots=True)
class Combined:
    """A GGUF tensor built from several HF tensors at once (gpt-oss's MXFP4 blocks and scales)."""

    sources: tuple[str, ...]  # the HF tensors, handed to build in this order
    shape: tuple[int, ...]  # the GGUF tensor's shape, in elements
    ggml_type: int  # its block type: build returns its bytes
    build: Callable[[list[torch.Tensor]], torch.Tensor]


class TextDecoder:
    """A pre-norm decoder stack; subclasses add their architecture's keys and quirks."""

    arch: ClassVar[str]
    layer_names: ClassVar[dict[str, str]] = _LAYER
    # A mixture's per-expert HF tensors, (layer, expert, kind), stacked into `ffn_{kind}_exps`
    # (kinds renamed by expert_kinds), and its router's choice bias, (layer,): `exp_probs_b.bias`
    expert_names: ClassVar[re.Pattern[str] | None] = None
    expert_kinds: ClassVar[dict[str, str]] = {}
    router_bias: ClassVar[re.Pattern[str] | None] = None
    says_tied = True  # whether config.json says if the head is tied (encoders: nothing to settle)

    def __init__(self, config: HFConfig) -> None:
        self.config = config
        c = self.text = self.text_config(config)
        self.num_layers = c.int("num_hidden_layers", maximum=1024)
        self.hidden = c.int("hidden_size")
        self.num_heads = c.int("num_attention_heads", maximum=4096)
        self.num_kv_heads = c.int("num_key_value_heads", self.num_heads, maximum=4096)
        self.head_dim = c.int("head_dim", self.hidden // self.num_heads, maximum=4096)
        self.ffn = c.int("intermediate_size")
        self.vocab_size = c.int("vocab_size", maximum=1 << 22)
        self.is_tied = c.bool("tie_word_embeddings", config.bool("tie_word_embeddings", True))
        # configs differ in its default (HF's base config ties, Llama's and Qwen2's do not):
        # where the file leaves it out, the checkpoint decides (settle_head)
        self.says_tied = any(k.get("tie_word_embeddings") is not None for k in (c, config))
        if self.num_heads % self.num_kv_heads:
            raise ConvertError("num_attention_heads must be a multiple of num_key_value_heads")

    def text_config(self, config: HFConfig) -> HFConfig:
        return config

    def settle_head(self, names: Iterable[str]) -> None:
        """Where config.json does not say whether the head is tied, a saved lm_head is the
        head, and none means token_embd is (as Ollama's converter writes what it finds)."""
        if not self.says_tied:
            self.is_tied = not any(n.endswith("lm_head.weight") for n in names)

    # ------------------------------------------------------------ names and shapes

    def rename(self, hf_name: str) -> str | None:
        """The GGUF name of an HF tensor; None for one the file does not keep."""
        for old, new in _TEXT_PREFIXES:
            if hf_name.startswith(old):
                hf_name = new + hf_name.removeprefix(old)
        if hf_name.startswith(_BASE_MODEL):  # a base model's own save (sentence-transformers')
            hf_name = "model." + hf_name
        if self.router_bias is not None and (m := self.router_bias.fullmatch(hf_name)):
            return f"blk.{m.group(1)}.exp_probs_b.bias"
        if hf_name.endswith("rotary_emb.inv_freq"):
            return None
        if hf_name == "lm_head.weight" and self.is_tied:
            return None  # the head is token_embd itself
        if hf_name in _TOP:
            return _TOP[hf_name]
        match = _LAYER_NAME.fullmatch(hf_name)
        if match is None or match.group(2) not in self.layer_names:
            raise ConvertError(f"unexpected tensor {hf_name!r} for {self.arch}")
        layer, module, kind = match.groups()
        return f"blk.{layer}.{self.layer_names[module]}.{kind}"

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        """(shape of every tensor the file may hold, the names it must hold)."""
        c = self.hidden
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes, required = self.top_shapes()
        per_layer = {
            "attn_norm.weight": (c,), "attn_q.weight": (q, c), "attn_k.weight": (kv, c),
            "attn_v.weight": (kv, c), "attn_output.weight": (c, q), "ffn_norm.weight": (c,),
        } | self.ffn_shapes()  # fmt: skip
        extra = self.layer_shapes()
        for i in range(self.num_layers):
            for name, shape in (per_layer | extra).items():
                shapes[f"blk.{i}.{name}"] = shape
            required |= {f"blk.{i}.{n}" for n in per_layer}
            required |= {f"blk.{i}.{n}" for n in extra if not n.endswith(".bias")}
        return shapes, required

    def top_shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        """The tensors outside the layers: embeddings, final norm and head (a tied head none)."""
        c, v = self.hidden, self.vocab_size
        shapes = {"token_embd.weight": (v, c), "output.weight": (v, c), "output_norm.weight": (c,)}
        required = {"token_embd.weight", "output_norm.weight"}
        if not self.is_tied:
            required.add("output.weight")
        return shapes, required

    def expert_metadata(self, count: int, used: int, ffn: int) -> dict[str, Any]:
        """llama.cpp's keys of a mixture of experts: how many, how many a token uses, their size."""
        a = self.arch
        return {f"{a}.expert_count": count, f"{a}.expert_used_count": used,
                f"{a}.expert_feed_forward_length": ffn}  # fmt: skip

    def ffn_shapes(self) -> dict[str, tuple[int, ...]]:
        """The feed-forward tensors of a layer: a SwiGLU MLP (an MoE converter has experts)."""
        c, f = self.hidden, self.ffn
        return {"ffn_gate.weight": (f, c), "ffn_up.weight": (f, c), "ffn_down.weight": (c, f)}

    def split(self, hf_name: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """The GGUF tensors made of one HF tensor, each by a function of it (slices, transposes
        that a meta tensor can run for its shape): the renamed tensor itself by default."""
        name = self.rename(hf_name)
        return {} if name is None else {name: _same}

    def combined(self, hf_names: list[str]) -> dict[str, Combined]:
        """GGUF tensors that several HF tensors make together, by GGUF name; their sources are
        not planned one by one."""
        return {}

    def stacked(self, hf_name: str) -> tuple[str, int] | None:
        """The GGUF tensor this HF tensor is one slice of, and its index there (an expert of an
        MoE layer, stacked along a first dimension); None for a tensor of its own."""
        match = self.expert_names.fullmatch(hf_name) if self.expert_names is not None else None
        if match is None or int(match.group(1)) >= self.num_layers:
            return None  # (DeepSeek V3's multi-token-prediction layer is past the decoder's)
        layer, expert, kind = match.groups()
        return f"blk.{layer}.ffn_{self.expert_kinds.get(kind, kind)}_exps.weight", int(expert)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensors of a layer beyond the llama set (biases are optional)."""
        return {}

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A tensor as the GGUF stores it (llama's Q/K row order, gemma's norm +1...)."""
        return tensor

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors the file holds that the checkpoint does not (llama 3's rope_freqs)."""
        return {}

    # ------------------------------------------------------------ metadata

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        """Keys from the directory's other files (the tokenizer); read first, before the
        tensors are planned (extra_tensors) and metadata() is asked."""
        return tokenizer_metadata(directory, self.text, vocab_size=self.vocab_size)

    def metadata(self) -> dict[str, Any]:
        a, c = self.arch, self.text
        return {
            f"{a}.block_count": self.num_layers,
            f"{a}.context_length": c.int("max_position_embeddings", 2048, maximum=1 << 28),
            f"{a}.embedding_length": self.hidden,
            f"{a}.feed_forward_length": self.ffn,
            f"{a}.attention.head_count": self.num_heads,
            f"{a}.attention.head_count_kv": self.num_kv_heads,
            f"{a}.attention.layer_norm_rms_epsilon": c.float("rms_norm_eps", 1e-6),
        }


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
