"""Tiny random-weight HF models of the text families beyond llama/qwen2/gemma3 (qwen3,
mistral, gemma2, olmo2, olmo3, phi3, granite; qwen3moe, gpt-oss, llama4 with 8 experts,
top-2), saved as `save_pretrained` saves them with a byte-level BPE tokenizer (tinymodels'
Qwen2-like vocabulary), for the converter tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from hf_dirs import _save_bpe
from tinymodels import tiny_vocab
from transformers import PreTrainedModel

from ember.convert import convert_directory

_DEEPSEEK = {
    "tie_word_embeddings": False, "num_hidden_layers": 3, "num_key_value_heads": 4,
    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "head_dim": 8,
    "v_head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "moe_intermediate_size": 32, "first_k_dense_replace": 1,
}  # fmt: skip
_GEMMA4 = {
    "tie_word_embeddings": True, "sliding_window": 6, "global_head_dim": 32,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 10000.0},
    },
}  # fmt: skip
_QWEN35 = {
    "tie_word_embeddings": False, "num_hidden_layers": 8, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
    },
}  # fmt: skip
# family -> (HF model class, config class, config fields beyond the common ones)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {"tie_word_embeddings": False, "head_dim": 24}),
    # head_dim 24 differs from hidden / heads = 16: the head size comes from the file.
    "mistral": ("MistralForCausalLM", "MistralConfig", {"head_dim": 24, "sliding_window": None}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {
        "num_hidden_layers": 4, "sliding_window": 6, "query_pre_attn_scalar": 16,
        "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
        "tie_word_embeddings": True,
    }),
    "granite": ("GraniteForCausalLM", "GraniteConfig", {
        "tie_word_embeddings": True, "embedding_multiplier": 3.0, "residual_multiplier": 0.5,
        "attention_multiplier": 0.1, "logits_scaling": 2.5,
    }),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", {"tie_word_embeddings": False}),
    # Qwen 2.5's long-context setting (its model cards' rope_scaling): YaRN x4 over 32
    # positions, which HF and llama.cpp apply at every position
    "qwen2-yarn": ("Qwen2ForCausalLM", "Qwen2Config", {
        "tie_word_embeddings": False, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    }),
    # layers 0-2 slide over 6 tokens with plain RoPE, layer 3 is full with YaRN x4 past 32
    "olmo3": ("Olmo3ForCausalLM", "Olmo3Config", {
        "tie_word_embeddings": False, "num_hidden_layers": 4, "sliding_window": 6,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": 32},
        },
    }),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", {"tie_word_embeddings": False}),
    # LongRoPE (short factors within the original 64 positions; attention factor from 128/64),
    # half the head rotated, a sliding window of 8 on every layer.
    "phi3-longrope": ("Phi3ForCausalLM", "Phi3Config", {
        "tie_word_embeddings": False, "sliding_window": 8, "original_max_position_embeddings": 64,
        "rope_parameters": {
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.5, 2.0, 4.0], "long_factor": [2.0, 3.0, 5.0, 9.0],
            "original_max_position_embeddings": 64,
        },
    }),
    "qwen3moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {
        "tie_word_embeddings": False, "moe_intermediate_size": 32, "num_experts": 8,
        "num_experts_per_tok": 2, "norm_topk_prob": True,
    }),
    # even layers slide over 6 tokens; YaRN x4 past 32 positions (ggml's rounded ramp)
    "gpt-oss": ("GptOssForCausalLM", "GptOssConfig", {
        "tie_word_embeddings": False, "intermediate_size": 32, "num_local_experts": 8,
        "num_experts_per_tok": 2, "sliding_window": 6, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "original_max_position_embeddings": 32, "truncate": True,
        },
    }),
    # latent attention (lora 32, 16 + 8 key dims, 16 value dims), layer 0 dense, 1-2 MoE with
    # 8 experts, top-2, a shared one. V2: no query lora, a softmax router, YaRN x4 past 32
    # positions (its mscale squared on the scores). V3: query lora 48, sigmoid router with a
    # bias, two groups of four of which one is used, weights normalized then scaled by 2.5.
    "deepseek-v2": ("DeepseekV2ForCausalLM", "DeepseekV2Config", _DEEPSEEK | {
        "q_lora_rank": None, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 32,
        },
    }),
    "deepseek-v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", _DEEPSEEK | {
        "q_lora_rank": 48, "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
    }),
    # two short-convolution layers (3 taps) and two attention layers, interleaved
    "lfm2": ("Lfm2ForCausalLM", "Lfm2Config", {
        "num_hidden_layers": 4, "tie_word_embeddings": True,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
    }),
    # LFM2-MoE: the first layer's MLP dense, then 8 experts, top-2, with a routing bias
    "lfm2-moe": ("Lfm2MoeForCausalLM", "Lfm2MoeConfig", {
        "num_hidden_layers": 4, "tie_word_embeddings": True, "num_dense_layers": 1,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "routed_scaling_factor": 1.5,
    }),
    # Laguna: 4 and 8 query heads in turn, per-head gates, sliding (window 6, full RoPE) and
    # full layers (half the head rotated, YaRN x4 past 32 with beta_fast 64), layer 0 dense,
    # then 8 experts, top-2, a choice bias, scale 1.5 and a shared expert
    "laguna": ("LagunaForCausalLM", "LagunaConfig", {
        "tie_word_embeddings": False, "num_hidden_layers": 4,
        "num_attention_heads_per_layer": [4, 8, 4, 8], "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "moe_routed_scaling_factor": 1.5,
        "rope_parameters": {
            "full_attention": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": 32, "beta_fast": 64.0,
                               "beta_slow": 1.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0,
                                  "partial_rotary_factor": 1.0},
        },
    }),
    # Gemma 4: sliding layers (window 6, heads of 16) and full ones (heads of 32, one KV head
    # whose keys are its values, proportional RoPE over a quarter), the last two layers reading
    # layers 2's and 1's keys, per-layer embeddings of 8, logits softcapped at 30
    "gemma4": ("Gemma4ForCausalLM", "Gemma4TextConfig", _GEMMA4 | {
        "num_hidden_layers": 5, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
        "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 8,
        "final_logit_softcapping": 30.0, "layer_types": [
            "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
            "full_attention"],
    }),
    # Gemma 4's mixtures: a dense MLP beside 8 experts, top-2; the shared last layer's MLP twice
    # as wide
    "gemma4-moe": ("Gemma4ForCausalLM", "Gemma4TextConfig", _GEMMA4 | {
        "num_hidden_layers": 4, "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
        "moe_intermediate_size": 32, "num_kv_shared_layers": 1, "use_double_wide_mlp": True,
        "hidden_size_per_layer_input": 0,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }),
    # Gemma 3n: 6 layers (sliding window 6, a full layer every third), the last two reading
    # layers 3's and 2's keys; 4 AltUp streams, LAuReL of rank 8, per-layer embeddings of 8, the
    # first two layers' MLP gates sparsified (95%), their widths 128 and 96 in turn; the
    # per-layer table 200 rows of the 299 tokens
    "gemma3n": ("Gemma3nForCausalLM", "Gemma3nTextConfig", {
        "tie_word_embeddings": True, "num_hidden_layers": 6, "sliding_window": 6,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
        "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 8, "laurel_rank": 8,
        "altup_num_inputs": 4, "intermediate_size": [128, 96] * 3,
        "vocab_size_per_layer_input": 200, "pad_token_id": 0,  # tokens past 200 read row 0
        "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
        "final_logit_softcapping": 30.0, "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }),
    # Qwen3.5: three DeltaNet layers (2 key heads of 16, 4 value heads of 16, kernel 4), then
    # full attention (4 heads of 16, a quarter rotated, gated output), twice
    "qwen3.5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", _QWEN35),
    # Qwen3.5's mixtures: 8 experts, top-2, and a gated shared expert
    "qwen3.5-moe": ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", _QWEN35 | {
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
    }),
    # Qwen3-Next: Qwen3.5's mixture with its packed qkvz and ba projections
    "qwen3-next": ("Qwen3NextForCausalLM", "Qwen3NextConfig", _QWEN35 | {
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
    }),
    # Nemotron-H: Mamba 2 (4 heads of 16, 2 groups, state 8), attention without positions, a
    # squared-ReLU MLP and a mixture (8 experts, top-2, a correction bias, a shared expert), twice
    "nemotron-h": ("NemotronHForCausalLM", "NemotronHConfig", {
        "tie_word_embeddings": False, "num_hidden_layers": 8, "layers_block_type": [
            "linear_attention", "full_attention", "mlp", "moe"] * 2,
        "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 8,
        "intermediate_size": 96, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 48,
        "routed_scaling_factor": 1.5, "n_group": 1, "topk_group": 1,
    }),
    # GLM-4.7-Flash: V3's model, its dense first layer told by mlp_layer_types
    "glm4-moe-lite": ("Glm4MoeLiteForCausalLM", "Glm4MoeLiteConfig", {
        k: v for k, v in _DEEPSEEK.items() if k != "first_k_dense_replace"
    } | {"q_lora_rank": 48, "norm_topk_prob": True, "routed_scaling_factor": 1.8}),
    # layers 1 and 3 MoE (8 experts, top-2, a shared one), 0 and 2 dense; layer 3 NoPE with
    # temperature tuning from position 3 on, the others chunked by 8 with llama 3 RoPE scaling
    "llama4": ("Llama4ForCausalLM", "Llama4TextConfig", {
        "tie_word_embeddings": False, "num_hidden_layers": 4, "intermediate_size": 32,
        "intermediate_size_mlp": 128, "num_local_experts": 8, "num_experts_per_tok": 2,
        "interleave_moe_layer_step": 2, "attention_chunk_size": 8, "floor_scale": 4,
        "attn_scale": 0.5, "rope_parameters": {
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        },
    }),
}  # fmt: skip
ZERO_CENTRED_NORMS = {"gemma2"}  # RMSNorm multiplies by (1 + w)


def build_family(family: str, *, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    model_cls, config_cls, fields = FAMILIES[family]
    vocab = tiny_vocab("qwen2")
    config = getattr(transformers, config_cls)(**({
        "vocab_size": len(vocab.tokens), "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "bos_token_id": vocab.bos_id, "eos_token_id": vocab.eos_id, "pad_token_id": vocab.pad_id,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    } | fields | overrides))  # fmt: skip
    config._attn_implementation = "eager"
    model = getattr(transformers, model_cls)(config).float().eval()
    return randomize(model, seed, zero_centred=family in ZERO_CENTRED_NORMS)


def randomize(model: PreTrainedModel, seed: int, *, zero_centred: bool = False) -> PreTrainedModel:
    """model's weights random, at scales that keep its activations in range: norms near 1 (0
    where they are stored zero-centred), embeddings 0.5, projections 1/sqrt(fan-in)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                param.copy_(0.1 * noise + (0.0 if zero_centred else 1.0))
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                param.copy_(0.5 * noise)
            else:
                param.copy_(noise / param.shape[-1] ** 0.5)
        for name, buffer in model.named_buffers():  # routers' biases (DeepSeek V3, LFM2-MoE): 0
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # (and Nemotron-H's)
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=gen))
            if name.endswith(("layer_scalar", "correct_output_scale")):  # Gemma 4's, 3n's
                buffer.copy_(1.0 + 0.1 * torch.randn(buffer.shape, generator=gen))
    return model


def save_family(family: str, directory: Path, **kwargs: Any) -> PreTrainedModel:
    model = build_family(family, **kwargs)
    model.save_pretrained(directory)
    _save_bpe("qwen2", tiny_vocab("qwen2"), directory)
    return model


def convert_family(family: str, root: Path) -> tuple[Path, PreTrainedModel]:
    """The family's tiny HF model saved under root/hf and converted to root/model.gguf."""
    hf = save_family(family, root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    return root / "model.gguf", hf


def convert_multimodal(
    root: Path, family: str, text: dict[str, Any], vision: dict[str, Any], **fields: Any
) -> tuple[Path, PreTrainedModel]:
    """A tiny random `{family}ForConditionalGeneration` (its `{family}Config` of text and
    vision configs) saved under root/hf with the tiny vocabulary and converted to
    root/model.gguf: the text models of multimodal checkpoints."""
    vocab = tiny_vocab("qwen2")
    text = {"vocab_size": len(vocab.tokens), "bos_token_id": vocab.bos_id,
            "eos_token_id": vocab.eos_id, "pad_token_id": vocab.pad_id} | text  # fmt: skip
    config = getattr(transformers, f"{family}Config")(
        text_config=text, vision_config=vision, **fields
    )
    config._attn_implementation = "eager"
    hf = getattr(transformers, f"{family}ForConditionalGeneration")(config).float().eval()
    randomize(hf, 1)
    hf.save_pretrained(root / "hf")
    _save_bpe("qwen2", vocab, root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    return root / "model.gguf", hf
