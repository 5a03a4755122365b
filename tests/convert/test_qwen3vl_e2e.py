"""A tiny Qwen3-VL, and a Qwen3.5 with its tower, made by `ember create` from its HF directory
answer the real `ollama` and `openai` clients' chats with an image through one `ember serve`,
with the greedy tokens of the engine run directly, which are HF's own greedy tokens (deepstack in
the prompt's batches, the position shift after the image through the decode steps)."""

import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from grid_e2e import checked_answer, ollama_chat, openai_chat, serve_created  # noqa: E402
from hf_qwen3vl import build_qwen3vl  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402
from test_qwen3vl_vision import hf_pixels  # noqa: E402

from ember.convert import convert_directory  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def hf_inputs(data: bytes) -> dict:
    pixels, grid = hf_pixels(data)
    return {"pixel_values": pixels, "image_grid_thw": grid}
PNG = image_bytes((150, 100), "RGB", 5)


ARCHS = {"Qwen3VL": "qwen3vl", "Qwen3_5": "qwen35"}


@pytest.fixture(scope="module", params=list(ARCHS))
def setup(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("qwen3vl-e2e")
    hf = build_qwen3vl(root / "tiny-qwen3vl", family=request.param, layers=4)
    server = serve_created(root, {"tiny-qwen3vl": "FROM ./tiny-qwen3vl\n"})
    yield root, server, hf
    server.stop()


@pytest.fixture(scope="module")
def answer(setup):
    root, _, hf = setup
    convert_directory(root / "tiny-qwen3vl", root / "one.gguf")
    return checked_answer(hf, [root / "one.gguf"], PNG, hf_inputs)


def test_show_reports_vision(setup):
    _, server, _ = setup
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny-qwen3vl"}).json()
    assert "vision" in shown["capabilities"]
    assert shown["model_info"]["general.architecture"] in ARCHS.values()


def test_the_ollama_client_chat_with_an_image_equals_the_engine(setup, answer):
    reply = ollama_chat(setup[1].url, "tiny-qwen3vl", PNG)
    text, prompt_tokens = answer
    assert reply.done and reply.prompt_eval_count == prompt_tokens
    assert reply.message.content == text


def test_the_openai_client_chat_with_an_image_equals_the_engine(setup, answer):
    assert openai_chat(setup[1].url, "tiny-qwen3vl", PNG) == answer[0]
