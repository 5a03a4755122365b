"""Qwen3 (dense) checkpoints: the qwen2 layout without biases, with per-head q/k RMSNorms. A
Qwen3-Reranker (told by its README's title, as llama.cpp tells it) is the same checkpoint with
pooling type rank, the labels "yes" and "no", and its prompt as `tokenizer.chat_template.rerank`."""

from pathlib import Path
from typing import Any

from ember.convert.bert import pooling_type, sentence_modules
from ember.convert.llama import LlamaDecoder
from ember.convert.qwen2 import Qwen2Decoder
from ember.convert.qwen3vl_tower import Qwen3VLTower
from ember.convert.source import ConvertError, HFConfig
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
    layers, its interleaved M-RoPE sections as keys, and the ViT (qwen3vl_tower.py)."""

    arch = "qwen3vl"

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.tower = Qwen3VLTower(config.sub("vision_config"), self.hidden)

    def text_config(self, config: HFConfig) -> HFConfig:
        return config.sub("text_config") if "text_config" in config.values else config

    def rename(self, hf_name: str) -> str | None:
        return self.tower.rename(hf_name) or super().rename(hf_name)

    def split(self, hf_name: str) -> dict[str, Any]:
        return self.tower.split(hf_name) or super().split(hf_name)

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        vision = self.tower.shapes()
        return shapes | vision, required | set(vision)

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        self.tower.read_processor(directory)
        return super().directory_metadata(directory)

    def metadata(self) -> dict[str, Any]:
        meta, a = super().metadata(), self.arch
        rope = self.text.rope()
        if rope.get("rope_type", "default") != "default":
            raise ConvertError("qwen3vl: only default (M-)RoPE is supported")
        if sections := rope.get("mrope_section"):
            meta[f"{a}.rope.mrope_section"] = [int(s) for s in sections]
            meta[f"{a}.mrope_sections"] = [int(s) for s in sections]  # Ollama's key
        return meta | self.tower.metadata(a)
