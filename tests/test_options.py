"""Ollama option names, types and values as a user sends them."""

import pytest

from ember.errors import OptionsError
from ember.options import Options


def test_given_options_override_defaults():
    o = Options.parse({"temperature": 0, "num_predict": 5.0, "stop": "\n", "seed": 3})
    assert (o.temperature, o.num_predict, o.stop, o.seed, o.top_k) == (0.0, 5, ("\n",), 3, 40)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"temprature": 1}, "unknown option 'temprature'"),
        ({"top_k": "many"}, "must be an integer"),
        ({"temperature": "hot"}, "must be a number"),
        ({"num_predict": True}, "must be an integer"),
        ({"stop": [1, 2]}, "list of strings"),
        ({"num_ctx": 0}, "at least 1"),
        ({"top_p": 2}, "top_p must be within"),
        ({"repeat_penalty": 1.3}, "not supported"),
    ],
)
def test_bad_options_get_clear_errors(given, message):
    with pytest.raises(OptionsError, match=message):
        Options.parse(given)


def test_options_must_be_a_mapping():
    with pytest.raises(OptionsError):
        Options.parse(["temperature"])  # type: ignore[arg-type]
