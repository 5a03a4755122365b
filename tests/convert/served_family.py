"""A tiny HF family created from its folder through `ember create` on a real `ember serve`, and
transformers' own greedy answer to compare the `ollama` client's with (the e2e tests of the
families converted from safetensors)."""

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ollama
import torch
from transformers import PreTrainedModel

TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from answers import streamed_text  # noqa: E402
from cli_support import EMBER, cli_env  # noqa: E402
from hf_families import save_family  # noqa: E402
from serve_process import Server  # noqa: E402

from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.tokenizer import Tokenizer  # noqa: E402


@contextmanager
def served_family(
    root: Path, family: str, name: str
) -> Iterator[tuple[Server, PreTrainedModel, Tokenizer]]:
    """The family saved under root/hf and created as `name`: (server, HF model, its tokenizer)."""
    hf = save_family(family, root / "hf")
    convert_directory(root / "hf", root / "reference.gguf")  # for the tokenizer only
    server = Server(root)
    try:
        (root / "Modelfile").write_text(f"FROM {root / 'hf'}\n")
        result = subprocess.run(
            [*EMBER, "create", name, "-f", str(root / "Modelfile")],
            text=True, capture_output=True, timeout=300,
            env=cli_env(root, server.url.removeprefix("http://")),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        yield server, hf, Tokenizer.from_metadata(GGUFFile.open(root / "reference.gguf").metadata)
    finally:
        server.stop()


def greedy(hf: PreTrainedModel, tokenizer: Tokenizer, prompt: str, count: int) -> str:
    """transformers' greedy continuation of prompt, `count` tokens, as text."""
    ids = tokenizer.encode(prompt)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=count, do_sample=False)
    return streamed_text(tokenizer, out[0, len(ids) :].tolist())


def ask(server: Server, name: str, prompt: str, count: int = 12) -> ollama.GenerateResponse:
    """The `ollama` client's greedy raw completion of prompt."""
    return ollama.Client(server.url).generate(
        model=name, prompt=prompt, raw=True,
        options={"temperature": 0, "num_predict": count, "stop": []},
    )  # fmt: skip


def past_num_ctx(server: Server, name: str, prompt: str) -> bool:
    """Whether a sampled generation of 60 tokens in a context of 24 ends done and past it
    (random weights may end early on an end token, but past 24 either way)."""
    chunks = list(ollama.Client(server.url).generate(
        model=name, prompt=prompt, raw=True, stream=True,
        options={"temperature": 0.8, "seed": 7, "num_ctx": 24, "num_predict": 60},
    ))  # fmt: skip
    last = chunks[-1]
    return bool(last.done) and last.prompt_eval_count + last.eval_count > 30
