"""Qwen 2.5 VL converted from a tiny HF Qwen2_5_VLForConditionalGeneration, as Ollama's one file
and as a text GGUF + mmproj: pixels equal Qwen2VLImageProcessor's, image embeddings and the
logits of a prompt with an image and text after it equal HF's (1e-4, float32), and the runner's
per-sequence position shift gives HF's M-RoPE positions after an image."""

import functools
import io

import pytest
import torch

T = pytest.importorskip("transformers")

from hf_qwen25vl import MAX_PIXELS, build_qwen25vl  # noqa: E402
from PIL import Image  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402

from ember.batch import Batch  # noqa: E402
from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.model.archs.qwen25vl import Qwen25VL  # noqa: E402
from ember.model.archs.qwen25vl_vision import VisionOptions, preprocess  # noqa: E402
from ember.model.config import Config  # noqa: E402
from ember.model.imageproc import decode_image  # noqa: E402
from ember.runner.positions import after_discard, image_shifts, offsets  # noqa: E402

# (width, height): 4x4 merged tokens in 2x2 windows; 2x5 (a partial window); 3x2 upscaled
IMAGES = [((112, 112), "RGB", 1), ((60, 150), "RGBA", 2), ((90, 50), "P", 3)]
PREFIX, SUFFIX = [10, 11, 12], [13, 14, 15, 16]


def hf_pixels(data: bytes, max_pixels: int = MAX_PIXELS) -> tuple[torch.Tensor, torch.Tensor]:
    processor = T.Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=max_pixels)
    out = processor(Image.open(io.BytesIO(data)), return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25vl")
    hf = build_qwen25vl(root / "hf")
    convert_directory(root / "hf", root / "one.gguf")
    convert_directory(root / "hf", root / "text.gguf", mmproj=root / "mmproj.gguf")
    return root, hf


@pytest.fixture(scope="module", params=["one file", "text + mmproj"])
def models(root, request):
    root, hf = root
    if request.param == "one file":
        ember = load_model(GGUFFile.open(root / "one.gguf"))
    else:
        ember = load_model(GGUFFile.open(root / "text.gguf"), GGUFFile.open(root / "mmproj.gguf"))
    assert isinstance(ember, Qwen25VL)
    return hf, ember


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "L"])
@pytest.mark.parametrize("size", [(640, 480), (97, 203), (28, 28), (1000, 30)])
def test_preprocessing_equals_qwen2vl_image_processor(size, mode):
    """With Qwen2.5-VL's real preprocessor_config.json (min 3136, max 12,845,056 pixels)."""
    options = VisionOptions.from_config(Config({"a.vision.block_count": 1,
        "a.vision.embedding_length": 32, "a.vision.attention.head_count": 2,
        "a.vision.max_pixels": 12845056}, "a"))  # fmt: skip
    data = image_bytes(size, mode, 7)
    ours = preprocess(decode_image(data), options)
    theirs, grid = hf_pixels(data, 12845056)
    assert grid.tolist() == [[1, ours.height, ours.width]]
    assert (ours.rows - theirs).abs().max() < 1e-5


def test_max_pixels_comes_from_the_folder_capped_at_ollamas(root):
    with GGUFFile.open(root[0] / "one.gguf") as f:
        assert f.metadata["qwen25vl.vision.max_pixels"] == MAX_PIXELS


def image_types(hf, ids: list[int]) -> torch.Tensor:
    return (torch.tensor([ids]) == hf.config.image_token_id).int()


@functools.cache
def hf_run(hf, data: bytes) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """HF's input ids, image embeddings (as the text model received them) and logits (once per
    image: both file conventions compare with them)."""
    pixels, grid = hf_pixels(data)
    n = int(grid.prod()) // 4
    c = hf.config
    ids = [*PREFIX, c.vision_start_token_id, *[c.image_token_id] * n, c.vision_end_token_id,
           *SUFFIX]  # fmt: skip
    seen = {}
    hook = hf.model.language_model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.update(kw), with_kwargs=True
    )
    try:
        with torch.no_grad():  # mm_token_type_ids: without them HF falls back to 1-D positions
            logits = hf(input_ids=torch.tensor([ids]), pixel_values=pixels, image_grid_thw=grid,
                        mm_token_type_ids=image_types(hf, ids))  # fmt: skip
    finally:
        hook.remove()
    rows = seen["inputs_embeds"][0][torch.tensor(ids) == c.image_token_id]
    return ids, rows, logits.logits[0]


def ember_logits(ember, data: bytes, capacity: int = 256) -> tuple[list[int], torch.Tensor]:
    encoded = ember.encode_multimodal(data)
    span = ember.image_span(encoded)
    ids = [*PREFIX, *span.tokens, *SUFFIX]
    multimodal = {len(PREFIX) + k: v for k, v in span.pieces.items()}
    shifts = image_shifts(ember, multimodal)
    cache = ember.make_cache()
    cache.init(max_sequences=1, capacity=capacity, max_batch=capacity)
    n = len(ids)
    batch = Batch(tokens=tuple(ids), positions=tuple(range(n)), sequences=(0,) * n,
                  outputs=tuple(range(n)), multimodal=tuple(multimodal),
                  multimodal_data=tuple(multimodal.values()),
                  position_offsets=tuple(offsets(shifts, 0, n)))  # fmt: skip
    cache.start_forward(batch)
    with torch.inference_mode():
        return ids, ember.forward(batch, cache)


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_image_embeddings_equal_hf(models, size, mode, seed):
    hf, ember = models
    data = image_bytes(size, mode, seed)
    _, theirs, _ = hf_run(hf, data)
    ours = ember.encode_multimodal(data)
    assert ours.rows.shape == theirs.shape
    assert (ours.rows - theirs).abs().max() < 1e-4


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_logits_of_a_prompt_with_an_image_and_text_after_it_equal_hf(models, size, mode, seed):
    hf, ember = models
    data = image_bytes(size, mode, seed)
    their_ids, _, theirs = hf_run(hf, data)
    ids, ours = ember_logits(ember, data)
    assert ids == their_ids
    assert (ours - theirs).abs().max() < 1e-4


def test_shifts_follow_hf_rope_index(models):
    hf, ember = models
    data = image_bytes((60, 150), "RGB", 2)  # 2 x 5 merged tokens: later text moves by 5
    ids, _ = ember_logits(ember, data)
    theirs, _ = hf.model.get_rope_index(
        torch.tensor([ids]), image_types(hf, ids), image_grid_thw=hf_pixels(data)[1]
    )
    span = ember.image_span(ember.encode_multimodal(data))
    shifts = image_shifts(ember, {len(PREFIX) + 1: span.pieces[1]})
    assert shifts == [(len(PREFIX) + 1 + 10, 5 - 10)]
    after = len(PREFIX) + len(span.tokens)
    assert theirs[:, 0, after].tolist() == [after + shifts[0][1]] * 3
    # a context shift keeps the image's shift for what follows, even once the image is gone
    assert after_discard(shifts, 2, 20) == [(2, -5)]
    assert after_discard(shifts, 20, 5) == shifts


def test_the_files_follow_ollama_and_llama_cpp(root):
    root, _ = root
    with GGUFFile.open(root / "one.gguf") as f:
        assert f.metadata["general.architecture"] == "qwen25vl"
        assert f.metadata["qwen25vl.rope.mrope_section"] == [2, 3, 3]
        assert f.metadata["qwen25vl.vision.fullatt_block_indexes"] == [1]
        assert {"v.patch_embd_0.weight", "v.blk.0.attn_q.weight", "v.merger.mlp.0.weight"} <= set(
            f.tensors
        )
    with GGUFFile.open(root / "mmproj.gguf") as f:
        assert f.metadata["clip.projector_type"] == "qwen2.5vl_merger"
        assert f.metadata["clip.vision.n_wa_pattern"] == 2
        assert {
            "v.patch_embd.weight",
            "v.patch_embd.weight.1",
            "v.post_ln.weight",
            "mm.2.bias",
        } <= set(f.tensors)
    with GGUFFile.open(root / "text.gguf") as f:
        assert f.metadata["general.architecture"] == "qwen2vl"
        assert f.metadata["qwen2vl.rope.dimension_sections"] == [2, 3, 3, 0]
        assert not any(name.startswith(("v.", "mm.")) for name in f.tensors)
