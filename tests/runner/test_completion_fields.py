"""The runner's completion request: a grammar beside format (never both), logit_bias ids checked
against the vocabulary."""

import pytest

from ember.errors import EmberError
from ember.runner.server import CompletionRequest, _grammar, _logit_bias


def test_logit_bias_ids_must_be_in_the_vocabulary() -> None:
    assert _logit_bias({3: -100.0, 9: 2.0}, 10) == ((3, -100.0), (9, 2.0))
    with pytest.raises(EmberError, match="token 10, outside the vocabulary"):
        _logit_bias({10: 1.0}, 10)


def test_a_completion_takes_a_format_or_a_grammar() -> None:
    req = CompletionRequest.model_validate(
        {"prompt": "x", "format": "json", "grammar": 'start: "a"', "logit_bias": {"3": 1}}
    )
    assert req.logit_bias == {3: 1.0}
    with pytest.raises(EmberError, match="not both"):
        _grammar(req, tokenizer=None)  # type: ignore[arg-type]
    assert _grammar(CompletionRequest(prompt="x"), tokenizer=None) is None  # type: ignore[arg-type]
