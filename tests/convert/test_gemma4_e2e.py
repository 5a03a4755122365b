"""A tiny random-weight Gemma 4 (sliding and full layers, shared keys, per-layer embeddings)
through `ember create` from its HF folder and a real `ember serve`, asked by the `ollama` client:
greedy tokens equal transformers' own greedy generation, and a generation past num_ctx shifts
the context and finishes."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
ollama = pytest.importorskip("ollama")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from cli_support import EMBER, cli_env  # noqa: E402
from hf_families import save_family  # noqa: E402
from serve_process import Server  # noqa: E402

from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.tokenizer import Tokenizer  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPT = "the quick brown fox jumps over the lazy dog and then"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    hf = save_family("gemma4", root / "hf")
    convert_directory(root / "hf", root / "reference.gguf")  # for the tokenizer only
    server = Server(root)
    try:
        (root / "Modelfile").write_text(f"FROM {root / 'hf'}\n")
        result = subprocess.run(
            [*EMBER, "create", "gemma4-tiny", "-f", str(root / "Modelfile")],
            text=True, capture_output=True, timeout=300,
            env=cli_env(root, server.url.removeprefix("http://")),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        yield server, hf, Tokenizer.from_metadata(GGUFFile.open(root / "reference.gguf").metadata)
    finally:
        server.stop()


def test_greedy_tokens_equal_transformers(served):
    server, hf, tokenizer = served
    ids = tokenizer.encode(PROMPT)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    expected = tokenizer.decode(out[0, len(ids) :].tolist())
    answer = ollama.Client(server.url).generate(
        model="gemma4-tiny", prompt=PROMPT, raw=True,
        options={"temperature": 0, "num_predict": 12, "stop": []},
    )  # fmt: skip
    assert answer.response == expected and answer.eval_count == 12


def test_a_generation_past_num_ctx_shifts_and_finishes(served):
    server = served[0]
    chunks = list(ollama.Client(server.url).generate(
        model="gemma4-tiny", prompt=PROMPT, raw=True, stream=True,
        options={"temperature": 0.8, "seed": 7, "num_ctx": 24, "num_predict": 60},
    ))  # fmt: skip
    last = chunks[-1]  # (random weights may end early on an end token; past 24 either way)
    assert last.done and last.prompt_eval_count + last.eval_count > 30
