"""Tiny random-weight GGUF models (llama, qwen2, gemma3) written from HF transformers models.

The conversion follows llama.cpp's convert_hf_to_gguf.py (tensor names, llama's Q/K row
permutation, gemma3's norm weights stored with +1, metadata keys as in the real model files), so
an engine reading these files must give the logits HF gives. `write_tiny_gguf` returns the HF
model holding exactly the weights the file holds (quantized weights dequantized back), so a
comparison of logits is exact up to float arithmetic.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import TokenType
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from ember.store import kquants

ARCHS = ("llama", "qwen2", "gemma3")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A small corpus the BPE merges are learned from, so common words become single tokens.
CORPUS = (
    "The sky is blue because the air scatters blue light more than red light. "
    "Hello world! The capital of France is Paris. Why is the sky blue? "
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
)
NUM_MERGES = 40
PRE_SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+")

# llama.cpp's fallback when a row is not a whole number of K-quant blocks (llama-quant.cpp).
K_FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}
FILE_TYPES = {
    QT.F32: gguf.LlamaFileType.ALL_F32,
    QT.F16: gguf.LlamaFileType.MOSTLY_F16,
    QT.BF16: gguf.LlamaFileType.MOSTLY_BF16,
    QT.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
    QT.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
    QT.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0,
    QT.Q5_1: gguf.LlamaFileType.MOSTLY_Q5_1,
    QT.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    QT.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_S,
    QT.Q6_K: gguf.LlamaFileType.MOSTLY_Q6_K,
}


@dataclass(frozen=True)
class TinyModel:
    """A tiny GGUF file and the HF model that holds exactly its weights."""

    arch: str
    path: Path
    hf: PreTrainedModel


@dataclass(frozen=True)
class Vocab:
    """The tokenizer.ggml.* content of a tiny model."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece with byte fallback)
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    scores: list[float] | None
    bos_id: int
    eos_id: int
    unk_id: int | None
    pad_id: int
    add_bos: bool

    def id_of(self, token: str) -> int:
        return self.tokens.index(token)


# ---------------------------------------------------------------- tokenizer vocabularies


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, in GPT-2's order (printable bytes first)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + n) for n, b in enumerate(others)})
    return table  # insertion order is the order of the 256 byte tokens in GPT-2-style vocabs


def learn_merges(words: Sequence[Sequence[str]], num_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training: merge the most frequent adjacent pair (ties by first seen)."""
    corpus = [list(w) for w in words]
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs = Counter(p for w in corpus for p in itertools.pairwise(w))
        if not pairs:
            break
        pair = max(pairs, key=lambda p: pairs[p])  # Counter keeps first-seen order on ties
        merges.append(pair)
        corpus = [_merge_word(w, pair) for w in corpus]
    return merges


def _merge_word(word: list[str], pair: tuple[str, str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def bpe_vocab(arch: str) -> Vocab:
    """A byte-level BPE vocabulary laid out as the arch's real model lays out its own."""
    byte_chars = bytes_to_unicode()
    words = [[byte_chars[b] for b in w.encode()] for w in PRE_SPLIT.findall(CORPUS)]
    merges = learn_merges(words, NUM_MERGES)
    normal = list(byte_chars.values()) + ["".join(m) for m in merges]
    merge_lines = [f"{a} {b}" for a, b in merges]
    if arch == "llama":  # as SmolLM2: specials first, bos <|im_start|>, eos <|im_end|>
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tokens = specials + normal
        types = [TokenType.CONTROL] * 3 + [TokenType.NORMAL] * len(normal)
        return Vocab("gpt2", "smollm", tokens, types, merge_lines, None, 1, 2, 0, 2, False)
    if arch == "qwen2":  # as Qwen2.5: specials last, eos <|im_end|>, bos = pad = <|endoftext|>
        tokens = [*normal, "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        types = [TokenType.NORMAL] * len(normal) + [TokenType.CONTROL] * 3
        n = len(normal)
        return Vocab("gpt2", "qwen2", tokens, types, merge_lines, None, n, n + 2, None, n, False)
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tokens = specials + normal
    types = [TokenType.CONTROL] * len(specials) + [TokenType.NORMAL] * len(normal)
    return Vocab("gpt2", "default", tokens, types, merge_lines, None, 2, 1, 3, 0, True)


def spm_vocab() -> Vocab:
    """A Gemma-like SentencePiece vocabulary: specials, 256 byte tokens, then scored pieces."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    words = [list(w.replace(" ", "▁")) for w in PRE_SPLIT.findall(CORPUS)]
    chars = ["▁", *(chr(c) for c in range(ord("!"), ord("~") + 1))]
    pieces = chars + ["".join(m) for m in learn_merges(words, NUM_MERGES)]
    tokens = specials + byte_tokens + pieces
    types = (
        [TokenType.CONTROL] * len(specials)
        + [TokenType.BYTE] * 256
        + [TokenType.NORMAL] * len(pieces)
    )
    # Later merges score lower, as in Gemma's file (-1000 for specials, 0 for bytes).
    scores = [-1000.0] * len(specials) + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    return Vocab("llama", "default", tokens, types, [], scores, 2, 1, 3, 0, True)


# ---------------------------------------------------------------- HF models


def hf_config(arch: str, vocab: Vocab, **overrides: object) -> object:
    """The tiny transformers config of an arch; `overrides` replace any field."""
    common: dict[str, object] = {
        "vocab_size": len(vocab.tokens),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 128,
        "bos_token_id": vocab.bos_id,
        "eos_token_id": vocab.eos_id,
        "pad_token_id": vocab.pad_id,
    }
    if arch == "llama":
        kw = common | {"rms_norm_eps": 1e-5, "tie_word_embeddings": True,
                       "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}
        return LlamaConfig(**(kw | overrides))
    if arch == "qwen2":
        kw = common | {"rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                       "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
        return Qwen2Config(**(kw | overrides))
    if arch == "gemma3":
        # Six layers so that layer 5 is global ((i + 1) % 6 == 0) and the rest slide; the
        # attention scale 1/sqrt(head_dim) is what llama.cpp uses for every size but 27B.
        kw = common | {"num_hidden_layers": 6, "sliding_window": 8, "rms_norm_eps": 1e-6,
                       "tie_word_embeddings": True}
        kw |= overrides
        kw.setdefault("query_pre_attn_scalar", kw["head_dim"])
        return Gemma3TextConfig(**kw)
    raise ValueError(f"unknown tiny arch {arch!r}; choose one of {ARCHS}")


def build_hf_model(arch: str, vocab: Vocab, *, seed: int, **overrides: object) -> PreTrainedModel:
    """A random-weight float32 HF model in eval mode (eager attention, as the references)."""
    config = hf_config(arch, vocab, **overrides)
    config._attn_implementation = "eager"  # type: ignore[attr-defined]
    cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "gemma3": Gemma3ForCausalLM}
    model = cls[arch](config).float().eval()
    randomize(model, arch, seed=seed)
    return model


@torch.no_grad()
def randomize(model: PreTrainedModel, arch: str, *, seed: int) -> None:
    """Weights with sizes that give peaked logits; norms away from 1 so that they matter."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        if name.endswith("norm.weight"):
            # Gemma3's RMSNorm multiplies by (1 + w): its neutral weight is 0, the others' is 1.
            param.copy_(0.1 * noise + (0.0 if arch == "gemma3" else 1.0))
        elif name.endswith(".bias"):
            param.copy_(0.1 * noise)
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            param.copy_(0.5 * noise)
        else:
            param.copy_(noise / param.shape[-1] ** 0.5)


# ---------------------------------------------------------------- HF -> GGUF conversion

_LAYER_NAMES = {
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
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_name(arch: str, hf_name: str) -> str:
    """The GGUF tensor name llama.cpp's converter gives an HF parameter."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name)
    if match is None:
        raise KeyError(f"no GGUF name for {hf_name}")
    layer, module, kind = match.groups()
    if module == "post_attention_layernorm":
        # llama/qwen2 call the pre-FFN norm so; gemma3 has a real post-attention norm.
        short = "post_attention_norm" if arch == "gemma3" else "ffn_norm"
    else:
        short = _LAYER_NAMES[module]
    return f"blk.{layer}.{short}.{kind}"


def permute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's rotate-half rows -> ggml's adjacent pairs."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of permute_qk."""
    return w.reshape(num_heads, w.shape[0] // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def to_gguf_tensors(model: PreTrainedModel, arch: str) -> dict[str, np.ndarray]:
    """Float32 tensors under their GGUF names, transformed as the converter transforms them."""
    cfg = model.config
    tied = bool(cfg.tie_word_embeddings)
    out: dict[str, np.ndarray] = {}
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and tied:
            continue  # a tied head is token_embd itself: the converter writes no output.weight
        data = tensor.detach().float().numpy().copy()
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = permute_qk(data, cfg.num_attention_heads)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = permute_qk(data, cfg.num_key_value_heads)
        elif arch == "gemma3" and hf_name.endswith("norm.weight"):
            data = data + np.float32(1.0)
        out[gguf_name(arch, hf_name)] = data
    return out


# ---------------------------------------------------------------- quantization


def tensor_type(name: str, data: np.ndarray, ggml_type: QT, overrides: Mapping[str, str]) -> QT:
    """F32 for 1-D tensors (as the converter), else the requested type or llama.cpp's fallback."""
    if data.ndim == 1:
        return QT.F32
    qtype = next((QT[t] for pat, t in overrides.items() if fnmatch.fnmatch(name, pat)), ggml_type)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if data.shape[-1] % block != 0:
        qtype = K_FALLBACK.get(qtype, QT.F16)
        if data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] != 0:
            qtype = QT.F16
    return qtype


def quantize(data: np.ndarray, qtype: QT) -> np.ndarray:
    """GGUF bytes of a float32 tensor: Ember's K-quant encoders (llama.cpp's, byte for byte),
    gguf-py's quantizers for the rest."""
    if qtype == QT.Q4_K:
        return kquants.quantize_q4_k(data)
    if qtype == QT.Q6_K:
        return kquants.quantize_q6_k(data)
    return gguf.quants.quantize(data, qtype)


def dequantize(data: np.ndarray, qtype: QT) -> np.ndarray:
    """The oracle: gguf-py's dequantization, as float32."""
    return np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32)


# ---------------------------------------------------------------- writing and reading back


def write_metadata(writer: gguf.GGUFWriter, arch: str, cfg: object, file_type: int) -> None:
    """The model keys the real file of each arch carries, and no others."""
    writer.add_type("model")
    writer.add_name(f"Tiny {arch}")
    writer.add_block_count(cfg.num_hidden_layers)  # type: ignore[attr-defined]
    writer.add_context_length(cfg.max_position_embeddings)  # type: ignore[attr-defined]
    writer.add_embedding_length(cfg.hidden_size)  # type: ignore[attr-defined]
    writer.add_feed_forward_length(cfg.intermediate_size)  # type: ignore[attr-defined]
    writer.add_head_count(cfg.num_attention_heads)  # type: ignore[attr-defined]
    writer.add_head_count_kv(cfg.num_key_value_heads)  # type: ignore[attr-defined]
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)  # type: ignore[attr-defined]
    rope = cfg.rope_parameters  # type: ignore[attr-defined]
    if arch == "gemma3":
        writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])  # global layers' base
        writer.add_key_length(cfg.head_dim)  # type: ignore[attr-defined]
        writer.add_value_length(cfg.head_dim)  # type: ignore[attr-defined]
        writer.add_sliding_window(cfg.sliding_window)  # type: ignore[attr-defined]
    else:
        writer.add_rope_freq_base(rope["rope_theta"])
    if arch == "llama":
        writer.add_vocab_size(cfg.vocab_size)  # type: ignore[attr-defined]
        writer.add_rope_dimension_count(cfg.head_dim)  # type: ignore[attr-defined]
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_vocab(
    writer: gguf.GGUFWriter, arch: str, vocab: Vocab, chat_template: str | None
) -> None:
    """tokenizer.* keys: the same set the real file of the arch carries."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    writer.add_token_types([int(t) for t in vocab.token_types])
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    if vocab.unk_id is not None:
        writer.add_unk_token_id(vocab.unk_id)
    writer.add_pad_token_id(vocab.pad_id)
    writer.add_add_bos_token(vocab.add_bos)
    if arch == "gemma3":
        writer.add_add_sep_token(False)
        writer.add_add_eos_token(False)
    if arch != "qwen2":
        writer.add_add_space_prefix(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def write_tiny_gguf(
    arch: str,
    path: str | Path,
    *,
    seed: int = 0,
    ggml_type: str = "F32",
    tensor_types: Mapping[str, str] | None = None,
    tokenizer: str | None = None,
    chat_template: str | None = "default",
    **overrides: object,
) -> PreTrainedModel:
    """Write a tiny `arch` GGUF to `path`; return the HF model holding exactly its weights.

    `ggml_type` applies to every 2-D tensor (1-D ones stay F32); `tensor_types` maps
    fnmatch patterns of GGUF names to other types (e.g. {"token_embd.weight": "Q8_0"}). A row
    that is no whole number of blocks falls back as llama.cpp does (Q4_K -> Q5_0, Q6_K -> Q8_0,
    else F16). `tokenizer` is "gpt2" (byte-level BPE) or "llama" (Gemma-like SentencePiece);
    by default the kind of the arch's real file: gpt2 for llama and qwen2, llama for gemma3.
    `chat_template` "default" writes ChatML for llama and qwen2 and none for gemma3 (as the
    real files); None writes none. `overrides` replace fields of the HF config.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; choose one of {ARCHS}")
    vocab = tiny_vocab(arch, tokenizer)
    model = build_hf_model(arch, vocab, seed=seed, **overrides)
    qtype = QT[ggml_type]
    writer = gguf.GGUFWriter(str(path), arch)
    write_metadata(writer, arch, model.config, FILE_TYPES.get(qtype, 0))
    if chat_template == "default":
        chat_template = None if arch == "gemma3" else CHATML_TEMPLATE
    write_vocab(writer, arch, vocab, chat_template)
    for name, data in to_gguf_tensors(model, arch).items():
        ttype = tensor_type(name, data, qtype, tensor_types or {})
        if ttype in (QT.F32, QT.F16):
            writer.add_tensor(name, data.astype(np.float32 if ttype == QT.F32 else np.float16))
        else:
            writer.add_tensor(name, quantize(data, ttype), raw_dtype=ttype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    load_dequantized_into_hf(model, path)
    return model


def read_gguf_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file, dequantized to float32 with gguf-py, in HF's shape order."""
    reader = gguf.GGUFReader(str(path))
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        out[t.name] = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
    return out


@torch.no_grad()
def load_dequantized_into_hf(model: PreTrainedModel, path: str | Path) -> None:
    """Load a tiny GGUF's weights into `model`, undoing the converter's transforms."""
    arch = model.config.model_type.removesuffix("_text")
    cfg = model.config
    tensors = read_gguf_tensors(path)
    for hf_name, param in model.state_dict(keep_vars=True).items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensors[gguf_name(arch, hf_name)]
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = unpermute_qk(data, cfg.num_attention_heads)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = unpermute_qk(data, cfg.num_key_value_heads)
        elif arch == "gemma3" and hf_name.endswith("norm.weight"):
            data = data - np.float32(1.0)
        param.copy_(torch.from_numpy(np.array(data, dtype=np.float32)))


@torch.no_grad()
def hf_logits(model: PreTrainedModel, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits (T, vocab) of one sequence, float32, no cache."""
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    return model(input_ids=ids, use_cache=False).logits[0].float()


def tiny_vocab(arch: str, tokenizer: str | None = None) -> Vocab:
    """The vocabulary write_tiny_gguf writes for `arch` (see its `tokenizer` argument)."""
    kind = tokenizer or ("llama" if arch == "gemma3" else "gpt2")
    if kind not in ("gpt2", "llama"):
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose gpt2 or llama")
    return spm_vocab() if kind == "llama" else bpe_vocab(arch)
