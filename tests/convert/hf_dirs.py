"""Tiny random-weight HF model directories, saved as `save_pretrained` saves them, with a real
tokenizer: a byte-level BPE tokenizer.json (llama, qwen2) or a SentencePiece tokenizer.model
(gemma3), built offline from tinymodels' vocabularies."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tinymodels import CHATML_TEMPLATE, build_hf_model, tiny_vocab
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def save_hf_dir(
    arch: str,
    directory: Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    generation_eos: list[int] | int | None = None,
    **overrides: object,
) -> PreTrainedModel:
    """Writes config.json, model.safetensors and tokenizer files; returns the float32 model
    holding the saved weights (rounded through `dtype`)."""
    vocab = tiny_vocab(arch)
    model = build_hf_model(arch, vocab, seed=seed, **overrides)
    with torch.no_grad():  # the weights as the saved dtype holds them (buffers stay float32)
        for param in model.parameters():
            param.copy_(param.to(dtype).float())
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    model.save_pretrained(directory, state_dict=state)
    if arch == "gemma3":
        _save_sentencepiece(vocab, directory)
    else:
        _save_bpe(arch, vocab, directory)
    if generation_eos is not None:
        (directory / "generation_config.json").write_text(
            json.dumps({"eos_token_id": generation_eos, "bos_token_id": vocab.bos_id})
        )
    return model


def _save_bpe(arch: str, vocab, directory: Path) -> None:
    specials = [t for t, k in zip(vocab.tokens, vocab.token_types, strict=True) if k == 3]
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    merges = [tuple(m.split(" ")) for m in vocab.merges]
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges))
    if arch == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:  # SmolLM2's: digits alone, then GPT-2's split
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=vocab.tokens[vocab.bos_id],
        eos_token=vocab.tokens[vocab.eos_id],
        pad_token=vocab.tokens[vocab.pad_id],
        unk_token=None if vocab.unk_id is None else vocab.tokens[vocab.unk_id],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(directory)


def _save_sentencepiece(vocab, directory: Path) -> None:
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.vocab_size = len(vocab.tokens)
    proto.trainer_spec.pad_id, proto.trainer_spec.eos_id = vocab.pad_id, vocab.eos_id
    proto.trainer_spec.bos_id, proto.trainer_spec.unk_id = vocab.bos_id, vocab.unk_id
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.escape_whitespaces = True
    proto.normalizer_spec.remove_extra_whitespaces = False  # as Gemma's
    kinds = {1: pb.ModelProto.SentencePiece.NORMAL, 3: pb.ModelProto.SentencePiece.CONTROL,
             6: pb.ModelProto.SentencePiece.BYTE}  # fmt: skip
    for text, kind, score in zip(vocab.tokens, vocab.token_types, vocab.scores, strict=True):
        piece = proto.pieces.add()
        piece.piece, piece.score = text, score
        piece.type = pb.ModelProto.SentencePiece.UNKNOWN if text == "<unk>" else kinds[int(kind)]
    (directory / "tokenizer.model").write_bytes(proto.SerializeToString())
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
              "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
