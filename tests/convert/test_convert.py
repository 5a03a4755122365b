"""HF directory -> GGUF with Ember's converter, checked against transformers: logits of tiny
random-weight models (llama, qwen2, gemma3; F32 and BF16; llama 3 RoPE scaling), token ids,
stop tokens, and clear errors for broken directories."""

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_dirs import save_hf_dir
from tinymodels import hf_logits, read_gguf_tensors

from ember.batch import Batch
from ember.convert import ConvertError, convert_directory
from ember.gguf import GGUFFile
from ember.model import forward, load_model
from ember.tokenizer import Tokenizer

ARCHS = ["llama", "qwen2", "gemma3"]
PROMPT = [5, 17, 42, 8, 99, 3, 64, 21, 7, 150, 11, 12, 13, 14, 15, 16, 30, 31, 32, 33]
TEXT = "Hello world! Why is the sky blue? 1234 def fibonacci(n):\n    return n"


def ember_logits(path: Path, tokens: list[int]) -> torch.Tensor:
    model = load_model(GGUFFile.open(path))
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    batch = Batch(tokens=tuple(tokens), positions=tuple(range(len(tokens))),
                  sequences=(0,) * len(tokens), outputs=tuple(range(len(tokens))))  # fmt: skip
    return forward(model, cache, batch)


def convert(tmp_path: Path, arch: str, **kwargs: object) -> tuple[Path, object]:
    source = tmp_path / f"hf-{arch}"
    hf = save_hf_dir(arch, source, **kwargs)
    out = tmp_path / f"{arch}.gguf"
    convert_directory(source, out)
    return out, hf


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    return {arch: (*convert(root, arch, generation_eos=[2, 1]), root / f"hf-{arch}")
            for arch in ARCHS}  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
def test_converted_logits_equal_transformers(converted, arch):
    path, hf, _ = converted[arch]
    assert (ember_logits(path, PROMPT) - hf_logits(hf, PROMPT)).abs().max() < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_converted_tokenizer_gives_the_ids_transformers_gives(converted, arch):
    path, _, source = converted[arch]
    with GGUFFile.open(path) as f:
        ours = Tokenizer.from_metadata(f.metadata).encode(TEXT)
    if arch == "gemma3":
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(source / "tokenizer.model"))
        theirs = [2, *sp.encode(TEXT)]  # <bos> added, as tokenizer_config.json says
    else:
        from transformers import AutoTokenizer

        theirs = AutoTokenizer.from_pretrained(source).encode(TEXT)
    assert ours == theirs


@pytest.mark.parametrize("arch", ARCHS)
def test_stop_tokens_come_from_generation_config(converted, arch):
    path, _, _ = converted[arch]
    with GGUFFile.open(path) as f:
        tok = Tokenizer.from_metadata(f.metadata)
        assert {1, 2} <= tok.eos_ids
        assert f.metadata["general.architecture"] == arch
        assert f.metadata.get("tokenizer.chat_template", "").startswith("{%") is (arch != "gemma3")


def test_bf16_checkpoint_stays_bf16_bit_for_bit_and_matches(tmp_path):
    path, hf = convert(tmp_path, "qwen2", dtype=torch.bfloat16)
    with GGUFFile.open(path) as f:
        assert f.metadata["general.file_type"] == 32
    stored = read_gguf_tensors(path)
    ours = torch.from_numpy(stored["blk.1.attn_q.weight"])
    assert torch.equal(ours, hf.model.layers[1].self_attn.q_proj.weight.detach())
    assert (ember_logits(path, PROMPT) - hf_logits(hf, PROMPT)).abs().max() < 1e-4


def test_llama3_rope_scaling_becomes_rope_freqs(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    path, hf = convert(tmp_path, "llama", rope_parameters=rope)
    with GGUFFile.open(path) as f:
        assert "rope_freqs.weight" in f.tensors
    assert (ember_logits(path, PROMPT) - hf_logits(hf, PROMPT)).abs().max() < 1e-4


def test_a_model_cards_yarn_rope_scaling_converts_and_matches(converted, tmp_path):
    """Qwen 2.5's model cards add `"rope_scaling": {"factor": 4.0, "original_max_position_
    embeddings": 32768, "type": "yarn"}` for long prompts (Ollama's converter takes it; Ember's
    had refused it): the keys llama.cpp writes, and logits equal HF's from that config.json."""
    import transformers

    source = tmp_path / "yarn"
    shutil.copytree(converted["qwen2"][2], source)
    config = json.loads((source / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_scaling"] = {"factor": 4.0, "original_max_position_embeddings": 16, "type": "yarn"}
    (source / "config.json").write_text(json.dumps(config))
    convert_directory(source, tmp_path / "out.gguf")
    with GGUFFile.open(tmp_path / "out.gguf") as f:
        meta = f.metadata
    assert meta["qwen2.rope.scaling.type"] == "yarn"
    assert meta["qwen2.rope.scaling.factor"] == 4.0
    assert meta["qwen2.rope.scaling.original_context_length"] == 16
    hf = transformers.Qwen2ForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
    expected = hf_logits(hf, PROMPT)
    assert (ember_logits(tmp_path / "out.gguf", PROMPT) - expected).abs().max() < 1e-4
    assert (expected - hf_logits(converted["qwen2"][1], PROMPT)).abs().max() > 0.1  # it counts


@pytest.mark.parametrize("arch", ["qwen2", "llama"])  # a saved lm_head, a tied one
def test_a_config_silent_on_tying_follows_the_checkpoint(converted, tmp_path, arch):
    """Llama's and Qwen2's configs untie by default where HF's base config ties: without the
    key, a saved lm_head is the head (it had been dropped: the model answered garbage)."""
    _, hf, saved = converted[arch]
    source = tmp_path / "silent"
    shutil.copytree(saved, source)
    config = json.loads((source / "config.json").read_text())
    del config["tie_word_embeddings"]
    (source / "config.json").write_text(json.dumps(config))
    convert_directory(source, tmp_path / "out.gguf")
    with GGUFFile.open(tmp_path / "out.gguf") as f:
        assert ("output.weight" in f.tensors) is (arch == "qwen2")
    assert (ember_logits(tmp_path / "out.gguf", PROMPT) - hf_logits(hf, PROMPT)).abs().max() < 1e-4


def test_model_safetensors_are_taken_over_consolidated_ones(converted, tmp_path):
    """Mistral's folders hold the weights twice, model*.safetensors and consolidated.safetensors
    (its own names): as Ollama's create, the first are the model."""
    from safetensors.torch import save_file

    _, hf, saved = converted["qwen2"]
    source = tmp_path / "both"
    shutil.copytree(saved, source)
    save_file({"layers.0.attention.wk.weight": torch.zeros(4, 4)},
              str(source / "consolidated.safetensors"))  # fmt: skip
    convert_directory(source, tmp_path / "out.gguf")
    assert (ember_logits(tmp_path / "out.gguf", PROMPT) - hf_logits(hf, PROMPT)).abs().max() < 1e-4


# ---------------------------------------------------------------- untrusted directories


@pytest.fixture
def llama_dir(converted, tmp_path):
    source = tmp_path / "copy"
    shutil.copytree(converted["llama"][2], source)
    return source


def edit_config(directory: Path, **changes: object) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | changes))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: edit_config(d, architectures=["FalconForCausalLM"]), "unsupported architecture"),
        (lambda d: edit_config(d, hidden_size=48), "has shape"),
        (lambda d: edit_config(d, num_hidden_layers=3), "lack"),
        (lambda d: edit_config(d, hidden_size="big"), "hidden_size must be an integer"),
        (lambda d: (d / "config.json").write_text("{nope"), "config.json is not valid JSON"),
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 64), "not a valid safetensors"),
        (lambda d: (d / "model.safetensors").unlink(), "no .safetensors"),
        (lambda d: (d / "tokenizer.json").write_text("[]"), "tokenizer.json is not a JSON object"),
        (lambda d: (d / "tokenizer.json").unlink(), "neither tokenizer.json nor tokenizer.model"),
        (
            lambda d: (d / "generation_config.json").write_text('{"eos_token_id": [1, 99999]}'),
            "is not a token id",
        ),
    ],
)
def test_a_broken_directory_is_a_clear_error(llama_dir, tmp_path, damage, message):
    damage(llama_dir)
    with pytest.raises(ConvertError, match=message):
        convert_directory(llama_dir, tmp_path / "out.gguf")


def test_a_truncated_safetensors_file_is_a_clear_error(llama_dir, tmp_path):
    data = (llama_dir / "model.safetensors").read_bytes()
    (llama_dir / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConvertError, match="safetensors"):
        convert_directory(llama_dir, tmp_path / "out.gguf")


def test_a_corrupt_tokenizer_model_is_a_clear_error(converted, tmp_path):
    source = tmp_path / "g"
    shutil.copytree(converted["gemma3"][2], source)
    (source / "tokenizer.model").write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    with pytest.raises(ConvertError, match=r"tokenizer\.model"):
        convert_directory(source, tmp_path / "out.gguf")
