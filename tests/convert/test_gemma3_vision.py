"""Gemma 3 vision converted from a tiny HF Gemma3ForConditionalGeneration: pixels equal HF's image
processor's, image embeddings and the logits of a prompt with an image equal HF's (1e-4)."""

import io

import numpy as np
import pytest
import torch

T = pytest.importorskip("transformers")

from hf_vision import IMAGE_SIZE, TOKENS_PER_IMAGE, build_gemma3_vision  # noqa: E402
from PIL import Image  # noqa: E402

from ember.batch import Batch  # noqa: E402
from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.model.archs.gemma3_vision import Gemma3Vision  # noqa: E402
from ember.model.imageproc import decode_image, to_pixels  # noqa: E402


def image_bytes(size: tuple[int, int], mode: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    rgba = rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8)
    image = Image.fromarray(rgba, "RGBA")
    image = image if mode == "RGBA" else image.convert(mode)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def hf_pixels(data: bytes, size: int) -> torch.Tensor:
    processor = T.Gemma3ImageProcessor(size={"height": size, "width": size})
    return processor(Image.open(io.BytesIO(data)), return_tensors="pt")["pixel_values"][0]


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "L", "LA"])
@pytest.mark.parametrize("size", [(640, 480), (97, 203), (896, 896)])
def test_preprocessing_equals_hf_image_processor(mode, size):
    data = image_bytes(size, mode, seed=hash((mode, size)) % 1000)
    ours = to_pixels(decode_image(data), (896, 896), mean=(0.5,) * 3, std=(0.5,) * 3)
    assert (ours - hf_pixels(data, 896)).abs().max() < 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3v")
    hf = build_gemma3_vision(root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    ember = load_model(GGUFFile.open(root / "model.gguf"))
    assert isinstance(ember, Gemma3Vision)
    return hf, ember


IMAGES = [((50, 30), "RGB", 1), ((20, 64), "RGBA", 2)]


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_image_embeddings_equal_hf(models, size, mode, seed):
    hf, ember = models
    data = image_bytes(size, mode, seed)
    with torch.no_grad():
        theirs = hf.model.get_image_features(hf_pixels(data, IMAGE_SIZE)[None])
    theirs = getattr(theirs, "pooler_output", theirs)
    theirs = theirs[0] if isinstance(theirs, (tuple, list)) else theirs
    ours = ember.encode_multimodal(data)
    assert ours.shape == (TOKENS_PER_IMAGE, 64)
    assert (ours - theirs.reshape(ours.shape)).abs().max() < 1e-4


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_logits_of_a_prompt_with_an_image_equal_hf(models, size, mode, seed):
    ours, theirs = logits_with_image(*models, image_bytes(size, mode, seed))
    assert (ours - theirs).abs().max() < 1e-4


def test_image_tokens_attend_to_each_other_both_ways(models, monkeypatch):
    """Without the bidirectional span the logits differ: the check above depends on it."""
    import ember.model.archs.gemma3_vision as module

    monkeypatch.setattr(module, "both_ways", lambda cache, spans: None)
    ours, theirs = logits_with_image(*models, image_bytes((50, 30), "RGB", 1))
    assert (ours - theirs).abs().max() > 1e-3


def logits_with_image(hf, ember, data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = hf.config
    prefix, suffix = [2, 10, 11, cfg.boi_token_index], [cfg.eoi_token_index, 12, 13, 14]
    ids = [*prefix, *[cfg.image_token_index] * TOKENS_PER_IMAGE, *suffix]
    tensor = torch.tensor([ids])
    with torch.no_grad():
        theirs = hf(input_ids=tensor, pixel_values=hf_pixels(data, IMAGE_SIZE)[None],
                    token_type_ids=(tensor == cfg.image_token_index).long()).logits[0]  # fmt: skip
    cache = ember.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    batch = Batch(tokens=tuple(ids), positions=tuple(range(len(ids))), sequences=(0,) * len(ids),
                  outputs=tuple(range(len(ids))), multimodal=(len(prefix),))  # fmt: skip
    cache.start_forward(batch)
    with torch.inference_mode():
        ours = ember.logits(ember.hidden_with_images(batch, cache, [ember.encode_multimodal(data)]))
    return ours, theirs


def test_text_gguf_plus_mmproj_gives_the_same_logits(models, tmp_path):
    """llama.cpp's convention: the text GGUF and an mmproj GGUF (clip names and keys)."""
    hf, single = models
    source = tmp_path / "hf"
    build_gemma3_vision(source)
    convert_directory(source, tmp_path / "text.gguf", mmproj=tmp_path / "mmproj.gguf")
    with GGUFFile.open(tmp_path / "mmproj.gguf") as f:
        assert f.metadata["general.architecture"] == "clip"
        assert "v.blk.0.ln1.weight" in f.tensors and "mm.input_projection.weight" in f.tensors
    with GGUFFile.open(tmp_path / "text.gguf") as f:
        assert not any(name.startswith("v.") for name in f.tensors)
        assert not isinstance(load_model(f), Gemma3Vision)  # alone, a text model
    split = load_model(
        GGUFFile.open(tmp_path / "text.gguf"), GGUFFile.open(tmp_path / "mmproj.gguf")
    )
    data = image_bytes((50, 30), "RGB", 1)
    assert torch.equal(split.encode_multimodal(data), single.encode_multimodal(data))
    ours, theirs = logits_with_image(hf, split, data)
    assert (ours - theirs).abs().max() < 1e-4
