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
        ({"repeat_last_n": -2}, "repeat_last_n' must be >= -1"),
        ({"num_thread": -1}, r"num_thread' must be within \[0, 1024\]"),
        ({"num_thread": 100_000}, r"num_thread' must be within \[0, 1024\]"),
        # what JSON cannot carry to Ollama's Go types: a 400 there, never a 500 here
        ({"temperature": float("inf")}, "temperature' must be a finite number"),
        ({"repeat_penalty": float("nan")}, "repeat_penalty' must be a finite number"),
        ({"temperature": 10**400}, "temperature' must be a finite number"),
        ({"seed": 2**70}, "seed' is out of range for a 64-bit integer"),
        ({"num_ctx": 2**63}, "num_ctx' is out of range"),
        ({"repeat_last_n": 1e300}, "repeat_last_n' is out of range"),
    ],
)
def test_bad_options_get_clear_errors(given, message):
    with pytest.raises(OptionsError, match=message):
        Options.parse(given)


@pytest.mark.parametrize(
    ("given", "field", "value"),
    [  # as Ollama's NewSampler and Options.FromMap take them
        ({"temperature": -1}, "temperature", 0.0),
        ({"top_k": -1}, "top_k", 0),
        ({"top_p": 1.5}, "top_p", 1.0),
        ({"top_p": -0.5}, "top_p", 0.0),
        ({"min_p": 2}, "min_p", 1.0),
        ({"typical_p": 0}, "typical_p", 1.0),
        ({"typical_p": 1.5}, "typical_p", 1.0),
        ({"typical_p": -3}, "typical_p", 1.0),
        ({"repeat_penalty": 0}, "repeat_penalty", 1.0),  # off, as Ollama's sampler normalizes it
        ({"repeat_penalty": -2}, "repeat_penalty", 1.0),
    ],
)
def test_out_of_range_sampling_values_are_brought_into_range(given, field, value):
    assert getattr(Options.parse(given).sampling(), field) == value


def test_fractional_integer_options_are_cut_toward_zero():
    o = Options.parse({"num_predict": 3.7, "top_k": 2.5, "seed": -42.9})
    assert (o.num_predict, o.top_k, o.seed) == (3, 2, -42)


def test_options_must_be_a_mapping():
    with pytest.raises(OptionsError):
        Options.parse(["temperature"])  # type: ignore[arg-type]


def test_sampling_options_reach_the_sampler():
    given = {
        "typical_p": 0.7,
        "repeat_penalty": 1.3,
        "presence_penalty": -0.5,
        "frequency_penalty": 0.25,
        "repeat_last_n": 32,
    }
    p = Options.parse(given).sampling()
    got = (p.typical_p, p.repeat_penalty, p.presence_penalty, p.frequency_penalty)
    assert got == (0.7, 1.3, -0.5, 0.25) and p.repeat_last_n == 32


def test_repeat_last_n_minus_one_means_num_ctx():
    assert Options.parse({"repeat_last_n": -1, "num_ctx": 512}).sampling().repeat_last_n == 512
    assert Options.parse({"repeat_last_n": 0}).sampling().has_penalties is False
