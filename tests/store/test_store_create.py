"""Creating models in the store from a tiny GGUF blob or from a stored model, as /api/create."""

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ember.errors import ModelNotFoundError
from ember.gguf import GGUFFile
from ember.human import human_number
from ember.store import (
    CreateError,
    CreateRequest,
    InvalidDigestError,
    Store,
    create_model,
    get_model,
    kquants,
    list_models,
    parse_modelfile,
    render_modelfile,
)
from ember.store import manifest as mt
from ember.store.modelfile import model_commands

TEMPLATE = "{{ .Prompt }}"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="tiny models are built with HF transformers")
    import tinymodels

    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    tinymodels.write_tiny_gguf("llama", path, ggml_type="Q8_0")
    return path


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "models")


def upload(store: Store, path: Path) -> str:
    with open(path, "rb") as f:
        return str(store.write_blob(f).digest)


def create(store: Store, name: str, **fields: object) -> list[dict[str, object]]:
    return list(create_model(store, name, CreateRequest(**fields)))  # type: ignore[arg-type]


def test_create_from_a_gguf_blob(store: Store, tiny_gguf: Path) -> None:
    digest = upload(store, tiny_gguf)
    progress = create(store, "tiny:q8", files={"tiny.gguf": digest}, system="Be brief.")
    statuses = [p["status"] for p in progress]
    system_digest = "sha256:" + hashlib.sha256(b"Be brief.").hexdigest()
    assert statuses == [
        "parsing GGUF",
        f"using existing layer {digest}",
        f"creating new layer {system_digest}",
        "writing manifest",
        "success",
    ]
    model = get_model(store, "tiny:q8")
    assert model.model_path == store.blob_path(digest)
    assert model.system == "Be brief."
    with GGUFFile.open(tiny_gguf) as gguf:
        num_params = sum(math.prod(t.shape) for t in gguf.tensors.values())
    assert model.config == {
        "model_format": "gguf",
        "model_family": "llama",
        "model_families": ["llama"],
        "model_type": human_number(num_params),
        "file_type": "Q8_0",
        "architecture": "amd64",
        "os": "linux",
    }
    assert model.details.parent_model == "tiny.gguf"
    [entry] = list_models(store)
    assert entry.name.display_shortest() == "tiny:q8"
    assert entry.size == tiny_gguf.stat().st_size + model.manifest.config.size + 9


def test_create_from_a_model_inherits_and_overrides(store: Store, tiny_gguf: Path) -> None:
    digest = upload(store, tiny_gguf)
    create(
        store,
        "base",
        files={"tiny.gguf": digest},
        template=TEMPLATE,
        system="base system",
        parameters={"temperature": 0.5, "stop": ["<|im_end|>"]},
        license="MIT",
    )
    create(
        store,
        "derived",
        from_="base",
        system="derived system",
        parameters={"top_k": 5, "temperature": "0.25"},
        messages=[{"role": "user", "content": "hi"}],
        license=["extra"],
    )
    model = get_model(store, "derived")
    assert model.model_path == store.blob_path(digest)
    assert model.template == TEMPLATE and model.system == "derived system"
    assert model.parameters == {"stop": ["<|im_end|>"], "temperature": 0.25, "top_k": 5}
    assert model.license == ("MIT", "extra")
    assert model.messages == ({"role": "user", "content": "hi"},)
    assert model.details.parent_model == "base:latest"
    assert get_model(store, "base").system == "base system"  # the base is untouched


def test_messages_of_any_role_are_read_back_as_stored(store: Store, tiny_gguf: Path) -> None:
    """As Ollama's create: the roles are stored as sent (the template decides what they mean)."""
    messages = [{"role": "developer", "content": "Be terse."}, {"role": "robot", "content": ""}]
    create(store, "roles", files={"tiny.gguf": upload(store, tiny_gguf)}, messages=messages)
    assert get_model(store, "roles").messages == tuple(messages)


def test_messages_keep_their_thinking_tool_calls_and_tool_name(
    store: Store, tiny_gguf: Path
) -> None:
    """As Ollama's create stores api.Message: a model's example of a tool call keeps its call."""
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "thinking": "hmm", "tool_calls": [call]},
        {"role": "tool", "content": "20C", "tool_name": "get_weather"},
    ]
    create(store, "calls", files={"tiny.gguf": upload(store, tiny_gguf)}, messages=messages)
    assert get_model(store, "calls").messages == tuple(messages)
    with pytest.raises(CreateError, match="tool_calls as a list of calls"):
        create(store, "bad", from_="calls", messages=[{"role": "assistant", "tool_calls": "x"}])


def test_rendered_modelfile_parses_back(store: Store, tiny_gguf: Path) -> None:
    digest = upload(store, tiny_gguf)
    create(
        store,
        "m",
        files={"tiny.gguf": digest},
        template="line one\n{{ .Prompt }}",
        system=' padded "quoted" ',
        parameters={"stop": ["a", "b"], "num_ctx": 2048},
        messages=[{"role": "assistant", "content": "two\nlines"}],
    )
    model = get_model(store, "m")
    text = render_modelfile(model)
    assert text.startswith('# Modelfile generated by "ember show"\n')
    assert "# FROM m:latest\n" in text
    assert parse_modelfile(text) == model_commands(model)
    assert f"FROM {store.blob_path(digest)}\n" in text
    assert "PARAMETER stop a\nPARAMETER stop b\n" in text


def test_modelfile_round_trip_creates_the_same_model(store: Store, tiny_gguf: Path) -> None:
    digest = upload(store, tiny_gguf)
    modelfile = parse_modelfile(
        "FROM ./tiny.gguf\nTEMPLATE {{ .Prompt }}\nPARAMETER temperature 0\nPARAMETER stop x\n"
    )
    request = CreateRequest.from_modelfile(modelfile, files={"tiny.gguf": digest})
    list(create_model(store, "from-modelfile", request))
    model = get_model(store, "from-modelfile")
    assert model.parameters == {"stop": ["x"], "temperature": 0.0}
    assert model.template == TEMPLATE


def test_replacing_a_model_prunes_its_unused_layers(store: Store, tiny_gguf: Path) -> None:
    digest = upload(store, tiny_gguf)
    create(store, "m", files={"tiny.gguf": digest}, system="old")
    old_system = store.blob_path("sha256:" + hashlib.sha256(b"old").hexdigest())
    assert old_system.exists()
    create(store, "m", files={"tiny.gguf": digest}, system="new")
    assert not old_system.exists()
    assert get_model(store, "m").system == "new"
    assert store.has_blob(digest)


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({}, CreateError, "neither 'from' or 'files' was specified"),
        ({"files": {"../x.gguf": "DIGEST"}}, CreateError, "file path must be relative"),
        ({"files": {"/abs.gguf": "DIGEST"}}, CreateError, "file path must be relative"),
        ({"files": {"x.gguf": "sha256:../../x"}}, InvalidDigestError, "invalid digest"),
        ({"files": {"x.gguf": "sha256:" + "0" * 64}}, CreateError, "is not in the store"),
        ({"files": {"x.gguf": "NOTGGUF"}}, CreateError, "not in GGUF format"),
        ({"files": {"x.gguf": "DIGEST"}, "adapters": {"a": "b"}}, CreateError, "adapters"),
        ({"files": {"x.gguf": "DIGEST"}, "parameters": {"foo": 1}}, CreateError, "unknown"),
        ({"files": {"x.gguf": "DIGEST"}, "parameters": {"top_k": 1.5}}, CreateError, "type"),
        ({"files": {"x.gguf": "DIGEST"}, "parameters": {"repeat_last_n": -2}}, CreateError,
         "repeat_last_n"),
        ({"files": {"x.gguf": "DIGEST"}, "quantize": "q8_0"}, CreateError, "only supported"),
        ({"files": {"x.gguf": "DIGEST"}, "quantize": "q2_k"}, CreateError, "unsupported"),
        ({"from_": "missing"}, ModelNotFoundError, "not found"),
        ({"files": {"x.gguf": "DIGEST"}, "template": "{% for m in %}"}, CreateError, "parse"),
        ({"files": {"x.gguf": "DIGEST"}, "template": "{{ if .System }}"}, CreateError, "template"),
        # what get_model reads back (16 MiB) is what create takes
        ({"files": {"x.gguf": "DIGEST"}, "system": "A" * (17 << 20)}, CreateError, "16 MiB"),
    ],
)
def test_bad_requests_change_nothing(
    store: Store, tiny_gguf: Path, fields: dict[str, object], error: type, message: str
) -> None:
    digest = upload(store, tiny_gguf)
    create(store, "existing", files={"x.gguf": digest})
    before = store.manifest_path("existing").read_bytes()
    not_gguf = str(store.write_blob(b"PK\x03\x04 not a gguf").digest)
    files = fields.get("files")
    if isinstance(files, dict):
        subst = {"DIGEST": digest, "NOTGGUF": not_gguf}
        fields["files"] = {k: subst.get(v, v) for k, v in files.items()}
    with pytest.raises(error, match=message):
        create(store, "existing", **fields)
    assert store.manifest_path("existing").read_bytes() == before


def test_config_blob_is_go_encoded_json(store: Store, tiny_gguf: Path) -> None:
    digest = upload(store, tiny_gguf)
    create(store, "m", files={"tiny.gguf": digest}, parameters={"stop": ["<|im_end|>"]})
    model = get_model(store, "m")
    params = model.manifest.first(mt.MEDIA_PARAMS)
    assert params is not None
    raw = store.blob_path(params.digest).read_bytes()
    assert raw == b'{"stop":["\\u003c|im_end|\\u003e"]}\n'  # what Ollama's encoder writes
    assert json.loads(raw) == {"stop": ["<|im_end|>"]}


@pytest.mark.parametrize("source_type", ["F16", "BF16"])
def test_quantize_to_q8_0(store: Store, tmp_path: Path, source_type: str) -> None:
    pytest.importorskip("transformers")
    import tinymodels
    from gguf import GGMLQuantizationType, quants

    source = tmp_path / "source.gguf"
    tinymodels.write_tiny_gguf("llama", source, ggml_type=source_type)
    digest = upload(store, source)
    statuses = [p["status"] for p in create(store, "q", files={"f.gguf": digest}, quantize="q8_0")]
    assert f"quantizing {source_type} model to Q8_0" in statuses
    assert "verifying conversion" in statuses
    model = get_model(store, "q")
    assert model.config["file_type"] == "Q8_0" and model.model_path is not None
    assert f"creating new layer sha256:{model.model_path.name[7:]}" in statuses
    with GGUFFile.open(source) as src, GGUFFile.open(model.model_path) as out:
        assert out.metadata == {**src.metadata, "general.file_type": 7}
        assert list(out.tensors) == list(src.tensors)
        for name, info in src.tensors.items():
            raw = src.raw(name)
            if len(info.shape) == 2:
                values = quants.dequantize(raw, GGMLQuantizationType[source_type])
                values = values.reshape(info.shape).astype("float32")
                expected = quants.quantize(values, GGMLQuantizationType.Q8_0).tobytes()
                assert out.tensors[name].ggml_type.name == "Q8_0"
                assert out.raw(name).tobytes() == expected
            else:
                assert out.tensors[name].ggml_type == info.ggml_type
                assert out.raw(name).tobytes() == raw.tobytes()
    assert store.has_blob(digest)  # the source stays until nothing names it


def test_quantized_model_generates(store: Store, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import tinymodels

    from ember import LLM

    source = tmp_path / "f32.gguf"
    tinymodels.write_tiny_gguf("qwen2", source, ggml_type="F32")
    digest = upload(store, source)
    create(store, "q", files={"f.gguf": digest}, quantize="Q8_0")
    path = get_model(store, "q").model_path
    assert path is not None
    options = {"temperature": 0, "num_predict": 8}
    quantized = LLM(str(path)).generate("Hello world", raw=True, options=options)
    reference = LLM(str(source)).generate("Hello world", raw=True, options=options)
    assert quantized.eval_count == 8
    assert quantized.tokens[:2] == reference.tokens[:2]  # Q8_0 is close to F32


# ---------------------------------------------------------------- K-quant mixes


def write_k_quantizable(path: Path, source_type: str, arch: str = "llama") -> None:
    """A tiny model with rows of 256 and 512 values, whole K-quant blocks (the default tiny
    configs have rows of 64, which would all fall back to Q5_0 / Q8_0), and 8 layers."""
    import tinymodels

    tinymodels.write_tiny_gguf(
        arch,
        path,
        ggml_type=source_type,
        hidden_size=256,
        intermediate_size=512,
        head_dim=64,
        num_hidden_layers=8,
    )


def k_mix(name: str, file_type: str) -> str:
    """The type llama.cpp gives each weight matrix of the 8-layer tiny llama."""
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if name == "token_embd.weight":  # tied: it is the output matrix too
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        if file_type == "Q4_K_M" and layer in (0, 3, 6, 7):  # llama.cpp's use_more_bits(i, 8)
            return "Q6_K"
        first = 4 if "attn_v" in name else 1  # Q4_K_S: attn_v of layers 0-3, ffn_down of 0
        if file_type == "Q4_K_S" and layer < first:
            return "Q5_K"
    return "Q4_K"


ENCODERS = {
    "Q4_K": kquants.quantize_q4_k,
    "Q5_K": kquants.quantize_q5_k,
    "Q6_K": kquants.quantize_q6_k,
}
RMSE_BOUNDS = {"Q4_K": 0.075, "Q5_K": 0.038, "Q6_K": 0.0186}  # of N(0, 1): test_kquants.py


@pytest.mark.parametrize(
    ("source_type", "requested", "file_type", "number"),
    [
        ("F16", "q4_K_M", "Q4_K_M", 15),
        ("F32", "q4_K_M", "Q4_K_M", 15),
        ("BF16", "q4_K", "Q4_K_M", 15),
        ("F16", "Q4_K_S", "Q4_K_S", 14),
    ],
)
def test_quantize_to_a_k_mix(
    store: Store, tmp_path: Path, source_type: str, requested: str, file_type: str, number: int
) -> None:
    pytest.importorskip("transformers")
    from gguf import GGMLQuantizationType, quants

    source = tmp_path / "source.gguf"
    write_k_quantizable(source, source_type)
    digest = upload(store, source)
    progress = create(store, "q", files={"f.gguf": digest}, quantize=requested)
    statuses = [p["status"] for p in progress]
    assert f"quantizing {source_type} model to {file_type}" in statuses
    assert "verifying conversion" in statuses and statuses[-1] == "success"
    model = get_model(store, "q")
    assert model.config["file_type"] == file_type and model.model_path is not None
    with GGUFFile.open(source) as src, GGUFFile.open(model.model_path) as out:
        assert out.metadata == {**src.metadata, "general.file_type": number}
        assert list(out.tensors) == list(src.tensors)
        for name, info in src.tensors.items():
            raw = src.raw(name)
            if len(info.shape) == 1:
                assert out.tensors[name].ggml_type == info.ggml_type
                assert out.raw(name).tobytes() == raw.tobytes()
                continue
            kind = k_mix(name, file_type)
            assert out.tensors[name].ggml_type.name == kind, name
            values = quants.dequantize(raw, GGMLQuantizationType[source_type]).reshape(info.shape)
            values = values.astype("float32")
            assert out.raw(name).tobytes() == ENCODERS[kind](values).tobytes()
            decoded = quants.dequantize(out.raw(name), GGMLQuantizationType[kind])
            error = decoded.reshape(info.shape) - values
            assert np.sqrt(np.mean(error**2)) < RMSE_BOUNDS[kind] * np.sqrt(np.mean(values**2))


@pytest.mark.parametrize(
    ("file_type", "more_bits"),
    [
        # use_more_bits(i, 2) picks layer 1; Q6_K falls back to Q8_0
        ("q4_K_M", {"blk.1.attn_v.weight": "Q8_0", "blk.1.ffn_down.weight": "Q8_0"}),
        # attn_v of layers 0-3 get Q5_K, which falls back to Q5_1
        ("q4_K_S", {"blk.0.attn_v.weight": "Q5_1", "blk.1.attn_v.weight": "Q5_1"}),
    ],
)
def test_short_rows_fall_back_to_32_value_blocks(
    store: Store, tmp_path: Path, file_type: str, more_bits: dict[str, str]
) -> None:
    """The default tiny llama has rows of 64 and 128, no whole K-quant block: Q4_K becomes Q5_0,
    Q5_K Q5_1, and Q6_K (the tied embedding too) Q8_0, quantized by gguf-py."""
    pytest.importorskip("transformers")
    import tinymodels
    from gguf import GGMLQuantizationType, quants

    source = tmp_path / "f32.gguf"
    tinymodels.write_tiny_gguf("llama", source, ggml_type="F32")
    create(store, "q", files={"f.gguf": upload(store, source)}, quantize=file_type)
    path = get_model(store, "q").model_path
    assert path is not None
    with GGUFFile.open(source) as src, GGUFFile.open(path) as out:
        kinds = {n: t.ggml_type.name for n, t in out.tensors.items() if len(t.shape) == 2}
        expected_kinds = {n: "Q5_0" for n in kinds} | more_bits | {"token_embd.weight": "Q8_0"}
        assert kinds == expected_kinds
        for name, kind in kinds.items():
            values = src.raw(name).view(np.float32).reshape(src.tensors[name].shape)
            expected = quants.quantize(values, GGMLQuantizationType[kind]).tobytes()
            assert out.raw(name).tobytes() == expected


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_k_mix_model_generates(store: Store, tmp_path: Path, arch: str) -> None:
    pytest.importorskip("transformers")
    from ember import LLM

    source = tmp_path / "f32.gguf"
    write_k_quantizable(source, "F32", arch=arch)
    digest = upload(store, source)
    create(store, "q", files={"f.gguf": digest}, quantize="q4_K_M")
    path = get_model(store, "q").model_path
    assert path is not None
    with GGUFFile.open(path) as gguf:
        output = gguf.tensors.get("output.weight", gguf.tensors["token_embd.weight"])
        assert output.ggml_type.name == "Q6_K"  # qwen2's own output, the others' tied embedding
        assert gguf.tensors["blk.1.ffn_down.weight"].ggml_type.name == "Q4_K"
    options = {"temperature": 0, "num_predict": 8}
    quantized = LLM(str(path)).generate("Hello world", raw=True, options=options)
    reference = LLM(str(source)).generate("Hello world", raw=True, options=options)
    assert quantized.eval_count == 8
    assert quantized.tokens[0] == reference.tokens[0]
