"""What a request asks of its sampler, checked when it is made. Apart from the sampler (which
needs torch), so that the server checks options without it."""

import math
from dataclasses import dataclass

from ember.errors import OptionsError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0  # 1.0: off
    repeat_last_n: int = 64  # how many recent tokens the penalties look at; 0: none
    repeat_penalty: float = 1.0  # 1.0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = -1  # -1: a fresh random seed
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the logits

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # NaN too
            raise OptionsError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise OptionsError(f"top_k must be >= 0, got {self.top_k}")
        for name in ("top_p", "min_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise OptionsError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.typical_p <= 1.0:
            raise OptionsError(f"typical_p must be within (0, 1], got {self.typical_p}")
        if not self.repeat_penalty > 0.0:
            raise OptionsError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < 0:
            raise OptionsError(f"repeat_last_n must be >= 0, got {self.repeat_last_n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise OptionsError(f"{name} must be a finite number, got {getattr(self, name)}")
        for token, bias in self.logit_bias:
            if token < 0 or math.isnan(bias):
                raise OptionsError(f"logit_bias must map token ids >= 0 to numbers: {token}")

    @property
    def has_penalties(self) -> bool:
        no_effect = (self.repeat_penalty, self.presence_penalty, self.frequency_penalty)
        return self.repeat_last_n > 0 and no_effect != (1.0, 0.0, 0.0)
