"""A tiny Llava made by `ember create` from its HF directory (a model layer and a projector
layer) answers the real `ollama` client's chat with an image through `ember serve`, with the
tokens the engine gives for the same prompt and image when run directly (greedy)."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from answers import streamed_text  # noqa: E402
from cli_support import EMBER, cli_env  # noqa: E402
from hf_llava import build_llava  # noqa: E402
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
    root = tmp_path_factory.mktemp("llava-e2e")
    build_llava(root / "tiny-llava")
    (root / "serve").mkdir()
    server = Server(root / "serve")
    (root / "Modelfile").write_text("FROM ./tiny-llava\n")
    result = subprocess.run(
        [*EMBER, "create", "tiny-llava", "-f", str(root / "Modelfile")], text=True,
        capture_output=True, timeout=300, env=cli_env(root, server.url.removeprefix("http://")),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    yield root, server
    server.stop()


def direct_answer(root: Path, image: bytes) -> tuple[str, int]:
    """The engine's greedy answer, in-process, to the prompt the chat template makes."""
    convert_directory(root / "tiny-llava", root / "text.gguf", mmproj=root / "mmproj.gguf")
    return greedy_answer(root / "text.gguf", root / "mmproj.gguf", image)


def greedy_answer(path: Path, projector: Path | None, image: bytes) -> tuple[str, int]:
    """The engine's greedy answer to QUESTION with `image`, and the prompt's token count."""
    gguf = GGUFFile.open(path)
    model = load_model(gguf, None if projector is None else GGUFFile.open(projector))
    tok = Tokenizer.from_metadata(gguf.metadata)
    message = {"role": "user", "content": f"[img-0]{QUESTION}"}
    bos = gguf.metadata["tokenizer.ggml.tokens"][gguf.metadata["tokenizer.ggml.bos_token_id"]]
    prompt = render_chat(gguf.metadata["tokenizer.chat_template"], [message], bos_token=bos)
    inputs = prompt_inputs(prompt, {0: image}, tok, model)
    request = Request(inputs.tokens, Options(temperature=0, num_predict=NUM_PREDICT),
                      same_batch=inputs.same_batch, multimodal=inputs.multimodal,
                      image_hashes=inputs.image_hashes)  # fmt: skip
    engine = Engine(model, tok, num_parallel=1, num_ctx=256, num_batch=64)
    seq = engine.submit(request)
    while not isinstance(seq.events.get(timeout=300), Done):
        pass
    return streamed_text(tok, list(seq.generated)), len(inputs.tokens)


def test_show_reports_vision_and_the_mlp_projector(setup):
    _, server = setup
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny-llava"}).json()
    assert "vision" in shown["capabilities"]
    assert shown["projector_info"]["clip.projector_type"] == "mlp"


def test_the_ollama_client_chat_with_an_image_equals_the_engine(setup):
    import ollama

    root, server = setup
    png = image_bytes((50, 30), "RGB", 1)
    reply = ollama.Client(server.url).chat(
        model="tiny-llava",
        messages=[{"role": "user", "content": QUESTION, "images": [png]}],
        options={"num_predict": NUM_PREDICT, "temperature": 0},
    )
    assert reply.done
    answer, prompt_tokens = direct_answer(root, png)
    assert reply.prompt_eval_count == prompt_tokens  # 16 image tokens among them
    assert answer and reply.message.content == answer
    other = ollama.Client(server.url).chat(
        model="tiny-llava",
        messages=[
            {"role": "user", "content": QUESTION, "images": [image_bytes((20, 64), "RGBA", 2)]}
        ],
        options={"num_predict": NUM_PREDICT, "temperature": 0},
    )
    assert other.done
