"""The model management endpoints (model_routes.py) on an app holding only that router: through
httpx in-process for status codes and streams, and through the real `ollama` client against a
real uvicorn server for the flows a user runs (create from an uploaded GGUF, list, show, copy,
delete, pull from the catalogue and from a loopback registry, push)."""

import concurrent.futures
import gc
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ember.server.model_routes import router
from ember.server.model_show import model_info
from ember.store import Store, get_model
from ember.store.errors import BlobBusyError
from ember.store.names import Digest

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))
from registry_server import RegistryServer
from server_fakes import served_in_thread

SYSTEM = "You are a tiny test model."


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="tiny models are built with HF transformers")
    import tinymodels

    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    tinymodels.write_tiny_gguf("llama", path, ggml_type="Q8_0")
    return path


def make_app(store: Store) -> FastAPI:
    app = FastAPI()
    app.include_router(router)
    app.state.store = store
    return app


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "models")


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(make_app(store)) as test_client:
        yield test_client


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def upload(client: TestClient, path: Path) -> str:
    data = path.read_bytes()
    digest = sha(data)
    assert client.head(f"/api/blobs/{digest}").status_code == 404
    assert client.post(f"/api/blobs/{digest}", content=data).status_code == 201
    assert client.head(f"/api/blobs/{digest}").status_code == 200
    return digest


def lines(resp: httpx.Response) -> list[dict[str, Any]]:
    assert resp.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in resp.text.splitlines()]


def create_tiny(client: TestClient, path: Path, name: str = "tiny") -> list[dict[str, Any]]:
    digest = upload(client, path)
    body = {"model": name, "files": {"tiny.gguf": digest}, "system": SYSTEM}
    resp = client.post("/api/create", json=body)
    assert resp.status_code == 200, resp.text
    return lines(resp)


# ---------------------------------------------------------------- create, list, show


def test_create_from_an_uploaded_blob_streams_progress(client: TestClient, tiny_gguf: Path) -> None:
    progress = create_tiny(client, tiny_gguf)
    statuses = [p["status"] for p in progress]
    assert statuses[0] == "parsing GGUF"
    assert statuses[-2:] == ["writing manifest", "success"]
    assert f"using existing layer {sha(tiny_gguf.read_bytes())}" in statuses
    models = client.get("/api/tags").json()["models"]
    assert [m["name"] for m in models] == ["tiny:latest"]
    assert models[0]["details"]["family"] == "llama"
    assert models[0]["details"]["quantization_level"] == "Q8_0"
    assert models[0]["size"] > tiny_gguf.stat().st_size
    # as Ollama's list: the capabilities and the GGUF's lengths, as /api/show has them
    shown = client.post("/api/show", json={"model": "tiny"}).json()
    assert models[0]["capabilities"] == shown["capabilities"] == ["completion"]
    info = shown["model_info"]
    assert models[0]["details"]["context_length"] == info["llama.context_length"]
    assert models[0]["details"]["embedding_length"] == info["llama.embedding_length"]


def test_create_without_stream_answers_one_object(client: TestClient, tiny_gguf: Path) -> None:
    digest = upload(client, tiny_gguf)
    body = {"model": "tiny", "files": {"tiny.gguf": digest}, "stream": False}
    resp = client.post("/api/create", json=body)
    assert resp.status_code == 200 and resp.json() == {"status": "success"}


def test_create_from_a_stored_model_with_values(client: TestClient, tiny_gguf: Path) -> None:
    create_tiny(client, tiny_gguf)
    body = {
        "model": "me/derived:v1",
        "from": "tiny",
        "system": "Answer in French.",
        "parameters": {"temperature": 0.2, "stop": ["<|im_end|>"]},
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "salut"}],
        "license": "MIT",
        "stream": False,
    }
    assert client.post("/api/create", json=body).json() == {"status": "success"}
    shown = client.post("/api/show", json={"model": "me/derived:v1"}).json()
    assert shown["system"] == "Answer in French."
    assert shown["license"] == "MIT"
    assert shown["messages"] == body["messages"]
    assert "temperature                    0.2" in shown["parameters"]
    assert 'stop                           "<|im_end|>"' in shown["parameters"]
    assert shown["details"]["parent_model"] == "tiny:latest"
    assert "FROM " in shown["modelfile"] and "SYSTEM Answer in French." in shown["modelfile"]


def test_create_keeps_whole_messages_and_show_merges_a_sessions_values(
    client: TestClient, tiny_gguf: Path, store: Store
) -> None:
    create_tiny(client, tiny_gguf)
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "assistant", "content": "a", "thinking": "hm", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    body = {"model": "ex", "from": "tiny", "messages": messages, "requires": "0.14.0"}
    assert client.post("/api/create", json=body | {"stream": False}).status_code == 200
    # stored whole, as Ollama's setMessages: a chat's template sees the call and its thinking
    assert list(get_model(store, "ex").messages) == messages
    shown = client.post("/api/show", json={"model": "ex"}).json()
    assert shown["messages"] == [  # show gives role and content only, as Ollama's
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "sunny"},
    ]
    assert shown["requires"] == "0.14.0"
    # a REPL's /set system and /set parameter join the Modelfile shown, not `parameters`
    session = {"model": "ex", "system": "Be brief.", "options": {"seed": 3, "stop": ["x"]}}
    shown = client.post("/api/show", json=session).json()
    assert "SYSTEM Be brief." in shown["modelfile"]
    assert "PARAMETER seed 3" in shown["modelfile"] and "PARAMETER stop x" in shown["modelfile"]
    assert "seed" not in shown.get("parameters", "")


def test_show_reads_the_gguf_metadata(client: TestClient, tiny_gguf: Path) -> None:
    create_tiny(client, tiny_gguf)
    shown = client.post("/api/show", json={"name": "tiny"}).json()  # the legacy key
    info = shown["model_info"]
    assert info["general.architecture"] == "llama"
    assert info["general.parameter_count"] > 0
    assert "llama.block_count" in info and "tokenizer.ggml.tokens" in info
    assert "tokenizer.chat_template" not in info and "general.name" not in info
    assert shown["capabilities"] == ["completion"]
    assert shown["system"] == SYSTEM
    assert shown["details"]["format"] == "gguf"
    assert {"name", "type", "shape"} <= set(shown["tensors"][0])  # verbose or not, as Ollama


def test_model_info_nulls_long_arrays_unless_verbose() -> None:
    meta = {"general.name": "x", "a.eps": 9.999999747378752e-06, "t": list(range(2000))}
    assert model_info(meta, verbose=False) == {"a.eps": 1e-05, "t": None}
    assert model_info(meta, verbose=True)["t"] == list(range(2000))


def test_show_capabilities_follow_the_template(client: TestClient, tiny_gguf: Path) -> None:
    create_tiny(client, tiny_gguf)
    template = (
        "{% if tools %}TOOLS {{ tools | tojson }}{% endif %}"
        "{% for m in messages %}{% if m.thinking %}<think>{{ m.thinking }}</think>{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    body = {"model": "smart", "from": "tiny", "template": template, "stream": False}
    assert client.post("/api/create", json=body).status_code == 200
    shown = client.post("/api/show", json={"model": "smart"}).json()
    assert shown["capabilities"] == ["completion", "tools", "thinking"]
    assert shown["template"] == template
    # a Go template that reads .Suffix fills gaps (Ollama's insert); one with tools shows them
    template = (
        "{{ if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>"
        "{{ else }}{{ if .Tools }}TOOLS {{ .Tools }}{{ end }}"
        "{{ range .Messages }}{{ .Content }}{{ end }}{{ end }}"
    )
    body = {"model": "gaps", "from": "tiny", "template": template, "stream": False}
    assert client.post("/api/create", json=body).status_code == 200
    shown = client.post("/api/show", json={"model": "gaps"}).json()
    assert shown["capabilities"] == ["completion", "tools", "insert"]


# ---------------------------------------------------------------- copy and delete


def test_copy_then_delete(client: TestClient, tiny_gguf: Path, store: Store) -> None:
    create_tiny(client, tiny_gguf)
    resp = client.post("/api/copy", json={"source": "tiny", "destination": "copy:1"})
    assert resp.status_code == 200
    assert sorted(m["name"] for m in client.get("/api/tags").json()["models"]) == [
        "copy:1",
        "tiny:latest",
    ]
    assert client.request("DELETE", "/api/delete", json={"model": "tiny"}).status_code == 200
    assert [m["name"] for m in client.get("/api/tags").json()["models"]] == ["copy:1"]
    assert store.has_blob(sha(tiny_gguf.read_bytes()))  # still used by the copy
    assert client.request("DELETE", "/api/delete", json={"model": "copy:1"}).status_code == 200
    assert not store.has_blob(sha(tiny_gguf.read_bytes()))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "/api/show", {"model": "nope"}, 404, "model 'nope:latest' not found"),
        ("DELETE", "/api/delete", {"model": "nope"}, 404, "model 'nope' not found"),
        ("POST", "/api/copy", {"source": "nope", "destination": "b"}, 404,
         'model "nope" not found'),
        ("POST", "/api/copy", {"source": "a", "destination": "b/c/d/e"}, 400, "is invalid"),
        ("POST", "/api/show", {"model": "bad name!"}, 400, "invalid model name"),
        ("POST", "/api/show", {}, 400, "model is required"),
        ("POST", "/api/create", {"model": "x"}, 400, "neither 'from' or 'files'"),
        ("POST", "/api/create", {"model": "x", "from": "nope"}, 404, "not found"),
        (  # as Ollama's: a Go TEMPLATE that does not parse is refused at create
            "POST",
            "/api/create",
            {"model": "x", "from": "nope", "template": "{{ if .Prompt }}x"},
            400,
            "template error: the Go template does not parse: unexpected EOF",
        ),
        (  # and one that calls a function Go does not define (routes_create_test.go's)
            "POST",
            "/api/create",
            {"model": "x", "from": "nope", "template": "{{ .Prompt }} {{ foo .Prompt }}"},
            400,
            'template error: the Go template does not parse: function "foo" not defined',
        ),
        ("POST", "/api/create", {"model": "x", "files": {"a": "sha256:12"}}, 400, "digest"),
        ("POST", "/api/create", {"model": "x", "files": {"../a": "sha256:" + "0" * 64}}, 400, ""),
        ("POST", "/api/pull", {"model": ":bad"}, 400, "invalid model name"),
        ("POST", "/api/push", {"model": "nope"}, 404, "model 'nope:latest' not found"),
    ],
)
def test_errors_are_json_with_ollama_status(
    client: TestClient, method: str, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    resp = client.request(method, path, json=body)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]


def test_create_from_a_blob_that_is_not_gguf(client: TestClient) -> None:
    data = b"not a model at all"
    assert client.post(f"/api/blobs/{sha(data)}", content=data).status_code == 201
    body = {"model": "x", "files": {"x.gguf": sha(data)}}
    resp = client.post("/api/create", json=body)
    assert resp.status_code == 400
    assert "not in GGUF format" in resp.json()["error"]


def test_blob_with_the_wrong_digest_is_refused(client: TestClient, store: Store) -> None:
    wrong = sha(b"other")
    resp = client.post(f"/api/blobs/{wrong}", content=b"these bytes")
    assert resp.status_code == 400 and "digest mismatch" in resp.json()["error"]
    assert client.head(f"/api/blobs/{wrong}").status_code == 404
    assert not store.has_blob(sha(b"these bytes"))
    assert [p.name for p in store.tmp_dir.iterdir() if p.name != "store.lock"] == []


def test_blob_with_a_bad_digest_is_400(client: TestClient) -> None:
    assert client.post("/api/blobs/sha256:XYZ", content=b"x").status_code == 400
    assert client.head("/api/blobs/md5:abc").status_code == 400


def test_blob_over_the_quota_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "small", max_blob_bytes=1000)
    with TestClient(make_app(store)) as small:
        data = b"x" * 5000
        resp = small.post(f"/api/blobs/{sha(data)}", content=iter([data[:2500], data[2500:]]))
        assert resp.status_code == 413, resp.text
        assert not store.has_blob(sha(data))


def test_known_blob_upload_is_a_no_op(client: TestClient) -> None:
    data = b"some blob"
    assert client.post(f"/api/blobs/{sha(data)}", content=data).status_code == 201
    assert client.post(f"/api/blobs/{sha(data)}", content=b"").status_code == 200


# ---------------------------------------------------------------- pull and push


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path / "registry") as running:
        yield running


def test_push_then_pull_through_the_registry(
    client: TestClient,
    tiny_gguf: Path,
    registry: RegistryServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    create_tiny(client, tiny_gguf)
    host = registry.url.removeprefix("http://")
    monkeypatch.setenv("EMBER_REGISTRIES", host)  # a host named in a model name: allowed
    assert client.post("/api/copy", json={"source": "tiny", "destination": f"{host}/me/tiny"})
    body = {"model": f"{host}/me/tiny", "insecure": True}  # http: allowed when asked
    progress = lines(client.post("/api/push", json=body))
    assert progress[0] == {"status": "retrieving manifest"}
    assert progress[-1] == {"status": "success"}
    digest = sha(tiny_gguf.read_bytes())
    pushes = [p for p in progress if p.get("digest") == digest]
    assert pushes[-1]["status"] == f"pushing {digest[7:19]}"
    assert pushes[-1]["completed"] == pushes[-1]["total"] == tiny_gguf.stat().st_size
    # a name without a host pulls from EMBER_REGISTRY
    monkeypatch.setenv("EMBER_REGISTRY", registry.url)
    other = Store(tmp_path / "other")
    with TestClient(make_app(other)) as fresh:
        progress = lines(fresh.post("/api/pull", json={"model": "me/tiny"}))
        assert progress[0] == {"status": "pulling manifest"}
        assert [p["status"] for p in progress[-3:]] == [
            "verifying sha256 digest",
            "writing manifest",
            "success",
        ]
        assert any(p.get("digest") == digest and p["completed"] == p["total"] for p in progress)
        shown = fresh.post("/api/show", json={"model": "me/tiny"}).json()
        assert shown["system"] == SYSTEM


def test_pull_of_a_missing_model_ends_with_an_error_line(
    client: TestClient, registry: RegistryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_REGISTRY", registry.url)
    progress = lines(client.post("/api/pull", json={"model": "nothere"}))
    assert progress[0] == {"status": "pulling manifest"}
    assert "not found" in progress[-1]["error"]
    resp = client.post("/api/pull", json={"model": "nothere", "stream": False})
    # a 404, not Ollama's 500: a missing model is no server error (found by schemathesis)
    assert resp.status_code == 404 and "not found" in resp.json()["error"]


# ---------------------------------------------------------------- the real ollama client


@pytest.fixture
def served(store: Store) -> Iterator[ollama.Client]:
    with served_in_thread(make_app(store)) as url:
        yield ollama.Client(host=url)


@pytest.mark.e2e
def test_ollama_client_create_list_show_copy_delete(served: ollama.Client, tiny_gguf: Path) -> None:
    digest = served.create_blob(tiny_gguf)
    progress = list(
        served.create(
            "tiny", files={"tiny.gguf": digest}, system=SYSTEM, parameters={"top_k": 5}, stream=True
        )
    )
    assert progress[-1].status == "success"
    assert [m.model for m in served.list().models] == ["tiny:latest"]
    shown = served.show("tiny")
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
    assert shown.capabilities == ["completion"]
    assert shown.details is not None and shown.details.family == "llama"
    assert shown.parameters is not None and "top_k" in shown.parameters
    assert served.copy("tiny", "tiny:copy").status == "success"
    assert sorted(m.model or "" for m in served.list().models) == ["tiny:copy", "tiny:latest"]
    assert served.delete("tiny").status == "success"
    assert [m.model for m in served.list().models] == ["tiny:copy"]
    with pytest.raises(ollama.ResponseError) as err:
        served.show("tiny")
    assert err.value.status_code == 404 and "not found" in err.value.error


@pytest.mark.e2e
def test_ollama_client_push_and_pull(
    served: ollama.Client,
    tiny_gguf: Path,
    registry: RegistryServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    digest = served.create_blob(tiny_gguf)
    served.create("tiny", files={"tiny.gguf": digest})
    host = registry.url.removeprefix("http://")
    monkeypatch.setenv("EMBER_REGISTRIES", host)
    served.copy("tiny", f"{host}/me/tiny:v1")
    pushed = list(served.push(f"{host}/me/tiny:v1", insecure=True, stream=True))
    assert pushed[-1].status == "success"
    assert any(p.digest == digest and p.completed == p.total for p in pushed)
    served.delete(f"{host}/me/tiny:v1")
    served.delete("tiny")
    assert served.list().models == []
    monkeypatch.setenv("EMBER_REGISTRY", registry.url)
    pulled = list(served.pull("me/tiny:v1", stream=True))
    assert pulled[0].status == "pulling manifest" and pulled[-1].status == "success"
    assert [m.model for m in served.list().models] == ["me/tiny:v1"]
    assert served.pull("me/tiny:v1").status == "success"  # again: nothing to fetch


@pytest.mark.e2e
def test_ollama_client_creates_a_q4_k_m_model(served: ollama.Client, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import tinymodels

    source = tmp_path / "f16.gguf"  # rows of 256 and 512: whole K-quant blocks
    tinymodels.write_tiny_gguf(
        "llama", source, ggml_type="F16", hidden_size=256, intermediate_size=512, head_dim=64
    )
    served.create("tiny:f16", files={"tiny.gguf": served.create_blob(source)})
    progress = list(served.create("tiny:q4", from_="tiny:f16", quantize="q4_K_M", stream=True))
    statuses = [p.status for p in progress]
    assert "quantizing F16 model to Q4_K_M" in statuses
    assert statuses[-2:] == ["writing manifest", "success"]
    quantizing = [p for p in progress if p.status == "quantizing F16 model to Q4_K_M"]
    assert quantizing[-1].completed == quantizing[-1].total == source.stat().st_size
    shown = served.show("tiny:q4")
    assert shown.details is not None and shown.details.quantization_level == "Q4_K_M"
    assert shown.modelinfo is not None and shown.modelinfo["general.file_type"] == 15
    f16 = served.show("tiny:f16").details
    assert f16 is not None and f16.quantization_level == "F16"
    # Ollama's float types: a conversion; the model's own type: nothing done
    progress = list(served.create("tiny:bf16", from_="tiny:f16", quantize="bf16", stream=True))
    assert "quantizing F16 model to BF16" in [p.status for p in progress]
    shown = served.show("tiny:bf16")
    assert shown.details is not None and shown.details.quantization_level == "BF16"
    assert shown.modelinfo is not None and shown.modelinfo["general.file_type"] == 32
    progress = list(served.create("tiny:same", from_="tiny:f16", quantize="F16", stream=True))
    assert not any(p.status.startswith("quantizing") for p in progress if p.status)
    same = served.show("tiny:same").details
    assert same is not None and same.quantization_level == "F16"


@pytest.mark.e2e
@pytest.mark.model
def test_ollama_client_pulls_a_catalogue_model_offline(
    served: ollama.Client, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_REGISTRY", "http://127.0.0.1:9")  # a registry is never asked
    progress = list(served.pull("smollm2:135m", stream=True))
    statuses = [p.status for p in progress]
    digest = "sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    copies = [p for p in progress if p.digest == digest]
    assert copies[0].status == "pulling b179c9523d0e" and copies[0].completed == 0
    assert copies[-1].completed == copies[-1].total == smollm2_path.stat().st_size
    listed = served.list().models
    assert [m.model for m in listed] == ["smollm2:135m"]
    shown = served.show("smollm2:135m")
    assert shown.details is not None and shown.details.quantization_level == "Q4_1"
    assert shown.template and "<|im_start|>" in shown.template
    assert shown.modelinfo is not None
    assert shown.modelinfo["tokenizer.ggml.tokens"] is None  # 49,152 tokens: not shown
    assert shown.modelinfo["llama.block_count"] == 30


@pytest.mark.e2e
@pytest.mark.model
def test_create_from_a_bundled_model_not_yet_pulled_pulls_it_first(
    served: ollama.Client, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as Ollama pulls a missing FROM model; a bundled one comes from its packages, offline
    monkeypatch.setenv("EMBER_REGISTRY", "http://127.0.0.1:9")  # a registry is never asked
    progress = list(served.create("brief", from_="smollm2:135m", system="Be brief.", stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling model" and "pulling manifest" in statuses
    assert statuses.count("success") == 1 and statuses[-1] == "success"
    assert sorted(m.model for m in served.list().models) == ["brief:latest", "smollm2:135m"]
    assert "SYSTEM Be brief." in (served.show("brief").modelfile or "")
    # a name that is neither stored nor bundled stays not found
    with pytest.raises(ollama.ResponseError, match="not found"):
        served.create("other", from_="nosuch:1b")


def slow_body(data: bytes, piece: int = 4096, pause: float = 0.02) -> Iterator[bytes]:
    for start in range(0, len(data), piece):
        time.sleep(pause)
        yield data[start : start + piece]


@pytest.fixture
def published(
    store: Store, tiny_gguf: Path, registry: RegistryServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str]]:
    """A served store (its URL) whose registry holds me/tiny, which the store lacks; its layer's
    digest. The registry sends that layer slowly."""
    with served_in_thread(make_app(store)) as url:
        client = ollama.Client(host=url)
        client.create("tiny", files={"tiny.gguf": client.create_blob(tiny_gguf)})
        host = registry.url.removeprefix("http://")
        monkeypatch.setenv("EMBER_REGISTRIES", host)
        client.copy("tiny", f"{host}/me/tiny")
        assert client.push(f"{host}/me/tiny", insecure=True).status == "success"
        client.delete(f"{host}/me/tiny")
        client.delete("tiny")
        monkeypatch.setenv("EMBER_REGISTRY", registry.url)
        data = tiny_gguf.read_bytes()
        registry.bodies[sha(data)] = lambda: slow_body(data)
        yield url, sha(data)


def layer_free(store: Store, digest: str, size: int, within: float) -> bool:
    """Whether a download of the layer could start (no pull holds its partial file) within
    `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            writer = store.blob_writer(expected=Digest.parse(digest), size=size, resume=True)
        except BlobBusyError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        else:
            writer.abort()  # the partial file stays
            return True


@pytest.mark.e2e
def test_a_pull_cut_by_its_client_lets_its_layer_go_and_resumes(
    store: Store, published: tuple[str, str], registry: RegistryServer, tiny_gguf: Path
) -> None:
    url, digest = published
    gc.disable()  # what the pull held must be let go when its client goes, not when collected
    try:
        with httpx.stream("POST", f"{url}/api/pull", json={"model": "me/tiny"}) as resp:
            for line in resp.iter_lines():  # a user's Ctrl-C once some of the layer came
                progress = json.loads(line)
                if progress.get("digest") == digest and progress["completed"] > 0:
                    break
        assert layer_free(store, digest, tiny_gguf.stat().st_size, within=5)
    finally:
        gc.enable()
    del registry.bodies[digest]
    pulled = list(ollama.Client(host=url).pull("me/tiny", stream=True))
    assert pulled[-1].status == "success"
    ranges = [r for m, p, r in registry.requests if m == "GET" and p.endswith(digest)]
    assert ranges[0] is None and ranges[-1] is not None  # the second went on where it was cut
    assert store.blob_path(digest).read_bytes() == tiny_gguf.read_bytes()


@pytest.mark.e2e
def test_two_pulls_of_one_model_at_once_both_succeed(
    store: Store, published: tuple[str, str], registry: RegistryServer
) -> None:
    url, digest = published

    def pull() -> list[Any]:
        return list(ollama.Client(host=url).pull("me/tiny", stream=True))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(pull)
        time.sleep(0.2)  # the first has the layer under way
        second = pool.submit(pull)
        answers = [first.result(timeout=60), second.result(timeout=60)]
    assert [a[-1].status for a in answers] == ["success", "success"]
    followed = [p for p in answers[1] if p.digest == digest]
    assert followed[-1].completed == followed[-1].total
    assert registry.blob_count(digest) == 1  # the second followed the first's download
    assert [m.model for m in ollama.Client(host=url).list().models] == ["me/tiny:latest"]


def test_a_client_leaving_mid_upload_leaves_no_file_and_no_error(store: Store) -> None:
    """The ASGI app is driven by hand: a part of the body, then the client's disconnect."""
    import asyncio

    app = make_app(store)
    messages = [
        {"type": "http.request", "body": b"x" * 100, "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": f"/api/blobs/sha256:{'a' * 64}",
        "headers": [(b"content-length", b"1000")], "query_string": b"", "http_version": "1.1",
        "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": "",
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))  # no exception escapes the app
    assert sent[0]["status"] == 499
    assert [p.name for p in store.tmp_dir.iterdir() if p.name != "store.lock"] == []
