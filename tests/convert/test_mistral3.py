"""Mistral 3 (Pixtral) converted from a tiny HF Mistral3ForConditionalGeneration, as Ollama's
single GGUF and as llama.cpp's text GGUF + mmproj: pixels equal HF's PixtralImageProcessor's
(Mistral Small 3.1's settings), image embeddings and the logits of a prompt with an image equal
HF's (1e-4, float32) for images of several sizes and aspect ratios."""

import io
import json
import shutil

import pytest
import torch

T = pytest.importorskip("transformers")

from hf_mistral3 import IMG, IMG_BREAK, IMG_END, LONGEST_EDGE, MERGE, PATCH, build_mistral3  # noqa: E402
from PIL import Image  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402

from ember.batch import Batch  # noqa: E402
from ember.convert import ConvertError, convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.model.archs.mistral3 import Mistral3Vision  # noqa: E402
from ember.model.imageproc import decode_image, fit_longest_edge, to_pixels  # noqa: E402

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# (width, height), mode, seed: wide, tall (scaled down to fit), square-ish
IMAGES = [((50, 30), "RGB", 1), ((97, 203), "RGBA", 2), ((40, 47), "P", 3)]


def hf_inputs(data: bytes, longest_edge: int, patch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PixtralImageProcessor as PixtralProcessor calls it: patch_size = patch * merge."""
    processor = T.PixtralImageProcessor(
        patch_size={"height": patch, "width": patch}, size={"longest_edge": longest_edge}
    )
    out = processor(Image.open(io.BytesIO(data)), return_tensors="pt")
    return out["pixel_values"], torch.as_tensor(out["image_sizes"])


@pytest.mark.parametrize(
    ("size", "mode"),
    [((640, 480), "RGB"), ((97, 203), "RGBA"), ((1600, 900), "P"), ((33, 1800), "L"),
     ((1540, 1000), "RGBA")],
)  # fmt: skip
def test_preprocessing_equals_pixtral_image_processor(size, mode):
    """Mistral Small 3.1's settings: longest edge 1540, 14-pixel patches merged 2 × 2."""
    data = image_bytes(size, mode, seed=sum(size) + len(mode))
    image = decode_image(data)
    shape = fit_longest_edge(*image.size, 1540, 28)
    ours = to_pixels(image, shape, mean=CLIP_MEAN, std=CLIP_STD, resample=Image.Resampling.BICUBIC)
    theirs, sizes = hf_inputs(data, 1540, 28)
    assert tuple(sizes[0].tolist()) == shape
    assert ours.shape == theirs[0].shape
    assert (ours - theirs[0]).abs().max() < 1e-5


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("mistral3")


@pytest.fixture(scope="module")
def hf(root):
    return build_mistral3(root / "hf")


@pytest.fixture(scope="module")
def single(hf, root):
    convert_directory(root / "hf", root / "model.gguf")
    model = load_model(GGUFFile.open(root / "model.gguf"))
    assert isinstance(model, Mistral3Vision)
    return model


@pytest.fixture(scope="module")
def split(hf, root):
    convert_directory(root / "hf", root / "text.gguf", mmproj=root / "mmproj.gguf")
    model = load_model(GGUFFile.open(root / "text.gguf"), GGUFFile.open(root / "mmproj.gguf"))
    assert isinstance(model, Mistral3Vision)
    return model


def hf_features(hf, data: bytes) -> torch.Tensor:
    pixels, sizes = hf_inputs(data, LONGEST_EDGE, PATCH * MERGE)
    with torch.no_grad():
        out = hf.model.get_image_features(pixel_values=pixels, image_sizes=sizes)
    return out.pooler_output[0]


@pytest.mark.parametrize(
    ("form", "size", "mode", "seed"),
    [("single", *IMAGES[0]), ("single", *IMAGES[1]), ("single", *IMAGES[2]), ("split", *IMAGES[1])],
)
def test_image_embeddings_equal_hf(hf, form, size, mode, seed, request):
    ember = request.getfixturevalue(form)
    data = image_bytes(size, mode, seed)
    ours = ember.encode_multimodal(data)
    unit = PATCH * MERGE
    height, width = fit_longest_edge(*size, LONGEST_EDGE, unit)
    assert ours.shape == (height // unit, width // unit, 64)
    assert (ours.flatten(0, 1) - hf_features(hf, data)).abs().max() < 1e-4


def test_pixels_equal_hf(single):
    for size, mode, seed in IMAGES:
        data = image_bytes(size, mode, seed)
        theirs, _ = hf_inputs(data, LONGEST_EDGE, PATCH * MERGE)
        assert (single.preprocess(data) - theirs[0]).abs().max() < 1e-5


def logits_with_image(hf, ember, data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's logits over [prefix, the processor's image tokens, suffix], and Ember's over the
    same tokens from its own span."""
    span = ember.image_span(ember.encode_multimodal(data))
    prefix, suffix = [1, 3, 20], [4, 21, 22]
    ids = [*prefix, *span.tokens, *suffix]
    pixels, sizes = hf_inputs(data, LONGEST_EDGE, PATCH * MERGE)
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor([ids]), pixel_values=pixels, image_sizes=sizes).logits[0]
    cache = ember.make_cache()
    cache.init(max_sequences=1, capacity=128, max_batch=128)
    starts = tuple(len(prefix) + offset for offset in span.pieces)
    batch = Batch(tokens=tuple(ids), positions=tuple(range(len(ids))), sequences=(0,) * len(ids),
                  outputs=tuple(range(len(ids))), multimodal=starts)  # fmt: skip
    cache.start_forward(batch)
    with torch.inference_mode():
        ours = ember.logits(ember.hidden_with_images(batch, cache, list(span.pieces.values())))
    return ours, theirs


@pytest.mark.parametrize("form", ["single", "split"])
@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES[:2])
def test_logits_of_a_prompt_with_an_image_equal_hf(hf, form, size, mode, seed, request):
    ours, theirs = logits_with_image(
        hf, request.getfixturevalue(form), image_bytes(size, mode, seed)
    )
    assert (ours - theirs).abs().max() < 1e-4


def test_a_checkpoint_without_lm_head_ties_it(tmp_path):
    """transformers 5 reads tie_word_embeddings at the top level, older ones in text_config:
    the converter goes by the checkpoint (no lm_head saved: the head is the embeddings)."""
    hf = build_mistral3(tmp_path / "hf", tie_word_embeddings=True)
    convert_directory(tmp_path / "hf", tmp_path / "m.gguf")
    with GGUFFile.open(tmp_path / "m.gguf") as f:
        assert "output.weight" not in f.tensors
    ember = load_model(GGUFFile.open(tmp_path / "m.gguf"))
    ours, theirs = logits_with_image(hf, ember, image_bytes((50, 30), "RGB", 1))
    assert (ours - theirs).abs().max() < 1e-4


def test_an_earlier_feature_layer_keeps_the_layers_before_it(tmp_path):
    hf = build_mistral3(tmp_path / "hf", feature_layer=-2)  # the first of 2 layers' output
    convert_directory(tmp_path / "hf", tmp_path / "m.gguf")
    with GGUFFile.open(tmp_path / "m.gguf") as f:
        assert f.metadata["mistral3.vision.block_count"] == 1
    ember = load_model(GGUFFile.open(tmp_path / "m.gguf"))
    data = image_bytes((97, 203), "RGBA", 2)
    assert (ember.encode_multimodal(data).flatten(0, 1) - hf_features(hf, data)).abs().max() < 1e-4


def test_the_span_has_rows_of_image_tokens_with_breaks(single):
    encoded = single.encode_multimodal(image_bytes((50, 30), "RGB", 1))  # 2 rows of 4
    span = single.image_span(encoded)
    row = [IMG] * 4
    assert span.tokens == [*row, IMG_BREAK, *row, IMG_END]
    assert list(span.pieces) == [0, 5]
    assert all(torch.equal(span.pieces[5 * r], encoded[r]) for r in range(2))  # type: ignore[arg-type]


def test_the_longest_span_is_the_largest_image_s(single, split):
    """The load reservation's bound, without running the tower: an image fitted to
    longest_edge, as the worst-case square is, fills it; a smaller one stays below."""
    for ember in (single, split):
        spans = [len(ember.image_span(ember.encode_multimodal(image_bytes(size, "RGB", 1))).tokens)
                 for size in [(2048, 2048), (2048, 900), (50, 30)]]  # fmt: skip
        assert spans[0] == ember.longest_image_span and max(spans) == spans[0]


def test_the_files_follow_ollama_and_llama_cpp(split, root):
    with GGUFFile.open(root / "model.gguf") as f:
        meta = f.metadata
        assert meta["general.architecture"] == "mistral3"
        assert meta["mistral3.vision.block_count"] == 2 and meta["mistral3.spatial_merge_size"] == 2
        names = {"v.patch_conv.weight", "v.encoder_norm.weight", "v.blk.0.attn_norm.weight",
                 "mm.patch_merger.merging_layer.weight", "mm.linear_1.bias"}  # fmt: skip
        assert names <= set(f.tensors)
    with GGUFFile.open(root / "mmproj.gguf") as f:
        meta = f.metadata
        assert meta["general.architecture"] == "clip"
        assert meta["clip.projector_type"] == "pixtral" and meta["clip.use_silu"] is True
        assert meta["clip.vision.spatial_merge_size"] == 2
        names = {"v.patch_embd.weight", "v.pre_ln.weight", "v.blk.1.ln2.weight",
                 "mm.input_norm.weight", "mm.patch_merger.weight", "mm.1.weight", "mm.2.bias",
                 "v.token_embd.img_break"}  # fmt: skip
        assert names <= set(f.tensors)
    with GGUFFile.open(root / "text.gguf") as f:
        assert f.metadata["general.architecture"] == "llama"  # as llama.cpp converts it
        assert not any(name.startswith(("v.", "mm.")) for name in f.tensors)
        assert not any(key.startswith("llama.vision.") for key in f.metadata)


def test_a_text_gguf_alone_is_a_text_model(split, root):
    assert not isinstance(load_model(GGUFFile.open(root / "text.gguf")), Mistral3Vision)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vision_feature_layer": [-2, -1]}, "single layer"),
        ({"vision_feature_layer": -5}, "out of range"),
        ({"projector_hidden_act": "relu"}, "gelu"),
    ],
)
def test_unsupported_configs_are_refused(hf, root, change, message, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(root / "hf", folder)
    config = json.loads((folder / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match=message):
        convert_directory(folder, tmp_path / "m.gguf")
