"""A tiny Gemma 3 vision model made by `ember create` from an HF directory answers a chat with an
image through a real `ember serve` (/api/show says `vision`); a corrupt image is a 400, and a
text-only model refuses images with a 400."""

import base64
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from cli_support import EMBER, cli_env  # noqa: E402
from hf_dirs import save_hf_dir  # noqa: E402
from hf_vision import build_gemma3_vision  # noqa: E402
from serve_process import Server  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402

from ember.convert import convert_directory  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision-e2e")
    build_gemma3_vision(root / "tiny-gemma3-vision")
    save_hf_dir("qwen2", root / "tiny-qwen")
    convert_directory(
        root / "tiny-gemma3-vision", root / "text.gguf", mmproj=root / "mmproj.gguf"
    )  # llama.cpp's convention: a Modelfile names both files
    (root / "tiny-split.Modelfile").write_text("FROM ./text.gguf\nFROM ./mmproj.gguf\n")
    (root / "serve").mkdir()
    server = Server(root / "serve")
    env = cli_env(root, server.url.removeprefix("http://"))
    for name, folder in (("tiny-vision", "tiny-gemma3-vision"), ("tiny-text", "tiny-qwen")):
        (root / f"{name}.Modelfile").write_text(f"FROM ./{folder}\n")
    for name in ("tiny-vision", "tiny-text", "tiny-split"):
        result = subprocess.run(
            [*EMBER, "create", name, "-f", str(root / f"{name}.Modelfile")],
            text=True, capture_output=True, timeout=300, env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    yield server
    server.stop()


def chat(server: Server, model: str, images: list[str]) -> httpx.Response:
    message = {"role": "user", "content": "What is in this picture?", "images": images}
    body = {"model": model, "stream": False, "messages": [message],
            "options": {"num_predict": 4, "temperature": 0}}  # fmt: skip
    return httpx.post(f"{server.url}/api/chat", json=body, timeout=300)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_show_reports_vision(server):
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny-vision"}).json()
    assert "vision" in shown["capabilities"]
    text = httpx.post(f"{server.url}/api/show", json={"model": "tiny-text"}).json()
    assert "vision" not in text["capabilities"]


def test_chat_with_an_image_answers(server):
    reply = chat(server, "tiny-vision", [b64(image_bytes((50, 30), "RGB", 1))])
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["done"] is True
    # the prompt holds the image's span: <start_of_image>, 4 placeholders, <end_of_image>
    assert body["prompt_eval_count"] >= 6
    other = chat(server, "tiny-vision", [b64(image_bytes((20, 64), "RGBA", 2))]).json()
    assert other["done"] is True


def test_a_corrupt_image_is_a_400(server):
    reply = chat(server, "tiny-vision", [b64(b"\x89PNG\r\n\x1a\n not really")])
    assert reply.status_code == 400, reply.text


def test_a_text_model_refuses_images(server):
    reply = chat(server, "tiny-text", [b64(image_bytes((50, 30), "RGB", 1))])
    assert reply.status_code == 400
    assert "vision" in reply.json()["error"]


def test_text_gguf_plus_mmproj_answers_the_same(server):
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny-split"}).json()
    assert "vision" in shown["capabilities"]
    assert shown["projector_info"]["clip.projector_type"] == "gemma3"
    image = [b64(image_bytes((50, 30), "RGB", 1))]
    single, split = chat(server, "tiny-vision", image), chat(server, "tiny-split", image)
    assert split.status_code == 200, split.text
    assert split.json()["message"] == single.json()["message"]
    assert split.json()["eval_count"] == single.json()["eval_count"]


def test_the_ollama_and_openai_clients_chat_with_an_image(server):
    import ollama
    import openai

    png = image_bytes((64, 48), "P", 4)
    reply = ollama.Client(server.url).chat(
        model="tiny-vision",
        messages=[{"role": "user", "content": "What is this?", "images": [png]}],
        options={"num_predict": 4, "temperature": 0},
    )
    assert reply.done
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(png)}"}},
    ]
    answer = client.chat.completions.create(
        model="tiny-vision", messages=[{"role": "user", "content": parts}], max_tokens=4,
        temperature=0,
    )  # fmt: skip
    assert answer.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny-text", messages=[{"role": "user", "content": parts}], max_tokens=4
        )
