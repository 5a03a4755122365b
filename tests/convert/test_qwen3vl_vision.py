"""Qwen3-VL with images, converted from a tiny HF Qwen3VLForConditionalGeneration to Ollama's
one `qwen3vl` file: pixels equal Qwen2VLImageProcessor's (patch 16, the folder's mean and std),
the image embeddings and each deepstack merger's equal HF's, and the logits of a prompt with an
image and text after it equal HF's (1e-4, float32): interleaved M-RoPE at HF's positions, the
deepstack rows added after the first layers, also where they reach the last layer; the MoE
sibling (`qwen3vlmoe`) too, and Qwen3.5 (`qwen35`: the tower without deepstack, under DeltaNet
layers)."""

import functools
import io

import pytest
import torch

T = pytest.importorskip("transformers")

from hf_qwen3vl import MAX_PIXELS, MIN_PIXELS, build_qwen3vl, hf_processor  # noqa: E402
from PIL import Image  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402
from test_qwen25vl import PREFIX, SUFFIX, ember_logits, image_types  # noqa: E402

from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.model.archs.qwen3vl import Qwen3VL, Qwen3VLMoe  # noqa: E402
from ember.model.archs.qwen3vl_vision import VisionOptions  # noqa: E402
from ember.model.archs.qwen25vl import longest_span  # noqa: E402
from ember.model.archs.qwen25vl_vision import preprocess, smart_resize  # noqa: E402
from ember.model.archs.qwen35 import Qwen35VL  # noqa: E402
from ember.model.config import Config  # noqa: E402
from ember.model.imageproc import decode_image  # noqa: E402

# (width, height): 4 x 4 merged tokens; 2 x 5; 3 x 2 upscaled to the least pixels
IMAGES = [((128, 128), "RGB", 1), ((64, 160), "RGBA", 2), ((90, 50), "P", 3)]


def hf_pixels(data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    out = hf_processor()(Image.open(io.BytesIO(data)), return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


# (text layers, family, its architecture, Ember's class)
MODELS = {"3 layers": (3, "Qwen3VL", "qwen3vl", Qwen3VL),
          "2 layers": (2, "Qwen3VL", "qwen3vl", Qwen3VL),
          "moe": (3, "Qwen3VLMoe", "qwen3vlmoe", Qwen3VLMoe),
          "qwen3.5": (4, "Qwen3_5", "qwen35", Qwen35VL)}  # fmt: skip


@pytest.fixture(scope="module", params=list(MODELS))
def models(tmp_path_factory, request):
    """With 2 text layers the second deepstack merger's rows are added after the last layer;
    Qwen3.5's tower has no deepstack, under its DeltaNet layers."""
    root = tmp_path_factory.mktemp("qwen3vl")
    layers, family, arch, kind = MODELS[request.param]
    hf = build_qwen3vl(root / "hf", layers=layers, family=family)
    convert_directory(root / "hf", root / "one.gguf")
    with GGUFFile.open(root / "one.gguf") as f:
        assert f.metadata["general.architecture"] == arch
    ember = load_model(GGUFFile.open(root / "one.gguf"))
    assert isinstance(ember, kind)
    return hf, ember


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
@pytest.mark.parametrize("size", [(640, 480), (97, 203), (28, 28), (1000, 30)])
def test_preprocessing_equals_qwen2vl_image_processor(size, mode):
    options = VisionOptions.from_config(Config({"a.vision.block_count": 1,
        "a.vision.embedding_length": 32, "a.vision.attention.head_count": 2,
        "a.vision.patch_size": 16, "a.vision.shortest_edge": MIN_PIXELS,
        "a.vision.longest_edge": MAX_PIXELS, "a.vision.image_mean": [0.5, 0.4, 0.3],
        "a.vision.image_std": [0.2, 0.25, 0.3]}, "a"))  # fmt: skip
    data = image_bytes(size, mode, 7)
    ours = preprocess(decode_image(data), options)
    theirs, grid = hf_pixels(data)
    assert grid.tolist() == [[1, ours.height, ours.width]]
    assert (ours.rows - theirs).abs().max() < 1e-5


def test_the_pixel_bounds_default_to_ollamas():
    options = VisionOptions.from_config(Config({"a.vision.longest_edge": 16777216}, "a"))
    assert (options.min_pixels, options.max_pixels) == (64 << 10, 2 << 20)
    assert (options.mean, options.std, options.deepstack) == ((0.5,) * 3, (0.5,) * 3, ())


@functools.cache
def hf_run(hf, data: bytes):
    """HF's input ids, image and deepstack embeddings, and logits (once per model and image)."""
    pixels, grid = hf_pixels(data)
    n = int(grid.prod()) // 4
    c = hf.config
    ids = [*PREFIX, c.vision_start_token_id, *[c.image_token_id] * n, c.vision_end_token_id,
           *SUFFIX]  # fmt: skip
    with torch.no_grad():
        features = hf.model.get_image_features(pixels, grid)
        logits = hf(input_ids=torch.tensor([ids]), pixel_values=pixels, image_grid_thw=grid,
                    mm_token_type_ids=image_types(hf, ids)).logits[0]  # fmt: skip
    stacked = getattr(features, "deepstack_features", None) or []
    return ids, features.pooler_output[0], [f[0] for f in stacked], logits


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_image_and_deepstack_embeddings_equal_hf(models, size, mode, seed):
    hf, ember = models
    data = image_bytes(size, mode, seed)
    _, rows, deepstack, _ = hf_run(hf, data)
    ours = ember.encode_multimodal(data)
    assert ours.rows.shape == rows.shape
    assert (ours.rows - rows).abs().max() < 1e-4
    assert len(ours.deepstack) == len(deepstack) == (0 if isinstance(ember, Qwen35VL) else 2)
    for mine, theirs in zip(ours.deepstack, deepstack, strict=True):
        assert (mine - theirs).abs().max() < 1e-4


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_logits_of_a_prompt_with_an_image_and_text_after_it_equal_hf(models, size, mode, seed):
    hf, ember = models
    data = image_bytes(size, mode, seed)
    their_ids, _, _, theirs = hf_run(hf, data)
    ids, ours = ember_logits(ember, data)
    assert ids == their_ids
    # Qwen3.5's DeltaNet: 2e-4 of the largest logit (its text test's bound: HF's own cached and
    # whole runs differ by up to 8.4e-5 of it)
    bound = 2e-4 * theirs.abs().max() if isinstance(ember, Qwen35VL) else 1e-4
    assert (ours - theirs).abs().max() < bound



def test_no_image_takes_more_than_the_longest_span(models):
    """The load reservation's bound, on the tiny model's images and on the sizes smart_resize
    gives at Ollama's 2 M pixels (patch 16 or 14): oblong images near the bound take more
    tokens than the square worst-case image, never more than longest_image_span."""
    _, ember = models
    spans = [len(ember.image_span(ember.encode_multimodal(image_bytes(size, "RGB", 1))).tokens)
             for size in [(2048, 2048), (96, 384), (192, 160), (400, 90)]]  # fmt: skip
    assert max(spans) <= ember.longest_image_span
    for patch in (16, 14):
        o = VisionOptions.from_config(Config({"a.vision.patch_size": patch}, "a"))
        factor = patch * o.merge_size
        tokens = {(h, w): smart_resize(h, w, factor, o.min_pixels, o.max_pixels)
                  for h in range(800, 2400, 37) for w in (2048, 1000, 1500)}  # fmt: skip
        most = max(h * w for h, w in tokens.values()) // factor**2
        h, w = smart_resize(2048, 2048, factor, o.min_pixels, o.max_pixels)
        assert h * w // factor**2 < most <= longest_span(o) - 2
