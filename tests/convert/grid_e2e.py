"""The end-to-end checks shared by the vision tests (Qwen 2.5 VL, Qwen3-VL, Gemma 4): the
engine's greedy answer to a chat of one image and a question, run in-process and checked equal
to HF's `generate`, and the real clients' chats through `ember serve`, checked equal to it."""

import base64
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch
from answers import streamed_text
from cli_support import EMBER, cli_env  # (tests/cli and tests/server: on the caller's path)
from serve_process import Server

from ember.gguf import GGUFFile
from ember.model import load_model
from ember.options import Options
from ember.runner.engine import Engine
from ember.runner.multimodal import prompt_inputs
from ember.runner.sequence import Done, Request
from ember.template import render_chat
from ember.tokenizer import Tokenizer

QUESTION, NUM_PREDICT = "What is in this picture?", 6
Pixels = Callable[[bytes], dict[str, torch.Tensor]]  # an image as HF's model takes it


def serve_created(root: Path, models: dict[str, str]) -> Server:
    """An `ember serve` under root/serve holding each model made by `ember create` from its
    Modelfile text (name -> text; FROM paths relative to root)."""
    (root / "serve").mkdir()
    server = Server(root / "serve")
    env = cli_env(root, server.url.removeprefix("http://"))
    for name, text in models.items():
        (root / f"{name}.Modelfile").write_text(text)
        result = subprocess.run(
            [*EMBER, "create", name, "-f", str(root / f"{name}.Modelfile")],
            text=True, capture_output=True, timeout=300, env=env,
        )  # fmt: skip
        if result.returncode:
            server.stop()
            raise AssertionError(result.stderr)
    return server


def engine_answer(
    files: list[Path], image: bytes, num_ctx: int = 256
) -> tuple[list[int], list[int], Tokenizer]:
    """The prompt's ids and the engine's greedy tokens, in-process, for the chat's prompt."""
    gguf = GGUFFile.open(files[0])
    model = load_model(gguf, *(GGUFFile.open(f) for f in files[1:]))
    tok = Tokenizer.from_metadata(gguf.metadata)
    message = {"role": "user", "content": f"[img-0]{QUESTION}"}
    prompt = render_chat(gguf.metadata["tokenizer.chat_template"], [message])
    inputs = prompt_inputs(prompt, {0: image}, tok, model)
    request = Request(inputs.tokens, Options(temperature=0, num_predict=NUM_PREDICT),
                      same_batch=inputs.same_batch, multimodal=inputs.multimodal,
                      image_hashes=inputs.image_hashes)  # fmt: skip
    engine = Engine(model, tok, num_parallel=1, num_ctx=num_ctx, num_batch=16)  # 2 batches or more
    try:
        seq = engine.submit(request)
        while not isinstance(seq.events.get(timeout=300), Done):
            pass
    finally:
        engine.close()
    return inputs.tokens, list(seq.generated), tok


def checked_answer(
    hf, files: list[Path], image: bytes, pixels: Pixels, num_ctx: int = 256
) -> tuple[str, int]:
    """The engine's answer text and prompt length, once its tokens are checked to be HF's."""
    ids, tokens, tok = engine_answer(files, image, num_ctx)
    their_ids = hf_ids(hf, ids)
    types = (torch.tensor([their_ids]) == hf.config.image_token_id).int()
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.tensor([their_ids]), mm_token_type_ids=types,
            max_new_tokens=NUM_PREDICT, do_sample=False, **pixels(image),
        )  # fmt: skip
    theirs = out[0, len(ids) :].tolist()
    eos = set(tok.eos_ids)
    theirs = theirs[: next((i for i, t in enumerate(theirs) if t in eos), len(theirs))]
    assert tokens and tokens == theirs  # the engine's greedy decoding is HF's
    return streamed_text(tok, tokens), len(ids)


def hf_ids(hf, ids: list[int]) -> list[int]:
    """Ember's prompt as HF's: an image's placeholders (the token after its start token, up
    to its end token) as HF's image token (Gemma 4's are Ember's pad tokens)."""
    c = hf.config
    start = getattr(c, "boi_token_id", None) or c.vision_start_token_id
    end = getattr(c, "eoi_token_id", None) or c.vision_end_token_id
    out, inside = [], False
    for t in ids:
        inside = (inside or t == start) and t != end
        out.append(c.image_token_id if inside and t != start else t)
    return out


def ollama_chat(url: str, model: str, image: bytes):
    import ollama

    return ollama.Client(url).chat(
        model=model,
        messages=[{"role": "user", "content": QUESTION, "images": [image]}],
        options={"num_predict": NUM_PREDICT, "temperature": 0},
    )


def openai_chat(url: str, model: str, image: bytes) -> str | None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    data = f"data:image/png;base64,{base64.b64encode(image).decode()}"
    parts = [{"type": "image_url", "image_url": {"url": data}}, {"type": "text", "text": QUESTION}]
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": parts}],
        max_tokens=NUM_PREDICT, temperature=0,
    )  # fmt: skip
    return reply.choices[0].message.content
