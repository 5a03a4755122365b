"""A tiny Qwen 2.5 VL made by `ember create` from its HF directory (and from a text GGUF + mmproj)
answers the real `ollama` and `openai` clients' chats with an image through one `ember serve`,
with the greedy tokens of the engine run directly, which are HF's own greedy tokens (so the
runner's position shift after the image holds through decoding too)."""

import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from grid_e2e import checked_answer, ollama_chat, openai_chat, serve_created  # noqa: E402
from hf_qwen25vl import build_qwen25vl  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402
from test_qwen25vl import hf_pixels  # noqa: E402

from ember.convert import convert_directory  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def hf_inputs(data: bytes) -> dict:
    pixels, grid = hf_pixels(data)
    return {"pixel_values": pixels, "image_grid_thw": grid}
PNG = image_bytes((90, 50), "RGB", 5)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25vl-e2e")
    hf = build_qwen25vl(root / "tiny-qwen25vl")
    convert_directory(root / "tiny-qwen25vl", root / "text.gguf", mmproj=root / "mmproj.gguf")
    server = serve_created(root, {"tiny-qwen25vl-one": "FROM ./tiny-qwen25vl\n",
                                  "tiny-qwen25vl-pair": "FROM ./text.gguf\nFROM ./mmproj.gguf\n"})
    yield root, server, hf
    server.stop()


@pytest.fixture(scope="module")
def answer(setup):
    root, _, hf = setup
    return checked_answer(hf, [root / "text.gguf", root / "mmproj.gguf"], PNG, hf_inputs)


def test_show_reports_vision_for_both_conventions(setup):
    _, server, _ = setup
    one = httpx.post(f"{server.url}/api/show", json={"model": "tiny-qwen25vl-one"}).json()
    assert "vision" in one["capabilities"]
    assert one["model_info"]["general.architecture"] == "qwen25vl"
    pair = httpx.post(f"{server.url}/api/show", json={"model": "tiny-qwen25vl-pair"}).json()
    assert "vision" in pair["capabilities"]
    assert pair["projector_info"]["clip.projector_type"] == "qwen2.5vl_merger"


@pytest.mark.parametrize("model", ["tiny-qwen25vl-one", "tiny-qwen25vl-pair"])
def test_the_ollama_client_chat_with_an_image_equals_the_engine(setup, answer, model):
    reply = ollama_chat(setup[1].url, model, PNG)
    text, prompt_tokens = answer
    assert reply.done and reply.prompt_eval_count == prompt_tokens
    assert reply.message.content == text


def test_the_openai_client_chat_with_an_image_equals_the_engine(setup, answer):
    assert openai_chat(setup[1].url, "tiny-qwen25vl-one", PNG) == answer[0]
