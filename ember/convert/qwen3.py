"""Qwen3 (dense) checkpoints: the qwen2 layout without biases, with per-head q/k RMSNorms. A
Qwen3-Reranker (told by its README's title, as llama.cpp tells it) is the same checkpoint with
pooling type rank, the labels "yes" and "no", and its prompt as `tokenizer.chat_template.rerank`."""

from pathlib import Path
from typing import Any

from ember.convert.bert import pooling_type, sentence_modules
from ember.convert.llama import LlamaDecoder
from ember.convert.qwen2 import Qwen2Decoder
from ember.convert.source import ConvertError, HFConfig, read_json
from ember.convert.vocab import appended_token


class Qwen3Decoder(Qwen2Decoder):
    arch = "qwen3"
    has_bias = False

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.head_dim
        return {"attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)}

    def metadata(self) -> dict[str, Any]:
        meta = LlamaDecoder.metadata(self)
        del meta[f"{self.arch}.vocab_size"]
        return meta

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        meta = super().directory_metadata(directory)
        readme = directory / "README.md"
        if readme.is_file() and "# Qwen3-Reranker" in readme.read_text(errors="replace")[: 1 << 20]:
            meta |= {
                f"{self.arch}.pooling_type": POOLING_RANK,
                f"{self.arch}.classifier.output_labels": ["yes", "no"],
                "tokenizer.chat_template.rerank": RERANK_TEMPLATE,
            }
        elif sentence_modules(directory):  # sentence-transformers' folder: Qwen3-Embedding
            meta |= self.embedding_metadata(directory, meta["tokenizer.ggml.tokens"])
        return meta

    def embedding_metadata(self, directory: Path, tokens: list[str]) -> dict[str, Any]:
        """Its Pooling module's pooling, and the end token its tokenizer appends, which the
        GGUF's tokenizer then appends as its eos (as llama.cpp converts it)."""
        meta: dict[str, Any] = {f"{self.arch}.pooling_type": pooling_type(directory)}
        appended = appended_token(directory)
        if appended is not None:
            if appended not in tokens:
                raise ConvertError(f"the tokenizer appends {appended!r}, which it does not hold")
            meta |= {
                "tokenizer.ggml.add_eos_token": True,
                "tokenizer.ggml.eos_token_id": tokens.index(appended),
            }
        return meta


POOLING_RANK = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK
# Qwen3-Reranker's prompt with its default instruction; {query} and {document} are filled in
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


class Qwen3VLDecoder(Qwen3Decoder):
    """Qwen3-VL (Qwen3VLForConditionalGeneration) as Ollama's one `qwen3vl` file: Qwen3's
    layers, its interleaved M-RoPE sections as keys, and the ViT under `v.*` with
    qwen3vl.vision.* keys (as Ollama's converter: the fused qkv of each block split into q/k/v,
    the Conv3d kernel kept whole as (out·in, T, P, P))."""

    arch = "qwen3vl"

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        v = self.vision = config.sub("vision_config")
        self.v_layers = v.int("depth", 27, maximum=1024)
        self.v_hidden = v.int("hidden_size", 1152)
        self.v_ffn = v.int("intermediate_size", 4304)
        self.v_heads = v.int("num_heads", 16, maximum=4096)
        self.patch_size = v.int("patch_size", 16, maximum=1024)
        self.merge_size = v.int("spatial_merge_size", 2, maximum=64)
        self.temporal = v.int("temporal_patch_size", 2, maximum=16)
        self.positions = v.int("num_position_embeddings", 2304, maximum=1 << 20)
        self.deepstack = v.get("deepstack_visual_indexes", [8, 16, 24])
        self.sizes = {"shortest_edge": 65536, "longest_edge": 16777216}
        self.mean_std = [0.5] * 3, [0.5] * 3
        if v.int("in_channels", 3, maximum=3) != 3:
            raise ConvertError("vision_config: only 3 input channels are supported")
        if v.int("out_hidden_size", self.hidden) != self.hidden or self.v_hidden % self.v_heads:
            raise ConvertError("vision_config: out_hidden_size or num_heads do not fit")
        if v.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ConvertError("vision_config: only the gelu_pytorch_tanh activation is supported")
        if not isinstance(self.deepstack, list) or not all(
            isinstance(i, int) and 0 <= i < self.v_layers for i in self.deepstack
        ):
            raise ConvertError("vision_config: deepstack_visual_indexes must list block numbers")

    def text_config(self, config: HFConfig) -> HFConfig:
        return config.sub("text_config") if "text_config" in config.values else config

    def rename(self, hf_name: str) -> str | None:
        rest = next((hf_name.removeprefix(p) for p in _TOWER if hf_name.startswith(p)), None)
        if rest is None:
            return super().rename(hf_name)
        for hf, ours in _TOWER_NAMES:
            rest = rest.replace(hf, ours)
        if rest.split(".")[0] in ("patch_embed", "pos_embed", "blk", "merger", "deepstack_merger"):
            return "v." + rest
        raise ConvertError(f"unexpected tensor {hf_name!r} for qwen3-vl")

    def split(self, hf_name: str) -> dict[str, Any]:
        if hf_name.endswith("patch_embed.proj.weight"):
            return {"v.patch_embed.weight": lambda w: w.flatten(0, 1)}
        if ".attn.qkv." in hf_name:
            block, kind = hf_name.split(".blocks.")[1].split(".")[0], hf_name.rsplit(".", 1)[1]
            return {f"v.blk.{block}.attn_{n}.{kind}": _third(i) for i, n in enumerate("qkv")}
        return super().split(hf_name)

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        c, f, p, u = self.v_hidden, self.v_ffn, self.patch_size, self.v_hidden * self.merge_size**2
        vision: dict[str, tuple[int, ...]] = {
            "v.patch_embed.weight": (c * 3, self.temporal, p, p), "v.patch_embed.bias": (c,),
            "v.pos_embed.weight": (self.positions, c),
        }  # fmt: skip
        mergers = {"v.merger.": c}
        mergers |= {f"v.deepstack_merger.{i}.": u for i in range(len(self.deepstack))}
        for prefix, norm in mergers.items():
            vision |= {prefix + "norm.weight": (norm,), prefix + "norm.bias": (norm,),
                       prefix + "linear_fc1.weight": (u, u), prefix + "linear_fc1.bias": (u,),
                       prefix + "linear_fc2.weight": (self.hidden, u),
                       prefix + "linear_fc2.bias": (self.hidden,)}  # fmt: skip
        per_layer = {"norm1": (c,), "norm2": (c,), "attn_q": (c, c), "attn_k": (c, c),
                     "attn_v": (c, c), "attn_out": (c, c), "mlp.linear_fc1": (f, c),
                     "mlp.linear_fc2": (c, f)}  # fmt: skip
        for i in range(self.v_layers):
            for name, shape in per_layer.items():
                vision[f"v.blk.{i}.{name}.weight"] = shape
                vision[f"v.blk.{i}.{name}.bias"] = (shape[0],)
        return shapes | vision, required | set(vision)

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        processor = read_json(directory / "preprocessor_config.json", required=False) or {}
        size = processor.get("size")
        size = size if isinstance(size, dict) else {}
        for key in self.sizes:
            self.sizes[key] = _positive(size.get(key, self.sizes[key]), f"size.{key}")
        self.mean_std = _triple(processor, "image_mean"), _triple(processor, "image_std")
        return super().directory_metadata(directory)

    def metadata(self) -> dict[str, Any]:
        meta, a = super().metadata(), self.arch
        rope = self.text.rope()
        if rope.get("rope_type", "default") != "default":
            raise ConvertError("qwen3vl: only default (M-)RoPE is supported")
        if sections := rope.get("mrope_section"):
            meta[f"{a}.rope.mrope_section"] = [int(s) for s in sections]
            meta[f"{a}.mrope_sections"] = [int(s) for s in sections]  # Ollama's key
        return meta | {
            f"{a}.vision.block_count": self.v_layers,
            f"{a}.vision.embedding_length": self.v_hidden,
            f"{a}.vision.attention.head_count": self.v_heads,
            f"{a}.vision.num_channels": 3,
            f"{a}.vision.patch_size": self.patch_size,
            f"{a}.vision.spatial_merge_size": self.merge_size,
            f"{a}.vision.attention.layer_norm_epsilon": 1e-6,
            f"{a}.vision.rope.freq_base": 10000.0,
            f"{a}.vision.temporal_patch_size": self.temporal,
            f"{a}.vision.deepstack_visual_indexes": self.deepstack,
            f"{a}.vision.shortest_edge": self.sizes["shortest_edge"],
            f"{a}.vision.longest_edge": self.sizes["longest_edge"],
            f"{a}.vision.image_mean": self.mean_std[0],
            f"{a}.vision.image_std": self.mean_std[1],
        }


_TOWER = ("model.visual.", "visual.")
# HF's tower names -> Ollama's (convert_qwen3vl.go's replacements)
_TOWER_NAMES = (
    ("patch_embed.proj", "patch_embed"),
    ("blocks.", "blk."),
    ("attn.proj", "attn_out"),
    ("deepstack_merger_list", "deepstack_merger"),
)


def _positive(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConvertError(f"preprocessor_config.json: {key} must be a positive integer")
    return value


def _triple(processor: dict[str, Any], key: str) -> list[float]:
    values = processor.get(key, [0.5] * 3)
    if not isinstance(values, list) or len(values) != 3 or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in values
    ):
        raise ConvertError(f"preprocessor_config.json: {key} must list 3 numbers")
    return [float(x) for x in values]


def _third(i: int) -> Any:
    return lambda w: w.chunk(3, 0)[i]
