"""The `tokenizer.ggml.*` metadata of an HF directory: a byte-level BPE or a SentencePiece-style
BPE (Gemma 4's) from tokenizer.json, or a SentencePiece model from tokenizer.model; special ids
from tokenizer_config.json, config.json and generation_config.json (whose `eos_token_id` list
becomes the stop ids); the chat template."""

from pathlib import Path
from typing import Any

from ember.convert.source import ConvertError, HFConfig, read_json
from ember.convert.spm_model import (
    BYTE,
    CONTROL,
    NORMAL,
    UNUSED,
    USER_DEFINED,
    read_sentencepiece,
)
from ember.tokenizer.bpe import PRE_TOKENIZERS
from ember.tokenizer.spm import SPACE
from ember.tokenizer.vocab import SPM_BPE_PRE

MAX_VOCAB = 1 << 22
MAX_SPM_BYTES = 64 << 20
SPECIALS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
            ("pad", "padding_token_id"))  # fmt: skip
# Gemma's turn markers are plain pieces in some tokenizer.model files (as Ollama's converter).
_GEMMA_CONTROL = ("<start_of_turn>", "<end_of_turn>")


def tokenizer_metadata(
    directory: Path, config: HFConfig, *, vocab_size: int, spm_bpe: bool = False
) -> dict[str, Any]:
    """Every tokenizer key of the GGUF; the token list is padded to `vocab_size` rows."""
    tok_config = read_json(directory / "tokenizer_config.json", required=False) or {}
    # tokenizer.model first, as Ollama's converter reads them: Gemma 3 and older directories ship
    # both, their tokenizer.json a "▁" BPE too, and Ollama encodes those files as SentencePiece
    # (merges from the scores). Only without it, or where the architecture says its tokenizer is
    # a "▁" BPE with its own merges (`spm_bpe`: Gemma 4's), does tokenizer.json's kind decide.
    has_json = (directory / "tokenizer.json").is_file()
    if (directory / "tokenizer.model").is_file() and not (spm_bpe and has_json):
        meta = _sentencepiece(directory, tok_config)
    elif has_json:
        spec = read_json(directory / "tokenizer.json") or {}
        if _is_sentencepiece_bpe(spec):
            meta = _sentencepiece_bpe(spec, tok_config)
        else:
            meta = _byte_level_bpe(spec, tok_config)
    else:
        raise ConvertError("the model directory has neither tokenizer.json nor tokenizer.model")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    if len(tokens) > vocab_size:
        raise ConvertError(f"the tokenizer has {len(tokens)} tokens, the model {vocab_size} rows")
    for i in range(len(tokens), vocab_size):  # as llama.cpp: unused rows get placeholder names
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
        if "tokenizer.ggml.scores" in meta:
            meta["tokenizer.ggml.scores"].append(-1000.0)
    meta.update(_special_ids(directory, config, tok_config, tokens))
    template = _chat_template(directory, tok_config)
    if template:
        meta["tokenizer.chat_template"] = template
    return meta


# ---------------------------------------------------------------- SentencePiece


def _sentencepiece(directory: Path, tok_config: dict[str, Any]) -> dict[str, Any]:
    path = directory / "tokenizer.model"
    if path.stat().st_size > MAX_SPM_BYTES:
        raise ConvertError("tokenizer.model is too large")
    spm = read_sentencepiece(path.read_bytes())
    tokens, scores, types = list(spm.pieces), list(spm.scores), list(spm.types)
    for i, piece in enumerate(tokens):
        if piece in _GEMMA_CONTROL and types[i] in (NORMAL, USER_DEFINED):
            types[i] = CONTROL
    for token_id, content, special in _added_tokens(tok_config):
        kind = CONTROL if special else USER_DEFINED
        if token_id < len(tokens):
            if tokens[token_id] != content:
                raise ConvertError(f"added token {content!r} does not match piece {token_id}")
            types[token_id] = kind if types[token_id] != UNUSED or special else types[token_id]
        elif token_id == len(tokens):
            tokens.append(content)
            scores.append(-1000.0)
            types.append(kind)
        else:
            raise ConvertError(f"added token {content!r} has id {token_id} past the vocabulary")
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": spm.add_dummy_prefix,
        "tokenizer.ggml.add_bos_token": _flag(tok_config, "add_bos_token", True),
        "tokenizer.ggml.add_eos_token": _flag(tok_config, "add_eos_token", False),
    }


def _added_tokens(tok_config: dict[str, Any]) -> list[tuple[int, str, bool]]:
    """tokenizer_config.json's added_tokens_decoder as (id, content, special), by id."""
    decoder = tok_config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ConvertError("tokenizer_config.json: added_tokens_decoder must be an object")
    out = []
    for key, entry in decoder.items():
        if not key.isdigit() or not isinstance(entry, dict):
            raise ConvertError(f"tokenizer_config.json: bad added token {key!r}")
        content = entry.get("content")
        if not isinstance(content, str):
            raise ConvertError(f"tokenizer_config.json: added token {key} has no content")
        out.append((int(key), content, bool(entry.get("special", False))))
    return sorted(out)


# ---------------------------------------------------------------- byte-level BPE


def _byte_level_bpe(spec: dict[str, Any], tok_config: dict[str, Any]) -> dict[str, Any]:
    model, tokens, types = _bpe_vocabulary(spec)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": _pre_tokenizer_name(spec),
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": _merges(model.get("merges")),
        "tokenizer.ggml.add_bos_token": _flag(tok_config, "add_bos_token", _adds_bos(spec)),
    }


def _bpe_vocabulary(spec: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[int]]:
    """tokenizer.json's BPE model, its tokens by id (added tokens included: control if special,
    else user-defined; gaps become unused placeholders) and their types."""
    model = spec.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        raise ConvertError("tokenizer.json: only BPE tokenizers convert (or give tokenizer.model)")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise ConvertError("tokenizer.json: model.vocab must be an object")
    by_id: dict[int, tuple[str, int]] = {}
    for text, token_id in vocab.items():
        by_id[_token_id(token_id)] = (text, NORMAL)
    for entry in spec.get("added_tokens") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise ConvertError("tokenizer.json: an added token has no content")
        kind = CONTROL if entry.get("special") else USER_DEFINED
        by_id[_token_id(entry.get("id"))] = (entry["content"], kind)
    size = max(by_id) + 1 if by_id else 0
    tokens = [by_id.get(i, (f"[PAD{i}]", UNUSED))[0] for i in range(size)]
    types = [by_id.get(i, ("", UNUSED))[1] for i in range(size)]
    return model, tokens, types


def appended_token(directory: Path) -> str | None:
    """The special token that tokenizer.json's post-processor puts after the text (Qwen3-
    Embedding's end of text), or None."""
    path = directory / "tokenizer.json"
    spec = read_json(path) if path.is_file() else None
    single = _single_template(spec) if isinstance(spec, dict) else []
    last = single[-1].get("SpecialToken") if single[1:] and isinstance(single[-1], dict) else None
    token = last.get("id") if isinstance(last, dict) else None
    return token if isinstance(token, str) else None


def _adds_bos(spec: dict[str, Any]) -> bool:
    """Whether tokenizer.json's post-processor puts a special token before the text (llama 3)."""
    single = _single_template(spec)
    return bool(single) and isinstance(single[0], dict) and "SpecialToken" in single[0]


def _single_template(spec: dict[str, Any]) -> list[Any]:
    """The `single` sequence of tokenizer.json's TemplateProcessing post-processor, or []."""
    post = spec.get("post_processor")
    steps = post.get("processors", [post]) if isinstance(post, dict) else []
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "TemplateProcessing":
            single = step.get("single")
            return single if isinstance(single, list) else []
    return []


def _token_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_VOCAB:
        raise ConvertError(f"tokenizer.json: token id {value!r} is out of range")
    return value


def _merges(raw: Any) -> list[str]:
    if not isinstance(raw, list):
        raise ConvertError("tokenizer.json: model.merges must be a list")
    out = []
    for merge in raw:
        if isinstance(merge, str) and merge.count(" ") == 1:
            out.append(merge)
        elif isinstance(merge, list) and len(merge) == 2 and all(isinstance(m, str) for m in merge):
            if " " in merge[0] or " " in merge[1]:
                raise ConvertError("tokenizer.json: a merge holds a space, which GGUF cannot keep")
            out.append(" ".join(merge))
        else:
            raise ConvertError(f"tokenizer.json: a merge is not a pair: {merge!r}")
    return out


def _pre_tokenizer_name(spec: dict[str, Any]) -> str:
    """The `tokenizer.ggml.pre` whose split Ember's BPE reproduces; any other split is refused
    (a wrong one would give other token ids without an error)."""
    normalizer = spec.get("normalizer")
    if normalizer is not None and (not isinstance(normalizer, dict) or normalizer.get("type")
                                   != "NFC"):  # fmt: skip
        raise ConvertError("tokenizer.json: this normalizer is not supported")
    pre = spec.get("pre_tokenizer")
    nested = isinstance(pre, dict) and "pretokenizers" in pre
    steps: list[Any] = (pre["pretokenizers"] if nested else [pre]) or []  # type: ignore[index]
    kinds = [s.get("type") if isinstance(s, dict) else None for s in steps]
    ignore_merges = bool((spec.get("model") or {}).get("ignore_merges", False))
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm"
    splits = len(kinds) - 1
    if splits and kinds == ["Split"] * splits + ["ByteLevel"] and not steps[-1].get(
            "use_regex", True):  # fmt: skip
        patterns = [s.get("pattern") or {} for s in steps[:-1]]
        regexes = [_escaped(p.get("Regex") if isinstance(p, dict) else None) for p in patterns]
        for name, split in PRE_TOKENIZERS.items():
            ours = [_escaped(r) for r in (*split.first, split.regex)]
            if ours == regexes and split.ignore_merges == ignore_merges:
                return name
    raise ConvertError(f"tokenizer.json: unsupported pre-tokenizer {kinds}")


def _escaped(regex: str | None) -> str | None:
    """A regex with its line breaks written as escapes: tokenizer.json files hold either."""
    return None if regex is None else regex.replace("\r", "\\r").replace("\n", "\\n")


# ---------------------------------------------------------------- SentencePiece-style BPE


def _is_sentencepiece_bpe(spec: dict[str, Any]) -> bool:
    """Whether tokenizer.json is a BPE over "▁"-spelled text (Gemma 4's): its normalizer
    replaces each space by "▁", where a byte-level BPE maps bytes to characters instead."""
    model = spec.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return False
    return any(_replaces_spaces(step) for step in _steps(spec.get("normalizer"), "normalizers"))


def _sentencepiece_bpe(spec: dict[str, Any], tok_config: dict[str, Any]) -> dict[str, Any]:
    """As Ollama's converter writes Gemma 4: model "llama", pre "gemma4", tokenizer.json's
    merges (its engine encodes with them, not with the scores), no dummy prefix."""
    model, tokens, types = _bpe_vocabulary(spec)
    _check_sentencepiece_bpe(spec, model)
    for i, token in enumerate(tokens):
        if types[i] == NORMAL and _is_byte_piece(token):
            types[i] = BYTE
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": SPM_BPE_PRE,
        "tokenizer.ggml.tokens": tokens,
        # unused for this pre (Ollama's engine reads the merges); earlier ids, merged earlier in
        # a BPE vocabulary, score higher for a reader that ranks SentencePiece pieces by score
        "tokenizer.ggml.scores": [-float(i) for i in range(len(tokens))],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": _merges(model.get("merges")),
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.add_bos_token": _flag(tok_config, "add_bos_token", _adds_bos(spec)),
        "tokenizer.ggml.add_eos_token": _flag(tok_config, "add_eos_token", False),
    }


def _check_sentencepiece_bpe(spec: dict[str, Any], model: dict[str, Any]) -> None:
    """Refuse what Ember's reading of the file (spaces to "▁", the merges over the whole text
    between specials, byte fallback) would not reproduce: a wrong split gives other ids."""
    if not all(_replaces_spaces(step) for step in _steps(spec.get("normalizer"), "normalizers")):
        raise ConvertError("tokenizer.json: this normalizer is not supported (or give "
                           "tokenizer.model)")  # fmt: skip
    if spec.get("pre_tokenizer") is not None:
        kinds = [s.get("type") if isinstance(s, dict) else None
                 for s in _steps(spec.get("pre_tokenizer"), "pretokenizers")]  # fmt: skip
        raise ConvertError(f"tokenizer.json: unsupported pre-tokenizer {kinds} for a '▁' BPE")
    if any(isinstance(s, dict) and s.get("type") == "ByteLevel"
           for s in _steps(spec.get("decoder"), "decoders")):  # fmt: skip
        raise ConvertError("tokenizer.json: a '▁' BPE with a ByteLevel decoder")
    for option in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(option):
            raise ConvertError(f"tokenizer.json: BPE {option} is not supported")


def _steps(value: Any, key: str) -> list[Any]:
    """The steps of a normalizer, pre-tokenizer or decoder: a Sequence's, or the one; none if
    null."""
    if value is None:
        return []
    if isinstance(value, dict) and value.get("type") == "Sequence":
        steps = value.get(key)
        return steps if isinstance(steps, list) else [None]
    return [value]


def _replaces_spaces(step: Any) -> bool:
    return (
        isinstance(step, dict)
        and step.get("type") == "Replace"
        and step.get("pattern") == {"String": " "}
        and step.get("content") == SPACE
    )


def _is_byte_piece(token: str) -> bool:
    """`<0xHH>`: SentencePiece's piece for one byte (byte fallback)."""
    hexdigits = "0123456789ABCDEF"
    return (
        len(token) == 6
        and token[:3] == "<0x"
        and token[5] == ">"
        and set(token[3:5]) <= set(hexdigits)
    )


# ---------------------------------------------------------------- special tokens


def _special_ids(
    directory: Path, config: HFConfig, tok_config: dict[str, Any], tokens: list[str]
) -> dict[str, Any]:
    index = {t: i for i, t in reversed(list(enumerate(tokens)))}
    out: dict[str, Any] = {}
    for kind, key in SPECIALS:
        content = tok_config.get(f"{kind}_token")
        if isinstance(content, dict):
            content = content.get("content")
        token_id = index.get(content) if isinstance(content, str) else None
        fallback = config.get(f"{kind}_token_id")
        if token_id is None and isinstance(fallback, int) and 0 <= fallback < len(tokens):
            token_id = fallback
        if token_id is not None:
            out[f"tokenizer.ggml.{key}"] = token_id
    generation = read_json(directory / "generation_config.json", required=False) or {}
    stops = _ids(generation.get("eos_token_id"), len(tokens), "generation_config.json")
    stops += [i for i in _ids(config.get("eos_token_id"), len(tokens), "config.json")
              if i not in stops]  # fmt: skip
    if stops:
        out.setdefault("tokenizer.ggml.eos_token_id", stops[0])
        out["tokenizer.ggml.eos_token_ids"] = stops
    return out


def _ids(value: Any, size: int, label: str) -> list[int]:
    items = value if isinstance(value, list) else [] if value is None else [value]
    for i in items:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size:
            raise ConvertError(f"{label}: eos_token_id {i!r} is not a token id")
    return list(dict.fromkeys(items))


def _flag(tok_config: dict[str, Any], key: str, default: bool) -> bool:
    value = tok_config.get(key, default)
    return value if isinstance(value, bool) else default


def _chat_template(directory: Path, tok_config: dict[str, Any]) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file() and jinja.stat().st_size <= 1 << 20:
        return jinja.read_text("utf-8", "replace")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
