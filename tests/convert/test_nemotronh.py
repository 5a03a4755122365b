"""Nemotron-H converted from a tiny random-weight HF NemotronHForCausalLM (Mamba 2 layers with
grouped B and C, attention without positions, a squared-ReLU MLP, a mixture with a correction
bias and a shared expert): logits equal HF's over a prompt, whole, in pieces or token by token;
two sequences in one batch equal each alone; the engine resumes at a state checkpoint."""

from collections.abc import Iterator

import pytest

pytest.importorskip("transformers")

from hf_families import convert_family
from test_dense_families import OTHER, PROMPT, batch_error, run, stepped_error
from test_lfm2 import check_resumes
from tinymodels import hf_logits

from ember.gguf import GGUFFile
from ember.model import load_model
from ember.runner.engine import Engine

LONG = PROMPT + OTHER + PROMPT  # 51 tokens


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_family("nemotron-h", tmp_path_factory.mktemp("nemotron-h"))


def test_the_file_holds_the_keys(converted):
    with GGUFFile.open(converted[0]) as f:
        md = f.metadata
    assert md["general.architecture"] == "nemotron_h_moe"
    assert md["nemotron_h_moe.attention.head_count_kv"] == [0, 2, 0, 0] * 2
    assert md["nemotron_h_moe.feed_forward_length"] == [0, 0, 96, 32] * 2
    assert md["nemotron_h_moe.ssm.group_count"] == 2


def test_logits_equal_transformers(converted):
    path, hf = converted
    model = load_model(GGUFFile.open(path))
    expected = hf_logits(hf, LONG)
    assert stepped_error(model, expected, LONG) < 1e-4
    assert (run(model, [LONG[:7], LONG[7:30], LONG[30:]]) - expected).abs().max() < 1e-4


def test_two_sequences_in_one_batch_equal_each_alone(converted):
    assert batch_error(load_model(GGUFFile.open(converted[0]))) < 1e-4


def test_the_engine_resumes_at_a_checkpoint_and_else_evaluates_again(converted):
    def cases(warm: Engine) -> Iterator[tuple[list[int], int]]:
        yield PROMPT, len(PROMPT)
        yield list(warm.inputs.slots[0].inputs) + OTHER, len(OTHER)  # the conversation goes on
        earlier = PROMPT[:9] + OTHER  # no state is held at position 9 any more
        yield earlier, len(earlier)

    check_resumes(converted[0], cases)
