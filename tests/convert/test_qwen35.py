"""Qwen3.5 converted from tiny random-weight HF models (gated DeltaNet layers with grouped value
heads, gated full attention with partial RoPE; and the mixture variant with a gated shared
expert): logits equal HF's over a prompt, whole, in pieces or token by token; two sequences in
one batch equal each alone; the recurrent state's checkpoints let a sequence step back."""

from collections.abc import Iterator

import pytest

pytest.importorskip("transformers")

from hf_families import convert_family
from test_dense_families import OTHER, PROMPT, batch_error, forward, run, stepped_error
from test_lfm2 import check_resumes
from tinymodels import hf_logits

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.runner.engine import Engine

LONG = PROMPT + OTHER + PROMPT  # 51 tokens
# transformers' own logits, its cached token-by-token run against its whole prompt, differ by up
# to 8.4e-5 of the largest logit here (2.5e-3 of 30 for Qwen3-Next): the recurrent state's
# float32 sums in another order. Ember's stay within twice that.
CLOSE = 2e-4  # of the largest logit


@pytest.fixture(scope="module", params=["qwen3.5", "qwen3.5-moe", "qwen3-next"])
def converted(request, tmp_path_factory):
    return convert_family(request.param, tmp_path_factory.mktemp(request.param))


def test_the_file_holds_ollamas_keys(converted):
    with GGUFFile.open(converted[0]) as f:
        md = f.metadata
    arch = md["general.architecture"]
    assert arch in ("qwen35", "qwen35moe", "qwen3next")
    assert md[f"{arch}.attention.head_count_kv"] == [0, 0, 0, 2] * 2
    assert md[f"{arch}.ssm.v_head_reordered"] is (arch != "qwen3next")
    assert md[f"{arch}.ssm.group_count"] == 2
    assert md[f"{arch}.rope.dimension_count"] == 4


def test_logits_equal_transformers(converted):
    path, hf = converted
    model = load_model(GGUFFile.open(path))
    expected = hf_logits(hf, LONG)
    close = CLOSE * float(expected.abs().max())
    assert stepped_error(model, expected, LONG) < close
    pieces = [LONG[:7], LONG[7:30], LONG[30:]]
    assert (run(model, pieces) - expected).abs().max() < close


def test_two_sequences_in_one_batch_equal_each_alone(converted):
    assert batch_error(load_model(GGUFFile.open(converted[0]))) < 1e-3


def test_a_sequence_steps_back_to_a_checkpoint(converted):
    """The prompt's last token evaluated again (as the runner does for a cached prompt), from
    the state checkpointed before it; further back than the checkpoints, it cannot resume."""
    model = load_model(GGUFFile.open(converted[0]))
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    first = forward(model, cache, Batch.single(PROMPT, 0))
    assert cache.can_resume(0, len(PROMPT) - 1) and not cache.can_resume(0, len(PROMPT) - 8)
    cache.remove(0, len(PROMPT) - 1, None)
    again = forward(model, cache, Batch.single(PROMPT[-1:], len(PROMPT) - 1))
    assert (again - first[-1:]).abs().max() < 1e-4


def test_the_engine_resumes_at_a_checkpoint_and_else_evaluates_again(converted):
    def cases(warm: Engine) -> Iterator[tuple[list[int], int]]:
        yield PROMPT, len(PROMPT)
        yield list(warm.inputs.slots[0].inputs) + OTHER, len(OTHER)  # the conversation goes on
        earlier = PROMPT[:9] + OTHER  # no state is held at position 9 any more
        yield earlier, len(earlier)

    check_resumes(converted[0], cases)
