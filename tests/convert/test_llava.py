"""Llava converted from a tiny HF LlavaForConditionalGeneration (text GGUF + mmproj GGUF), with a
llama or a qwen2 text model: pixels equal CLIPImageProcessor's, image embeddings equal HF's
get_image_features and the logits of a prompt with an image equal HF's (1e-4, float32)."""

import pytest
import torch

T = pytest.importorskip("transformers")

from hf_llava import IMAGE_SIZE, PATCHES, build_llava  # noqa: E402
from PIL import Image  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402

from ember.batch import Batch  # noqa: E402
from ember.convert import ConvertError, convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.model.archs.llava_vision import LlavaQwen2Vision, LlavaVision  # noqa: E402

IMAGES = [((50, 30), "RGB", 1), ((20, 64), "RGBA", 2), ((97, 203), "P", 3)]


def hf_pixels(data: bytes, size: int) -> torch.Tensor:
    import io

    processor = T.CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    return processor(Image.open(io.BytesIO(data)), return_tensors="pt")["pixel_values"][0]


def convert(root, feature_layer: int, text: str = "llama"):
    hf = build_llava(root / "hf", feature_layer=feature_layer, text=text)
    convert_directory(root / "hf", root / "text.gguf", mmproj=root / "mmproj.gguf")
    ember = load_model(GGUFFile.open(root / "text.gguf"), GGUFFile.open(root / "mmproj.gguf"))
    assert isinstance(ember, LlavaQwen2Vision if text == "qwen2" else LlavaVision)
    return hf, ember


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("llava")


@pytest.fixture(scope="module")
def models(root):
    return convert(root, -2)


@pytest.fixture(scope="module")
def qwen2_models(root):
    return convert(root / "qwen2", -2, text="qwen2")


@pytest.fixture(params=["llama", "qwen2"])
def text_models(request):
    """The converted pair (HF, Ember) with either text model."""
    return request.getfixturevalue("models" if request.param == "llama" else "qwen2_models")


def hf_features(hf, data: bytes) -> torch.Tensor:
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=hf_pixels(data, IMAGE_SIZE)[None])
    theirs = getattr(theirs, "pooler_output", theirs)
    theirs = theirs[0] if isinstance(theirs, (tuple, list)) else theirs
    return theirs.reshape(PATCHES, -1)


@pytest.mark.parametrize(("size", "mode", "seed"), [*IMAGES, ((640, 480), "L", 4)])
def test_preprocessing_equals_clip_image_processor(models, size, mode, seed):
    data = image_bytes(size, mode, seed)
    assert (models[1].preprocess(data) - hf_pixels(data, IMAGE_SIZE)).abs().max() < 1e-5


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES)
def test_image_embeddings_equal_hf(text_models, size, mode, seed):
    hf, ember = text_models
    data = image_bytes(size, mode, seed)
    ours = ember.encode_multimodal(data)
    assert ours.shape == (PATCHES, 64)
    assert (ours - hf_features(hf, data)).abs().max() < 1e-4


def logits_with_image(hf, ember, data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    prefix, suffix = [1, 10], [11, 12, 13]
    ids = [*prefix, *[hf.config.image_token_index] * PATCHES, *suffix]
    with torch.no_grad():
        theirs = hf(
            input_ids=torch.tensor([ids]), pixel_values=hf_pixels(data, IMAGE_SIZE)[None]
        ).logits[0]
    cache = ember.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    batch = Batch(tokens=tuple(ids), positions=tuple(range(len(ids))), sequences=(0,) * len(ids),
                  outputs=tuple(range(len(ids))), multimodal=(len(prefix),))  # fmt: skip
    cache.start_forward(batch)
    with torch.inference_mode():
        ours = ember.logits(ember.hidden_with_images(batch, cache, [ember.encode_multimodal(data)]))
    return ours, theirs


@pytest.mark.parametrize(("size", "mode", "seed"), IMAGES[:2])
def test_logits_of_a_prompt_with_an_image_equal_hf(text_models, size, mode, seed):
    ours, theirs = logits_with_image(*text_models, image_bytes(size, mode, seed))
    assert (ours - theirs).abs().max() < 1e-4


def test_the_files_follow_llama_cpp(models, root):
    with GGUFFile.open(root / "mmproj.gguf") as f:
        meta = f.metadata
        assert meta["general.architecture"] == "clip"
        assert meta["clip.projector_type"] == "mlp" and meta["clip.use_gelu"] is False
        assert meta["clip.vision.block_count"] == 1  # vision_feature_layer -2 of 2 layers
        assert {"v.class_embd", "v.pre_ln.weight", "mm.0.weight", "mm.2.bias"} <= set(f.tensors)
        assert not any(name.startswith("v.blk.1.") for name in f.tensors)
    with GGUFFile.open(root / "text.gguf") as f:
        assert f.metadata["general.architecture"] == "llama"
        assert not any(name.startswith(("v.", "mm.")) for name in f.tensors)


def test_a_qwen2_text_model_is_written_as_qwen2(qwen2_models, root):
    hf = qwen2_models[0]
    with GGUFFile.open(root / "qwen2" / "mmproj.gguf") as f:
        assert f.metadata["clip.projector_type"] == "mlp"
        assert f.metadata["clip.vision.projection_dim"] == 64
    with GGUFFile.open(root / "qwen2" / "text.gguf") as f:
        assert f.metadata["general.architecture"] == "qwen2"
        assert not any(name.startswith(("v.", "mm.")) for name in f.tensors)
        attention = hf.model.language_model.layers[0].self_attn
        for name, theirs in [("attn_q.weight", attention.q_proj.weight),
                             ("attn_k.weight", attention.k_proj.weight),
                             ("attn_k.bias", attention.k_proj.bias)]:  # fmt: skip
            ours = torch.from_numpy(f.raw(f"blk.0.{name}").copy()).view(torch.float32)
            assert torch.equal(ours.reshape(theirs.shape), theirs)  # rows as HF has them
        assert attention.k_proj.bias.abs().min() > 0


def test_other_llava_text_models_are_refused(models, root, tmp_path):
    import json
    import shutil

    shutil.copytree(root / "hf", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["text_config"]["model_type"] = "gemma"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match="llava text model 'gemma' is not supported"):
        convert_directory(tmp_path / "hf", tmp_path / "t.gguf", mmproj=tmp_path / "m.gguf")


def test_the_last_layer_as_features(tmp_path):
    hf, ember = convert(tmp_path, -1)
    data = image_bytes((50, 30), "RGB", 1)
    assert (ember.encode_multimodal(data) - hf_features(hf, data)).abs().max() < 1e-4


def test_llava_needs_an_mmproj_file(models, root, tmp_path):
    with pytest.raises(ConvertError, match="mmproj"):
        convert_directory(root / "hf", tmp_path / "x.gguf")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vision_feature_layer": [-2, -1]}, "single layer"),
        ({"vision_feature_layer": -5}, "out of range"),
        ({"vision_feature_select_strategy": "full"}, "default"),
        ({"projector_hidden_act": "relu"}, "gelu"),
    ],
)
def test_unsupported_llava_configs_are_refused(models, root, change, message, tmp_path):
    import json
    import shutil

    source = root / "hf"
    folder = tmp_path / "hf"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match=message):
        convert_directory(folder, tmp_path / "t.gguf", mmproj=tmp_path / "m.gguf")
