"""Gemma 4 with images, converted from a tiny HF Gemma4ForConditionalGeneration (clipped
linears, standardized outputs) to Ollama's one `gemma4` file: patches equal
Gemma4ImageProcessor's, the image embeddings equal HF's `get_image_features`, and the logits of
a prompt with an image between text equal HF's (float32): causal, or (the larger models') the
image's rows seeing its later rows on the sliding layers; their per-layer embeddings are the pad
token's."""

import functools
import io

import pytest
import torch

T = pytest.importorskip("transformers")

from hf_gemma4v import KERNEL, PATCH, build_gemma4v, hf_processor  # noqa: E402
from PIL import Image  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402
from test_qwen25vl import PREFIX, SUFFIX, ember_logits  # noqa: E402

from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.model.archs.gemma4 import SLIDING  # noqa: E402
from ember.model.archs.gemma4_vision import Gemma4Vision, VisionOptions, preprocess  # noqa: E402
from ember.model.config import Config  # noqa: E402
from ember.model.imageproc import decode_image  # noqa: E402
from ember.runner.memory import reserve  # noqa: E402

# (width, height): 7 x 12 pooled tokens filling the budget; a wide strip; a tiny upscaled one
IMAGES = [((90, 160), "RGB", 1), ((400, 30), "RGBA", 2), ((20, 14), "P", 3)]


def hf_pixels(data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    out = hf_processor()(Image.open(io.BytesIO(data)), return_tensors="pt")
    return out["pixel_values"], out["image_position_ids"]


@pytest.fixture(scope="module", params=[False, True], ids=["causal", "both ways"])
def models(tmp_path_factory, request):
    """The smaller models' causal attention over images, and the larger ones' both ways on the
    sliding layers (with the tiny model's window of 6, narrower than an image)."""
    root = tmp_path_factory.mktemp("gemma4v")
    hf = build_gemma4v(root / "hf", both_ways=request.param)
    convert_directory(root / "hf", root / "one.gguf")
    ember = load_model(GGUFFile.open(root / "one.gguf"))
    assert isinstance(ember, Gemma4Vision)
    return hf, ember


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
@pytest.mark.parametrize("size", [(640, 480), (97, 203), (12, 12), (1000, 30)])
def test_patches_equal_gemma4_image_processor(size, mode):
    options = VisionOptions.from_config(Config({"a.vision.block_count": 1,
        "a.vision.embedding_length": 32, "a.vision.attention.head_count": 2,
        "a.vision.patch_size": PATCH, "a.vision.projector.scale_factor": KERNEL}, "a"))  # fmt: skip
    data = image_bytes(size, mode, 7)
    ours = preprocess(decode_image(data), options)
    theirs, positions = hf_pixels(data)
    n = len(ours.rows)
    assert positions[0, n - 1].tolist() == [ours.width - 1, ours.height - 1]
    assert (positions[0, n:] == -1).all()  # HF pads to its budget; Ember leaves padding out
    as_hf = ours.rows.view(n, 3, PATCH, PATCH).permute(0, 2, 3, 1).reshape(n, -1)
    assert (as_hf - (2 * theirs[0, :n] - 1)).abs().max() < 1e-5


@functools.cache
def hf_run(hf, data: bytes):
    """HF's input ids, image embeddings and logits (once per image)."""
    pixels, positions = hf_pixels(data)
    with torch.no_grad():
        rows = hf.model.get_image_features(pixels, positions).pooler_output[0]
        c = hf.config
        ids = [*PREFIX, c.boi_token_id, *[c.image_token_id] * len(rows), c.eoi_token_id, *SUFFIX]
        types = (torch.tensor([ids]) == c.image_token_id).int()
        logits = hf(input_ids=torch.tensor([ids]), pixel_values=pixels,
                    image_position_ids=positions, mm_token_type_ids=types).logits[0]  # fmt: skip
    return ids, rows, logits


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_image_embeddings_equal_hf(models, size, mode, seed):
    hf, ember = models
    _, theirs, _ = hf_run(hf, image_bytes(size, mode, seed))
    ours = ember.encode_multimodal(image_bytes(size, mode, seed))
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max() < 1e-4


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_logits_of_a_prompt_with_an_image_and_text_after_it_equal_hf(models, size, mode, seed):
    hf, ember = models
    data = image_bytes(size, mode, seed)
    their_ids, _, theirs = hf_run(hf, data)
    ids, ours = ember_logits(ember, data, capacity=512)
    image = [i for i, t in enumerate(their_ids) if t == hf.config.image_token_id]
    assert [t for i, t in enumerate(ids) if i not in image] == [
        t for i, t in enumerate(their_ids) if i not in image
    ]  # the placeholders: the pad token, where HF's ids hold its image token
    # 5e-5 of the largest logit: float32's summation order over 280-odd rows and five layers
    # (measured up to 3.6e-5 of it; the image embeddings themselves agree within 4e-6)
    assert (ours - theirs).abs().max() < 5e-5 * theirs.abs().max()


def test_no_image_takes_more_than_the_longest_span(models):
    """The load reservation's bound (280 pooled tokens and the two around them): oblong images
    take more tokens than the square worst-case image."""
    _, ember = models
    sizes = [(2048, 2048), (60, 40), (400, 30), (1000, 999)]
    images = {size: ember.encode_multimodal(image_bytes(size, "RGB", 1)) for size in sizes}
    spans = {size: len(ember.image_span(rows).tokens) for size, rows in images.items()}
    assert spans[(2048, 2048)] < max(spans.values()) <= ember.longest_image_span == 282


def test_the_load_reservation_takes_the_declared_span_without_running_the_tower(
    models, monkeypatch
):
    """The sliding layers' cache holds its window and the longest span (282 tokens), where a
    batch of 16 would hold 22 cells; the tower does not run at load."""
    _, ember = models

    def refuse(self, data: bytes):
        raise AssertionError("the tower ran at load")

    monkeypatch.setattr(type(ember), "encode_multimodal", refuse)
    cache = ember.make_cache()
    reserve(ember, cache, num_parallel=1, num_ctx=512, num_batch=16, dtype=torch.float32)
    assert cache.caches[SLIDING].num_cells == ember.options.window + 282
