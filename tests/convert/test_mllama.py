"""Llama 3.2 Vision (mllama) converted from a tiny HF MllamaForConditionalGeneration: tiles equal
HF's MllamaImageProcessor's, the cross-attention states and the logits of a prompt with an image
equal HF's (1e-4), a prompt with no image equals HF's text-only forward.

transformers 5 collects a vision intermediate layer's OUTPUT (its encoder appends after each
layer); Meta's reference, transformers 4 and Ollama take its INPUT, and the GGUF key means that.
HF's encoder is run here with 4's collection, so the reference is HF's code with Meta's meaning."""

import io
import types

import pytest
import torch

T = pytest.importorskip("transformers")

from hf_mllama import MAX_TILES, POSITIONS, TILE, build_mllama  # noqa: E402
from PIL import Image  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402
from transformers.modeling_outputs import BaseModelOutput  # noqa: E402

from ember.batch import Batch  # noqa: E402
from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.model.archs.mllama import Mllama  # noqa: E402
from ember.model.archs.mllama_vision import MEAN, STD, aspect_ratios, to_tiles  # noqa: E402
from ember.model.imageproc import decode_image  # noqa: E402


def hf_processor(tile: int) -> "T.MllamaImageProcessorPil":
    return T.MllamaImageProcessorPil(size={"height": tile, "width": tile}, max_image_tiles=4,
                                     image_mean=list(MEAN), image_std=list(STD))  # fmt: skip


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "L"])
@pytest.mark.parametrize("size", [(640, 480), (97, 203), (1500, 400)])
def test_tiles_equal_hf_image_processor(mode, size):
    """Llama 3.2 Vision's settings: 560-pixel tiles, at most 4, CLIP's mean and std."""
    data = image_bytes(size, mode, seed=hash((mode, size)) % 1000)
    theirs = hf_processor(560)(Image.open(io.BytesIO(data)), return_tensors="pt")
    ours = to_tiles(decode_image(data), 560, 4)
    assert aspect_ratios(4).index(ours.arrangement) + 1 == int(theirs["aspect_ratio_ids"][0, 0])
    assert theirs["num_tiles"] == [[ours.count]]
    assert (ours.pixels - theirs["pixel_values"][0, 0, : ours.count]).abs().max() < 1e-5


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("mllama")
    hf = build_mllama(root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    return hf, root / "model.gguf"


@pytest.fixture(scope="module")
def models(converted):
    hf, path = converted
    ember = load_model(GGUFFile.open(path))
    assert isinstance(ember, Mllama)
    encoder = hf.model.vision_model.transformer
    encoder.forward = types.MethodType(_inputs_as_intermediate_states, encoder)
    return hf, ember


def test_a_q8_0_file_keeps_the_tower_and_stays_close(models, converted, tmp_path):
    """`ember create --quantize q8_0`: the text weights quantized, the tower and projector
    kept (as llama.cpp and Ollama), the logits of a prompt with an image close."""
    from ember.store.quantize import quantize

    out = tmp_path / "q8_0.gguf"
    with out.open("wb") as f:
        for _ in quantize(converted[1], f, "Q8_0"):  # type: ignore[arg-type]
            pass
    with GGUFFile.open(out) as g:
        types_ = {name: info.ggml_type for name, info in g.tensors.items()}
    assert types_["blk.1.cross_attn_q_proj.weight"] == types_["blk.0.attn_q.weight"] == 8
    assert all(t in (0, 1) for n, t in types_.items() if n.startswith(("v.", "mm.")))
    _, ember = models
    quantized = load_model(GGUFFile.open(out))
    data = image_bytes((50, 30), "RGB", 1)
    ids = [ember.image_token, 10, 11, 12]
    full = run(ember, ids, {0: ember.encode_multimodal(data)})
    close = run(quantized, ids, {0: quantized.encode_multimodal(data)})
    assert (close - full).abs().max() < 0.1 * (full.max() - full.min())


def _inputs_as_intermediate_states(self, hidden_states, attention_mask=None):
    """transformers 4's MllamaVisionEncoder: hidden_states[i] is layer i's input."""
    states = ()
    for layer in self.layers:
        states += (hidden_states,)
        hidden_states = layer(hidden_states, attention_mask=attention_mask)
    return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=states)


def hf_inputs(data: bytes) -> dict[str, torch.Tensor]:
    out = hf_processor(TILE)(Image.open(io.BytesIO(data)), return_tensors="pt")
    return {k: out[k] for k in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")}


IMAGES = [((50, 30), "RGB", 1, 4), ((20, 64), "RGBA", 2, 3)]  # 2 × 2 tiles, 3 × 1 tiles


@pytest.mark.parametrize(("size", "mode", "seed", "tiles"), IMAGES)
def test_cross_attention_states_equal_hf(models, size, mode, seed, tiles):
    hf, ember = models
    data = image_bytes(size, mode, seed)
    with torch.no_grad():
        vision = hf.model.vision_model(**hf_inputs(data)).last_hidden_state
        theirs = hf.model.multi_modal_projector(vision)[0, 0]  # (max tiles, positions, C)
    ours = ember.encode_multimodal(data)
    assert theirs.shape[0] == MAX_TILES and ours.shape == (tiles * POSITIONS, 64)
    assert (ours - theirs[:tiles].reshape(ours.shape)).abs().max() < 1e-4


@pytest.mark.parametrize(("size", "mode", "seed", "tiles"), IMAGES)
def test_logits_of_a_prompt_with_an_image_equal_hf(models, size, mode, seed, tiles):
    """The prompt starts at its image (every row sees it: HF's processor's cross-attention
    mask over the image's real tiles)."""
    hf, ember = models
    data = image_bytes(size, mode, seed)
    ids = [hf.config.image_token_index, 10, 11, 12, 13, 14]
    mask = torch.zeros(1, len(ids), 1, MAX_TILES, dtype=torch.long)
    mask[..., :tiles] = 1
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor([ids]), cross_attention_mask=mask,
                    **hf_inputs(data)).logits[0]  # fmt: skip
    ours = run(ember, ids, {0: ember.encode_multimodal(data)})
    assert (ours - theirs).abs().max() < 1e-4


def test_a_prompt_without_an_image_equals_hf_text_only(models):
    """No image: the cross-attention layers are skipped, as HF's text-only forward skips them."""
    hf, ember = models
    ids = [1, 10, 11, 12, 13]
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor([ids])).logits[0]
    assert (run(ember, ids, {}) - theirs).abs().max() < 1e-4


def test_rows_before_the_image_skip_cross_attention_as_metas_reference(models):
    """Rows before the image (HF's processor masks their whole cross-attention row) skip the
    cross-attention layers: Meta's reference zeroes both halves of such a row. HF zeroes only
    the MLP half and adds the attention of an unmasked row: with that half zeroed too, HF
    gives Ember's logits for every row; as HF ships, the masked rows differ."""
    hf, ember = models
    data = image_bytes((50, 30), "RGB", 1)
    ids = [1, 10, hf.config.image_token_index, 11, 12, 13]
    mask = torch.zeros(1, len(ids), 1, MAX_TILES, dtype=torch.long)
    mask[:, 2:] = 1  # the processor's: from the image token on, every tile (2 × 2 here)
    ours = run(ember, ids, {2: ember.encode_multimodal(data)})
    layer = hf.model.language_model.layers[1]
    with torch.no_grad():
        shipped = hf(input_ids=torch.tensor([ids]), cross_attention_mask=mask,
                     **hf_inputs(data)).logits[0]  # fmt: skip
        layer.forward = types.MethodType(_cross_layer_as_metas, layer)
        try:
            metas = hf(input_ids=torch.tensor([ids]), cross_attention_mask=mask,
                       **hf_inputs(data)).logits[0]  # fmt: skip
        finally:
            del layer.forward
        text_only = hf(input_ids=torch.tensor([ids[:2]])).logits[0]
    assert (ours - metas).abs().max() < 1e-4
    assert (ours[:2] - text_only).abs().max() < 1e-4
    assert (shipped[:2] - text_only).abs().max() > 1e-2


def _cross_layer_as_metas(self, hidden_states, cross_attention_states, cross_attention_mask,
                          attention_mask, full_text_row_masked_out_mask, **kwargs):  # fmt: skip
    """HF's MllamaCrossAttentionDecoderLayer.forward with the attention of a fully masked row
    zeroed too, as Meta's CrossAttention does."""
    row = full_text_row_masked_out_mask[:, 0]
    attn, _ = self.cross_attn(hidden_states=self.input_layernorm(hidden_states),
                              attention_mask=cross_attention_mask,
                              cross_attention_states=cross_attention_states,
                              cache=kwargs.get("cache"))  # fmt: skip
    hidden_states = hidden_states + self.cross_attn_attn_gate.tanh() * row * attn
    mlp = self.mlp(self.post_attention_layernorm(hidden_states))
    return hidden_states + self.cross_attn_mlp_gate.tanh() * row * mlp


def test_the_image_token_is_the_tokenizers_last(models):
    hf, ember = models
    assert ember.image_token == hf.config.image_token_index
    assert ember.vocab_size == hf.config.text_config.vocab_size
    assert ember.image_span(torch.zeros(3, 64)).tokens == [ember.image_token]


def run(model: Mllama, ids: list[int], images: dict[int, torch.Tensor]) -> torch.Tensor:
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    n = len(ids)
    batch = Batch(tuple(ids), tuple(range(n)), (0,) * n, tuple(range(n)),
                  tuple(images), tuple(images.values()))  # fmt: skip
    cache.start_forward(batch)
    with torch.inference_mode():
        return model.forward(batch, cache)


def test_hf_intermediate_states_are_layer_outputs_in_transformers_5(models):
    """Why the reference is patched: unpatched, transformers 5 gives other states."""
    hf, _ = models
    inputs = hf_inputs(image_bytes((50, 30), "RGB", 1))
    encoder = hf.model.vision_model.transformer
    with torch.no_grad():
        v4 = hf.model.vision_model(**inputs).last_hidden_state
        del encoder.forward  # the class's own
        try:
            v5 = hf.model.vision_model(**inputs).last_hidden_state
        finally:
            encoder.forward = types.MethodType(_inputs_as_intermediate_states, encoder)
    assert (v5[..., :32] - v4[..., :32]).abs().max() < 1e-6  # the last layer's output agrees
    assert (v5[..., 32:] - v4[..., 32:]).abs().max() > 1e-3  # the intermediate one does not


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("text_config", "cross_attention_layers", [7], "cross_attention_layers"),
        ("vision_config", "supported_aspect_ratios", [[1, 1], [2, 2]], "supported_aspect_ratios"),
        ("vision_config", "intermediate_layers_indices", [5], "intermediate_layers_indices"),
    ],
)
def test_a_config_ember_cannot_run_is_refused(converted, tmp_path, section, key, value, message):
    import json
    import shutil

    from ember.convert.source import ConvertError

    source = converted[1].parent / "hf"
    shutil.copytree(source, tmp_path / "hf")
    config = json.loads((source / "config.json").read_text())
    config[section][key] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match=message):
        convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
