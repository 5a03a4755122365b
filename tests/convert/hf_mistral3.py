"""A tiny random-weight HF Mistral3ForConditionalGeneration (Pixtral tower, patch merger, GELU
projector, mistral text) saved as an HF directory with a byte-level BPE tokenizer laid out as
Tekken's first ids ([IMG] 10, [IMG_BREAK] 12, [IMG_END] 13), shaped as
../shared/reference/tiny_vision_models.py's mistral3, HF's constant inits made random."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as T
from gguf import TokenType
from hf_dirs import _save_bpe
from hf_vision import _randomize
from tinymodels import Vocab, bpe_vocab

PATCH, MERGE, LONGEST_EDGE = 8, 2, 64
SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]",
            "<pad>", "[IMG_BREAK]", "[IMG_END]"]  # fmt: skip
IMG, IMG_BREAK, IMG_END = 10, 12, 13
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST]' + message['content'] + '[/INST]' }}{% else %}{{ message['content'] + '</s>' }}"
    "{% endif %}{% endfor %}"
)


def mistral3_vocab() -> Vocab:
    v = bpe_vocab("llama")
    normal = v.tokens[3:]  # smollm's layout without its three specials
    tokens = [*SPECIALS, *normal]
    types = [TokenType.CONTROL] * len(SPECIALS) + [TokenType.NORMAL] * len(normal)
    return Vocab(v.model, v.pre, tokens, types, v.merges, None, 1, 2, 0, 11, False)


def build_mistral3(
    directory: Path, *, seed: int = 0, tie_word_embeddings: bool = False, feature_layer: int = -1
):
    vocab = mistral3_vocab()
    vision = T.PixtralVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=LONGEST_EDGE, patch_size=PATCH, hidden_act="silu",
    )  # fmt: skip
    text = T.MistralConfig(
        vocab_size=len(vocab.tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=None,
        max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=vocab.bos_id,
        eos_token_id=vocab.eos_id, pad_token_id=vocab.pad_id,
    )  # fmt: skip
    config = T.Mistral3Config(
        vision_config=vision, text_config=text, image_token_index=IMG, spatial_merge_size=MERGE,
        vision_feature_layer=feature_layer, multimodal_projector_bias=True,
        tie_word_embeddings=tie_word_embeddings,
    )  # fmt: skip
    for c in (config, config.text_config, config.vision_config):
        c._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = T.Mistral3ForConditionalGeneration(config).float().eval()
    _randomize(model, seed)
    model.save_pretrained(directory)
    _save_bpe("llama", vocab, directory)
    _set_template(directory)
    processor = {"image_processor_type": "PixtralImageProcessor", "patch_size": PATCH,
                 "size": {"longest_edge": LONGEST_EDGE}, "resample": 3}  # fmt: skip
    (directory / "preprocessor_config.json").write_text(__import__("json").dumps(processor))
    return model


def _set_template(directory: Path) -> None:
    import json

    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = MISTRAL_TEMPLATE
    path.write_text(json.dumps(config))
    (directory / "chat_template.jinja").unlink(missing_ok=True)
