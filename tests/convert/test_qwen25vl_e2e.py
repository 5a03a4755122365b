"""A tiny Qwen 2.5 VL made by `ember create` from its HF directory (and from a text GGUF + mmproj)
answers the real `ollama` and `openai` clients' chats with an image through one `ember serve`,
with the greedy tokens of the engine run directly, which are HF's own greedy tokens (so the
runner's position shift after the image holds through decoding too)."""

import base64
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from cli_support import EMBER, cli_env  # noqa: E402
from hf_qwen25vl import build_qwen25vl  # noqa: E402
from serve_process import Server  # noqa: E402
from test_gemma3_vision import image_bytes  # noqa: E402
from test_qwen25vl import hf_pixels, image_types  # noqa: E402

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
QUESTION, NUM_PREDICT = "What is in this picture?", 6
PNG = image_bytes((90, 50), "RGB", 5)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25vl-e2e")
    hf = build_qwen25vl(root / "tiny-qwen25vl")
    convert_directory(root / "tiny-qwen25vl", root / "text.gguf", mmproj=root / "mmproj.gguf")
    (root / "one.Modelfile").write_text("FROM ./tiny-qwen25vl\n")
    (root / "pair.Modelfile").write_text("FROM ./text.gguf\nFROM ./mmproj.gguf\n")
    (root / "serve").mkdir()
    server = Server(root / "serve")
    env = cli_env(root, server.url.removeprefix("http://"))
    for name in ("one", "pair"):
        result = subprocess.run(
            [*EMBER, "create", f"tiny-qwen25vl-{name}", "-f", str(root / f"{name}.Modelfile")],
            text=True, capture_output=True, timeout=300, env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    yield root, server, hf
    server.stop()


def direct(root: Path) -> tuple[list[int], list[int], Tokenizer]:
    """The prompt's ids and the engine's greedy tokens, in-process, for the chat's prompt."""
    gguf = GGUFFile.open(root / "text.gguf")
    model = load_model(gguf, GGUFFile.open(root / "mmproj.gguf"))
    tok = Tokenizer.from_metadata(gguf.metadata)
    message = {"role": "user", "content": f"[img-0]{QUESTION}"}
    prompt = render_chat(gguf.metadata["tokenizer.chat_template"], [message])
    inputs = prompt_inputs(prompt, {0: PNG}, tok, model)
    request = Request(inputs.tokens, Options(temperature=0, num_predict=NUM_PREDICT),
                      same_batch=inputs.same_batch, multimodal=inputs.multimodal,
                      image_hashes=inputs.image_hashes)  # fmt: skip
    engine = Engine(model, tok, num_parallel=1, num_ctx=256, num_batch=16)  # the prompt: 2 batches
    try:
        seq = engine.submit(request)
        while not isinstance(seq.events.get(timeout=300), Done):
            pass
    finally:
        engine.close()
    return inputs.tokens, list(seq.generated), tok


@pytest.fixture(scope="module")
def answer(setup):
    root, _, hf = setup
    ids, tokens, tok = direct(root)
    pixels, grid = hf_pixels(PNG)
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.tensor([ids]), pixel_values=pixels, image_grid_thw=grid,
            mm_token_type_ids=image_types(hf, ids), max_new_tokens=NUM_PREDICT, do_sample=False,
        )  # fmt: skip
    theirs = out[0, len(ids) :].tolist()
    eos = set(tok.eos_ids)
    theirs = theirs[: next((i for i, t in enumerate(theirs) if t in eos), len(theirs))]
    assert tokens == theirs  # the engine's greedy decoding is HF's
    return tok.decode(tokens), len(ids)


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
    import ollama

    _, server, _ = setup
    reply = ollama.Client(server.url).chat(
        model=model,
        messages=[{"role": "user", "content": QUESTION, "images": [PNG]}],
        options={"num_predict": NUM_PREDICT, "temperature": 0},
    )
    text, prompt_tokens = answer
    assert reply.done and reply.prompt_eval_count == prompt_tokens
    assert reply.message.content == text


def test_the_openai_client_chat_with_an_image_equals_the_engine(setup, answer):
    import openai

    _, server, _ = setup
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    url = f"data:image/png;base64,{base64.b64encode(PNG).decode()}"
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    reply = client.chat.completions.create(
        model="tiny-qwen25vl-one", messages=[{"role": "user", "content": parts}],
        max_tokens=NUM_PREDICT, temperature=0,
    )  # fmt: skip
    assert reply.choices[0].message.content == answer[0]
