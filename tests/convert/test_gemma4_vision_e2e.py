"""A tiny Gemma 4 with its vision tower, made by `ember create` from its HF directory, answers
the real `ollama` and `openai` clients' chats with an image through one `ember serve`, with the
greedy tokens of the engine run directly, which are HF's own greedy tokens (the larger models'
attention both ways over the image on the sliding layers)."""

import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from grid_e2e import checked_answer, ollama_chat, openai_chat, serve_created  # noqa: E402
from hf_gemma4v import build_gemma4v  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402
from test_gemma4_vision import hf_pixels  # noqa: E402

from ember.convert import convert_directory  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PNG = image_bytes((60, 40), "RGB", 5)


def hf_inputs(data: bytes) -> dict:
    pixels, positions = hf_pixels(data)
    return {"pixel_values": pixels, "image_position_ids": positions}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4v-e2e")
    hf = build_gemma4v(root / "tiny-gemma4v", both_ways=True)
    server = serve_created(root, {"tiny-gemma4v": "FROM ./tiny-gemma4v\n"})
    yield root, server, hf
    server.stop()


@pytest.fixture(scope="module")
def answer(setup):
    root, _, hf = setup
    convert_directory(root / "tiny-gemma4v", root / "one.gguf")
    return checked_answer(hf, [root / "one.gguf"], PNG, hf_inputs, num_ctx=512)


def test_show_reports_vision(setup):
    _, server, _ = setup
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny-gemma4v"}).json()
    assert "vision" in shown["capabilities"]
    assert shown["model_info"]["general.architecture"] == "gemma4"


def test_the_ollama_client_chat_with_an_image_equals_the_engine(setup, answer):
    reply = ollama_chat(setup[1].url, "tiny-gemma4v", PNG)
    text, prompt_tokens = answer
    assert reply.done and reply.prompt_eval_count == prompt_tokens
    assert reply.message.content == text


def test_the_openai_client_chat_with_an_image_equals_the_engine(setup, answer):
    assert openai_chat(setup[1].url, "tiny-gemma4v", PNG) == answer[0]
