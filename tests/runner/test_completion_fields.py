"""The runner's completion request: a grammar beside format (never both), logit_bias ids checked
against the vocabulary; an embedding's inputs cut to the context."""

from types import SimpleNamespace

import pytest

from ember.errors import EmberError
from ember.runner.sequence import InputTooLongError, cut_embedding
from ember.runner.server import CompletionRequest, _grammar, _logit_bias
from ember.sample.grammar import Grammar, grammar_text


def test_logit_bias_ids_must_be_in_the_vocabulary() -> None:
    assert _logit_bias({3: -100.0, 9: 2.0}, 10) == ((3, -100.0), (9, 2.0))
    with pytest.raises(EmberError, match="token 10, outside the vocabulary"):
        _logit_bias({10: 1.0}, 10)


def test_a_logit_bias_that_bans_every_token_is_refused() -> None:
    # sampling at a temperature had failed with NaN (a 500), greedy drawn token 0
    with pytest.raises(EmberError, match="bans every token"):
        _logit_bias({t: -100.0 for t in range(10)}, 10)
    assert len(_logit_bias({t: -100.0 for t in range(9)}, 10)) == 9


def test_a_completion_takes_a_format_or_a_grammar() -> None:
    req = CompletionRequest.model_validate(
        {"prompt": "x", "format": "json", "grammar": 'start: "a"', "logit_bias": {"3": 1}}
    )
    assert req.logit_bias == {3: 1.0}
    with pytest.raises(EmberError, match="not both"):
        _grammar(req, tokenizer=None)  # type: ignore[arg-type]
    assert _grammar(CompletionRequest(prompt="x"), tokenizer=None) is None  # type: ignore[arg-type]


def test_an_empty_schema_is_a_format_any_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """`"format": {}` constrains (Ollama's converter makes any JSON object of it); only a missing
    format leaves the answer free."""
    seen: list[object] = []

    def from_format(cls: type, fmt: object, tokenizer: object) -> str:
        seen.append(fmt)
        return "grammar"

    monkeypatch.setattr(Grammar, "from_format", classmethod(from_format))
    req = CompletionRequest(prompt="x", format={})
    assert _grammar(req, tokenizer=None) == "grammar"  # type: ignore[arg-type,comparison-overlap]
    assert seen == [{}]
    assert grammar_text({}) == grammar_text("json")


def test_an_embeddings_cut_keeps_the_tokens_around_its_text() -> None:
    bert = SimpleNamespace(add_bos=True, bos_id=101, add_eos=True, eos_id=102)
    inputs = [101, 7, 8, 9, 102]
    cut_embedding(inputs, 4, bert)  # type: ignore[arg-type]
    assert inputs == [101, 7, 8, 102]
    plain = SimpleNamespace(add_bos=False, bos_id=1, add_eos=False, eos_id=2)
    inputs = [7, 8, 9, 2]  # an end token the vocabulary did not add is text: cut as text
    cut_embedding(inputs, 2, plain)  # type: ignore[arg-type]
    assert inputs == [7, 8]
    with pytest.raises(InputTooLongError, match=r"^input after truncation exceeds maximum"):
        cut_embedding([101, 7, 102], 2, bert)  # type: ignore[arg-type]


def test_a_body_the_server_let_go_mid_upload_is_a_499_not_a_traceback() -> None:
    # the runner's log reaches the server's: the soak's server let embeddings go mid-body
    import asyncio

    from starlette.requests import Request

    from ember.runner.server import EmbeddingRequest, HTTPError, _body

    async def gone() -> dict[str, str]:
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "headers": []}, gone)
    with pytest.raises(HTTPError) as err:
        asyncio.run(_body(request, EmbeddingRequest))
    assert err.value.status == 499
