"""BERT encoders (sentence-transformers' all-MiniLM-L6-v2 and its kin) as llama.cpp's converter
writes them: architecture `bert`, learned absolute positions and token types, post-LayerNorm
layers with biases, `bert.pooling_type` from the sentence-transformers Pooling module, and a
WordPiece vocabulary in "phantom space" form (`▁word` starts a word, `##piece` loses its `##`).
A BertForSequenceClassification with one label (a cross-encoder) keeps its pooler and classifier
as `cls` and `cls.output`, with pooling type rank, the names llama.cpp's rank pooling reads."""

import json
import re
from pathlib import Path
from typing import Any

from ember.convert.decoder import TextDecoder
from ember.convert.source import ConvertError, HFConfig, read_json
from ember.convert.spm_model import CONTROL, NORMAL, UNUSED
from ember.pooling import POOLING_LAST

POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_RANK = 0, 1, 2, 4  # enum llama_pooling_type
_SKIPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_TOP = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_LAYER_NAME = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
_SPECIALS = (
    ("cls", "cls_token_id", "[CLS]"),
    ("sep", "seperator_token_id", "[SEP]"),
    ("pad", "padding_token_id", "[PAD]"),
    ("unk", "unknown_token_id", "[UNK]"),
    ("mask", "mask_token_id", "[MASK]"),
)  # fmt: skip  (llama.cpp's key spellings)


class BertEncoder(TextDecoder):
    """A BertModel checkpoint (no MLM or pooler head kept): an embedding-only GGUF."""

    arch = "bert"

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        self.context_length = c.int("max_position_embeddings", 512, maximum=1 << 20)
        self.type_vocab = c.int("type_vocab_size", 2, maximum=1024)
        if c.get("hidden_act", "gelu") != "gelu":
            raise ConvertError(f"BERT hidden_act {c.get('hidden_act')!r} is not supported")
        if c.get("position_embedding_type", "absolute") != "absolute":
            raise ConvertError("only absolute position embeddings are supported for BERT")
        if self.num_kv_heads != self.num_heads or self.head_dim * self.num_heads != self.hidden:
            raise ConvertError("BERT heads must split hidden_size evenly")
        self.pooling_type = POOLING_MEAN

    def rename(self, hf_name: str) -> str | None:
        hf_name = hf_name.removeprefix("bert.")  # BertFor* checkpoints nest the encoder
        if hf_name in _SKIPPED:
            return None
        if hf_name.startswith(("cls.", "classifier.")):
            return None  # heads of BertForMaskedLM and the like: not part of the encoder
        hf_name = hf_name.replace("LayerNorm.gamma", "LayerNorm.weight")
        hf_name = hf_name.replace("LayerNorm.beta", "LayerNorm.bias")  # older checkpoints
        if hf_name in _TOP:
            return _TOP[hf_name]
        match = _LAYER_NAME.fullmatch(hf_name)
        if match is None or match.group(2) not in _LAYER:
            raise ConvertError(f"unexpected tensor {hf_name!r} for bert")
        layer, module, kind = match.groups()
        return f"blk.{layer}.{_LAYER[module]}.{kind}"

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, f = self.hidden, self.ffn
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.vocab_size, c),
            "position_embd.weight": (self.context_length, c),
            "token_types.weight": (self.type_vocab, c),
            "token_embd_norm.weight": (c,),
            "token_embd_norm.bias": (c,),
        }
        per_layer: dict[str, tuple[int, ...]] = {}
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            per_layer |= {f"{name}.weight": (c, c), f"{name}.bias": (c,)}
        for name in ("attn_output_norm", "layer_output_norm"):
            per_layer |= {f"{name}.weight": (c,), f"{name}.bias": (c,)}
        per_layer |= {"ffn_up.weight": (f, c), "ffn_up.bias": (f,)}
        per_layer |= {"ffn_down.weight": (c, f), "ffn_down.bias": (c,)}
        for i in range(self.num_layers):
            shapes |= {f"blk.{i}.{name}": shape for name, shape in per_layer.items()}
        return shapes, set(shapes)  # every tensor, biases included, is required

    def metadata(self) -> dict[str, Any]:
        a = self.arch
        return {
            f"{a}.block_count": self.num_layers,
            f"{a}.context_length": self.context_length,
            f"{a}.embedding_length": self.hidden,
            f"{a}.feed_forward_length": self.ffn,
            f"{a}.attention.head_count": self.num_heads,
            f"{a}.attention.layer_norm_epsilon": self.text.float("layer_norm_eps", 1e-12),
            f"{a}.attention.causal": False,
            f"{a}.pooling_type": self.pooling_type,
        }

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        self.pooling_type = pooling_type(directory)
        return self.vocabulary(directory)

    def vocabulary(self, directory: Path) -> dict[str, Any]:
        return bert_vocabulary(directory, vocab_size=self.vocab_size) | {
            "tokenizer.ggml.token_type_count": self.type_vocab
        }


_HEAD = {
    "pooler.dense.weight": "cls.weight",
    "pooler.dense.bias": "cls.bias",
    "classifier.weight": "cls.output.weight",
    "classifier.bias": "cls.output.bias",
}


class BertCrossEncoder(BertEncoder):
    """A BertForSequenceClassification with one label (sentence-transformers' CrossEncoder):
    the encoder, its pooler (`cls`) and its classifier (`cls.output`); pooling type rank."""

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        labels = config.get("id2label") or {}
        if not isinstance(labels, dict) or len(labels) != 1:
            raise ConvertError("only single-label BertForSequenceClassification (a reranker)")
        self.labels = [str(v) for _, v in sorted(labels.items())]
        self.pooling_type = POOLING_RANK

    def rename(self, hf_name: str) -> str | None:
        head = _HEAD.get(hf_name.removeprefix("bert."))
        return head if head is not None else super().rename(hf_name)

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        c = self.hidden
        head = {"cls.weight": (c, c), "cls.bias": (c,), "cls.output.weight": (1, c)}
        head["cls.output.bias"] = (1,)
        return shapes | head, required | set(head)

    def metadata(self) -> dict[str, Any]:
        return super().metadata() | {f"{self.arch}.classifier.output_labels": self.labels}

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        return self.vocabulary(directory)  # no Pooling module: the pooling is rank


def pooling_type(directory: Path) -> int:
    """Mean, CLS or last-token pooling, from the Pooling module that modules.json names (mean
    without one, as sentence-transformers' default for a plain BERT checkpoint)."""
    modules = sentence_modules(directory)
    is_pooling = [
        isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling") for m in modules
    ]
    paths = [m.get("path") for m, pooled in zip(modules, is_pooling, strict=True) if pooled]
    if not paths:
        return POOLING_MEAN
    if not isinstance(paths[0], str) or ".." in Path(paths[0]).parts:
        raise ConvertError("modules.json names a bad Pooling path")
    pooling = read_json(directory / paths[0] / "config.json", required=False)
    if pooling is None:  # an upload that left the Pooling folder out
        raise ConvertError(f"the Pooling module's {paths[0]}/config.json is missing")
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True]
    if modes == ["pooling_mode_mean_tokens"]:
        return POOLING_MEAN
    if modes == ["pooling_mode_cls_token"]:
        return POOLING_CLS
    if modes == ["pooling_mode_lasttoken"]:
        return POOLING_LAST
    raise ConvertError(f"pooling {modes} is not supported (only mean, CLS or the last token)")


def sentence_modules(directory: Path) -> list[Any]:
    """The entries of sentence-transformers' modules.json (none without one)."""
    modules: Any = []
    path = directory / "modules.json"
    if path.is_file():
        if path.stat().st_size > 1 << 20:
            raise ConvertError("modules.json is too large")
        try:
            modules = json.loads(path.read_bytes())
        except (ValueError, RecursionError) as e:
            raise ConvertError(f"modules.json is not valid JSON: {e}") from None
    if not isinstance(modules, list):
        raise ConvertError("modules.json must be a list")
    return modules


def bert_vocabulary(directory: Path, *, vocab_size: int) -> dict[str, Any]:
    """`tokenizer.ggml.*` of a WordPiece tokenizer.json (or vocab.txt)."""
    spec = read_json(directory / "tokenizer.json", required=False)
    tok_config = read_json(directory / "tokenizer_config.json", required=False) or {}
    if spec is not None:
        tokens, special = _wordpiece_json(spec)
    elif (directory / "vocab.txt").is_file():
        tokens, special = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines(), set()
        if not tok_config.get("do_lower_case", True):
            raise ConvertError("only uncased BERT vocabularies are supported")
    else:
        raise ConvertError("a BERT model directory needs tokenizer.json or vocab.txt")
    if len(tokens) > vocab_size:
        raise ConvertError(f"the tokenizer has {len(tokens)} tokens, the model {vocab_size} rows")
    meta: dict[str, Any] = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.pre": "default"}
    meta |= _special_ids(tokens, tok_config, special)
    types = [CONTROL if t in special else NORMAL for t in tokens]
    tokens = [phantom(t) for t in tokens]
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")  # as llama.cpp: unused rows get placeholder names
        types.append(UNUSED)
    return meta | {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}


def _wordpiece_json(spec: dict[str, Any]) -> tuple[list[str], set[str]]:
    """(the tokens by id, the special ones) of an uncased WordPiece tokenizer.json."""
    model = spec.get("model") or {}
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        raise ConvertError("a BERT tokenizer.json must hold a WordPiece model")
    if model.get("continuing_subword_prefix", "##") != "##":
        raise ConvertError("only the '##' subword prefix is supported")
    normalizer = spec.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer" or not normalizer.get("lowercase", True):
        raise ConvertError("only uncased BERT vocabularies (BertNormalizer) are supported")
    ids = model["vocab"]
    tokens = [""] * len(ids)
    for token, i in ids.items():
        if not isinstance(i, int) or not 0 <= i < len(ids) or tokens[i]:
            raise ConvertError("the WordPiece vocabulary's ids are not 0..n-1")
        tokens[i] = token
    added = spec.get("added_tokens") or []
    return tokens, {t["content"] for t in added if isinstance(t, dict) and t.get("special")}


def _special_ids(
    tokens: list[str], tok_config: dict[str, Any], special: set[str]
) -> dict[str, int]:
    """The ids of [CLS], [SEP], [PAD], [UNK] and [MASK] (added to `special`)."""
    index = {t: i for i, t in enumerate(tokens)}
    meta: dict[str, int] = {}
    for kind, key, default in _SPECIALS:
        text = tok_config.get(f"{kind}_token", default)
        if isinstance(text, dict):
            text = text.get("content")
        if text in index:
            meta[f"tokenizer.ggml.{key}"] = index[text]
            special.add(text)
    for needed in ("cls_token_id", "seperator_token_id"):
        if f"tokenizer.ggml.{needed}" not in meta:
            raise ConvertError(f"the BERT vocabulary lacks its {needed.split('_')[0]} token")
    return meta


def phantom(token: str) -> str:
    """llama.cpp's spelling of a WordPiece token: `##` dropped, a word start gets `▁`."""
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return "\u2581" + token
