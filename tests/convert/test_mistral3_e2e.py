"""A tiny Mistral 3 made by `ember create` from its HF directory (one GGUF, Ollama's form) answers
the real `ollama` client's and the real `openai` client's chat with an image through `ember serve`,
with the tokens the engine gives for the same prompt and image when run directly (greedy); the
same model from a text GGUF + mmproj GGUF (a Modelfile with two FROM lines) answers the same."""

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
from hf_mistral3 import build_mistral3  # noqa: E402
from serve_process import Server  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402
from test_llava_e2e import NUM_PREDICT, QUESTION, greedy_answer  # noqa: E402

from ember.convert import convert_directory  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODELFILES = {"tiny-mistral3": "FROM ./tiny-mistral3\n",
              "tiny-mistral3-split": "FROM ./text.gguf\nFROM ./mmproj.gguf\n"}  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistral3-e2e")
    build_mistral3(root / "tiny-mistral3")
    convert_directory(root / "tiny-mistral3", root / "model.gguf")
    convert_directory(root / "tiny-mistral3", root / "text.gguf", mmproj=root / "mmproj.gguf")
    (root / "serve").mkdir()
    server = Server(root / "serve")
    env = cli_env(root, server.url.removeprefix("http://"))
    creates = []
    for name, text in MODELFILES.items():  # both at once: the CLI's start-up is most of it
        (root / f"{name}.Modelfile").write_text(text)
        command = [*EMBER, "create", name, "-f", str(root / f"{name}.Modelfile")]
        creates.append(subprocess.Popen(command, text=True, stderr=subprocess.PIPE, env=env))
    for create in creates:
        _, stderr = create.communicate(timeout=300)
        assert create.returncode == 0, stderr
    yield root, server
    server.stop()


def test_show_reports_vision(setup):
    _, server = setup
    single = httpx.post(f"{server.url}/api/show", json={"model": "tiny-mistral3"}).json()
    assert "vision" in single["capabilities"]
    assert single["model_info"]["general.architecture"] == "mistral3"
    split = httpx.post(f"{server.url}/api/show", json={"model": "tiny-mistral3-split"}).json()
    assert "vision" in split["capabilities"]
    assert split["projector_info"]["clip.projector_type"] == "pixtral"


def ollama_chat(server: Server, model: str, image: bytes):
    import ollama

    return ollama.Client(server.url).chat(
        model=model,
        messages=[{"role": "user", "content": QUESTION, "images": [image]}],
        options={"num_predict": NUM_PREDICT, "temperature": 0},
    )


PNG = image_bytes((50, 30), "RGB", 1)  # 2 rows of 4 image tokens


@pytest.fixture(scope="module")
def direct(setup):
    """The engine's greedy answer to QUESTION with PNG, in-process, and its prompt's length."""
    root, _ = setup
    return greedy_answer(root / "model.gguf", None, PNG)


def test_the_ollama_client_chat_with_an_image_equals_the_engine(setup, direct):
    _, server = setup
    answer, prompt_tokens = direct
    reply = ollama_chat(server, "tiny-mistral3", PNG)
    assert reply.done
    assert reply.prompt_eval_count == prompt_tokens  # 10 of them the image's span
    assert answer and reply.message.content == answer
    split = ollama_chat(server, "tiny-mistral3-split", PNG)
    assert split.message.content == answer and split.prompt_eval_count == prompt_tokens
    tall = ollama_chat(server, "tiny-mistral3", image_bytes((97, 203), "RGBA", 2))  # 4 rows of 2
    assert tall.done and tall.prompt_eval_count == prompt_tokens + 2


def test_the_openai_client_chat_with_a_data_uri(setup, direct):
    import openai

    _, server = setup
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    parts = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    answer = client.chat.completions.create(
        model="tiny-mistral3", messages=[{"role": "user", "content": parts}],
        max_tokens=NUM_PREDICT, temperature=0,
    )  # fmt: skip
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content == direct[0]
