"""A tiny Llama 3.2 Vision made by `ember create` from its HF directory (one GGUF, Ollama's
layout) answers the real `ollama` and `openai` clients' chats with an image through one
`ember serve`, with the tokens the engine gives for the same prompt and image in-process."""

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
from hf_mllama import build_mllama  # noqa: E402
from serve_process import Server  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402

from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.options import Options  # noqa: E402
from ember.runner.engine import Engine  # noqa: E402
from ember.runner.multimodal import prompt_inputs  # noqa: E402
from ember.runner.sequence import Done, Request  # noqa: E402
from ember.template import render_chat  # noqa: E402
from ember.tokenizer import Tokenizer  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
QUESTION, NUM_PREDICT = "What is in this picture?", 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("mllama-e2e")
    build_mllama(root / "tiny-mllama")
    (root / "serve").mkdir()
    server = Server(root / "serve")
    (root / "Modelfile").write_text("FROM ./tiny-mllama\n")
    result = subprocess.run(
        [*EMBER, "create", "tiny-mllama", "-f", str(root / "Modelfile")], text=True,
        capture_output=True, timeout=300, env=cli_env(root, server.url.removeprefix("http://")),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    yield root, server
    server.stop()


def direct_answer(root: Path, image: bytes) -> tuple[str, int]:
    """The engine's greedy answer, in-process, to the prompt the chat template makes."""
    convert_directory(root / "tiny-mllama", root / "model.gguf")
    gguf = GGUFFile.open(root / "model.gguf")
    model, tok = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    message = {"role": "user", "content": f"[img-0]{QUESTION}"}
    prompt = render_chat(gguf.metadata["tokenizer.chat_template"], [message])
    inputs = prompt_inputs(prompt, {0: image}, tok, model)
    request = Request(inputs.tokens, Options(temperature=0, num_predict=NUM_PREDICT),
                      same_batch=inputs.same_batch, multimodal=inputs.multimodal,
                      image_hashes=inputs.image_hashes)  # fmt: skip
    engine = Engine(model, tok, num_parallel=1, num_ctx=256, num_batch=64)
    try:
        seq = engine.submit(request)
        while not isinstance(seq.events.get(timeout=300), Done):
            pass
    finally:
        engine.close()
    return tok.decode(list(seq.generated)), len(inputs.tokens)


def test_show_reports_vision(setup):
    _, server = setup
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny-mllama"}).json()
    assert "vision" in shown["capabilities"]
    assert shown["model_info"]["general.architecture"] == "mllama"


def test_the_ollama_and_openai_clients_chat_with_an_image(setup):
    import ollama
    import openai

    root, server = setup
    png = image_bytes((50, 30), "RGB", 1)
    answer, prompt_tokens = direct_answer(root, png)
    reply = ollama.Client(server.url).chat(
        model="tiny-mllama",
        messages=[{"role": "user", "content": QUESTION, "images": [png]}],
        options={"num_predict": NUM_PREDICT, "temperature": 0},
    )
    assert reply.done
    assert reply.prompt_eval_count == prompt_tokens  # the image is one token among them
    assert answer and reply.message.content == answer
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    url = f"data:image/png;base64,{base64.b64encode(png).decode()}"
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    completion = client.chat.completions.create(
        model="tiny-mllama", messages=[{"role": "user", "content": parts}],
        max_tokens=NUM_PREDICT, temperature=0,
    )  # fmt: skip
    assert completion.choices[0].message.content == answer


def test_two_images_in_a_request_are_a_400(setup):
    """One image per request, as Ollama's mllama."""
    import ollama

    _, server = setup
    images = [image_bytes((50, 30), "RGB", 1), image_bytes((20, 64), "RGBA", 2)]
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(server.url).chat(
            model="tiny-mllama",
            messages=[{"role": "user", "content": QUESTION, "images": images}],
            options={"num_predict": 2},
        )
    assert err.value.status_code == 400 and "image" in err.value.error
