"""Ollama's generation options: names, types, defaults, and validation of what a user sends."""

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from ember.errors import OptionsError
from ember.sample import SamplingParams

MAX_DRAFT = 32  # drafted tokens per step, at most (the runner's verify batch is sized for it)


@dataclass(frozen=True, slots=True)
class Options:
    num_ctx: int = 4096
    num_batch: int = 512
    num_keep: int = 4
    num_predict: int = -1
    num_thread: int = 0
    seed: int = -1
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    # speculative decoding (ember/runner/draft.py): tokens drafted per step by prompt lookup
    # (0: off), by the draft model when one is loaded (Ollama's name), and which draft model
    # the runner loads ("": the Modelfile's DRAFT, if any)
    draft_ngram: int = 0
    draft_num_predict: int = 4
    draft_model: str = ""

    @classmethod
    def parse(cls, given: dict[str, Any] | None, base: "Options | None" = None) -> "Options":
        """Merges given (Ollama option names) over base, rejecting unknown names and bad values."""
        if given is None:
            return base or cls()
        if not isinstance(given, dict):
            raise OptionsError("options must be a mapping of option names to values")
        types = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(given) - set(types) - _ACCEPTED_ELSEWHERE)
        if unknown:
            raise OptionsError(f"unknown option {unknown[0]!r} (known: {', '.join(types)})")
        values = {k: _coerce(k, v, types[k]) for k, v in given.items() if k in types}
        return _validated(replace(base or cls(), **values))

    def sampling(self) -> SamplingParams:
        # out-of-range values are brought into range, not refused, as Ollama's sampler does
        # (temperature < 0 is greedy, top_k <= 0 no limit, top_p and min_p clamped to [0, 1]);
        # typical_p outside (0, 1) is off, as llama.cpp's (>= 1) and Ollama's omitted 0, and a
        # repeat_penalty <= 0 is off (1), as Ollama's own sampler normalizes it
        return SamplingParams(
            temperature=max(self.temperature, 0.0),
            top_k=max(self.top_k, 0),
            top_p=min(max(self.top_p, 0.0), 1.0),
            min_p=min(max(self.min_p, 0.0), 1.0),
            typical_p=self.typical_p if 0.0 < self.typical_p < 1.0 else 1.0,
            # Ollama's -1: the whole context window
            repeat_last_n=self.num_ctx if self.repeat_last_n == -1 else self.repeat_last_n,
            repeat_penalty=self.repeat_penalty if self.repeat_penalty > 0 else 1.0,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
        )


# Runner options of Ollama that have no meaning on this engine (GPU layout, mmap): accepted, unused.
_ACCEPTED_ELSEWHERE = {"num_gpu", "main_gpu", "use_mmap", "numa", "low_vram"}


# Ollama's integer options are Go ints: JSON numbers past 64 bits fail to decode there (a 400)
_INT_RANGE = range(-(2**63), 2**63)


def _coerce(name: str, value: Any, kind: Any) -> Any:
    if kind in (int, "int"):
        return _integer(name, value)
    if kind in (float, "float"):
        return _number(name, value)
    if kind in (str, "str"):
        if not isinstance(value, str):
            raise OptionsError(f"option {name!r} must be a string, got {value!r}")
        return value
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
        raise OptionsError(f"option {name!r} must be a list of strings")
    return tuple(s for s in value if s)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, float) and math.isfinite(value):
        value = int(value)  # toward zero, as Go's int64(float64) in Ollama's Options.FromMap
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionsError(f"option {name!r} must be an integer, got {value!r}")
    if value not in _INT_RANGE:
        raise OptionsError(f"option {name!r} is out of range for a 64-bit integer")
    return value


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OptionsError(f"option {name!r} must be a number, got {value!r}")
    # JSON has no infinity: Python's decoder makes one of 1e400 or `Infinity`
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        number = math.inf
    if not math.isfinite(number):
        raise OptionsError(f"option {name!r} must be a finite number, got {number!r}")
    return number


MAX_THREADS = 1024


def _validated(o: Options) -> Options:
    for name in ("num_ctx", "num_batch"):
        if getattr(o, name) < 1:
            raise OptionsError(f"option {name!r} must be at least 1, got {getattr(o, name)}")
    if not 0 <= o.num_thread <= MAX_THREADS:  # past it a load failed with no reason given
        raise OptionsError(
            f"option 'num_thread' must be within [0, {MAX_THREADS}], got {o.num_thread}"
        )
    if o.repeat_last_n < -1:
        raise OptionsError(
            f"option 'repeat_last_n' must be >= -1 (-1: num_ctx, 0: off), got {o.repeat_last_n}"
        )
    for name in ("draft_ngram", "draft_num_predict"):
        if not 0 <= getattr(o, name) <= MAX_DRAFT:
            raise OptionsError(
                f"option {name!r} must be within [0, {MAX_DRAFT}], got {getattr(o, name)}"
            )
    o.sampling()  # validates the sampling values it does not clamp (repeat_penalty, ...)
    return o
