"""`ember create NAME -f Modelfile` with `FROM <HF directory>` against a real `ember serve`: the
CLI uploads the checkpoint's files, the server converts them (optionally quantizing) and the
model answers; a broken directory is a one-line error (CLI) and a 400 (API)."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from cli_support import EMBER, cli_env, one_line_error  # noqa: E402
from hf_dirs import save_hf_dir  # noqa: E402
from serve_process import Server  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("serve"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    save_hf_dir("qwen2", root / "tiny-qwen", generation_eos=[298, 296])
    (root / "Modelfile").write_text("FROM ./tiny-qwen\nPARAMETER temperature 0\n")
    return root


def ember_create(server: Server, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = cli_env(root, server.url.removeprefix("http://"))
    return subprocess.run(
        [*EMBER, "create", *args, "-f", str(root / "Modelfile")],
        text=True, capture_output=True, timeout=300, env=env,
    )  # fmt: skip


def test_create_from_a_directory_converts_and_answers(server, hf_dir):
    result = ember_create(server, hf_dir, "tiny-qwen")
    assert result.returncode == 0, result.stderr
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny-qwen"}).json()
    assert shown["details"]["family"] == "qwen2"
    assert shown["details"]["quantization_level"] == "F32"
    reply = httpx.post(
        f"{server.url}/api/chat",
        json={"model": "tiny-qwen", "stream": False, "options": {"num_predict": 4},
              "messages": [{"role": "user", "content": "Why is the sky blue?"}]},
        timeout=300,
    ).json()  # fmt: skip
    assert reply["done"] is True, reply
    assert reply["prompt_eval_count"] > 5


def test_create_from_a_directory_with_quantize(server, hf_dir):
    result = ember_create(server, hf_dir, "tiny-qwen-q8", "--quantize", "q8_0")
    assert result.returncode == 0, result.stderr
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tiny-qwen-q8"}).json()
    assert shown["details"]["quantization_level"] == "Q8_0"


def test_a_broken_directory_is_a_one_line_error_and_a_400(server, hf_dir, tmp_path):
    broken = tmp_path / "tiny-qwen"
    broken.mkdir()
    for f in (hf_dir / "tiny-qwen").iterdir():
        if f.name != "config.json":
            (broken / f.name).write_bytes(f.read_bytes())
    (broken / "config.json").write_text('{"architectures": ["GPTBigCode"]}')
    (tmp_path / "Modelfile").write_text("FROM ./tiny-qwen\n")
    result = ember_create(server, tmp_path, "broken")
    assert result.returncode != 0
    assert one_line_error(result.stderr), result.stderr
    assert "unsupported architecture" in result.stderr
    weights = (broken / "model.safetensors").read_bytes()
    digest = "sha256:" + __import__("hashlib").sha256(weights).hexdigest()
    httpx.post(f"{server.url}/api/blobs/{digest}", content=weights)
    answer = httpx.post(
        f"{server.url}/api/create",
        json={"model": "broken", "files": {"model.safetensors": digest}, "stream": False},
    )
    assert answer.status_code == 400
    assert "config.json" in answer.json()["error"]
