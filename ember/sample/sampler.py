"""Token sampling: penalties over the recent tokens, then greedy at temperature 0, else top_k,
typical_p, temperature, softmax, top_p, min_p and a seeded draw. Grammars live in grammar.py."""

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence

import torch

from ember.errors import OptionsError
from ember.sample.params import SamplingParams
from ember.sample.topk import block_maxima, sorted_row, top_k_rows

MAX_TOP_LOGPROBS = 20  # Ollama's bound on top_logprobs
MAX_LOGIT_BIAS = 100.0  # OpenAI's range is [-100, 100]; a bias at -100 bans the token


class Sampler:
    """Draws the next token of one sequence; owns its random generator and the sequence's
    recent tokens (fed with `accept`: the prompt's, then each generated one)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator()
        if params.seed != -1:  # Ollama's: any other seed, negative ones too, is a seed
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()
        self.recent: deque[int] = deque(maxlen=params.repeat_last_n)
        self.counts: Counter[int] = Counter()  # occurrences of each token in recent

    def accept(self, token: int) -> None:
        """Records a token of the sequence, for the penalties of the following draws."""
        if not self.params.has_penalties:
            return
        if len(self.recent) == self.recent.maxlen:
            oldest = self.recent[0]  # leaves the window as token enters it
            self.counts[oldest] -= 1
            if not self.counts[oldest]:
                del self.counts[oldest]
        self.recent.append(token)
        self.counts[token] += 1

    def accept_all(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.accept(token)

    def sample(self, logits: torch.Tensor) -> int:
        """logits (V,) float32 -> a token id."""
        p = self.params
        if p.logit_bias:
            logits = biased(logits.unsqueeze(0), [p.logit_bias]).squeeze(0)
        if p.has_penalties and self.counts:
            logits = penalize(logits, self.counts, p)
        if p.temperature == 0:
            return int(logits.argmax())
        return self.draw(*candidates(logits, p))

    def draw(self, ids: torch.Tensor, probs: torch.Tensor) -> int:
        """One of ids, drawn with probs from this sampler's generator."""
        choice = torch.multinomial(probs, 1, generator=self.generator)
        return int(ids[choice])


def biased(logits: torch.Tensor, biases: Sequence[Sequence[tuple[int, float]]]) -> torch.Tensor:
    """A copy of logits (R, V) with row r's (token, bias) pairs added, in one indexed write:
    biases clamped to [-100, 100], -100 banning the token (-inf), ids past V ignored."""
    out = logits.clone()
    entries = bias_entries(logits, biases)
    if entries is not None:
        out.index_put_(*entries, accumulate=True)
    return out


def bias_entries(
    logits: torch.Tensor, biases: Sequence[Sequence[tuple[int, float]]]
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The (rows, ids) index and the values that `biased` adds to logits (R, V); None if none."""
    rows, ids, values = [], [], []
    for r, pairs in enumerate(biases):
        for token, bias in pairs:
            if token < logits.shape[1]:
                clamped = min(max(bias, -MAX_LOGIT_BIAS), MAX_LOGIT_BIAS)
                rows.append(r)
                ids.append(token)
                values.append(-math.inf if clamped <= -MAX_LOGIT_BIAS else clamped)
    if not rows:
        return None
    device = logits.device
    index = (torch.tensor(rows, device=device), torch.tensor(ids, device=device))
    return index, torch.tensor(values, dtype=logits.dtype, device=device)


def penalize(logits: torch.Tensor, counts: Mapping[int, int], p: SamplingParams) -> torch.Tensor:
    """llama.cpp's penalties on a copy of logits (V,): see `penalty_entries`."""
    entries = penalty_entries(logits, counts, p)
    if entries is None:
        return logits
    out = logits.clone()
    out[entries[0]] = entries[1]
    return out


def penalty_entries(
    logits: torch.Tensor, counts: Mapping[int, int], p: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The ids of logits (V,) that llama.cpp's penalties change and their new values (None if
    none): each token seen c > 0 times is divided by repeat_penalty (multiplied when <= 0, so it
    still drops), then lowered by c * frequency_penalty + presence_penalty."""
    seen = [t for t in counts if 0 <= t < logits.numel()]
    if not seen:
        return None
    ids = torch.tensor(seen, dtype=torch.long, device=logits.device)
    c = torch.tensor([counts[t] for t in seen], dtype=logits.dtype, device=logits.device)
    x = logits[ids]
    x = torch.where(x > 0, x / p.repeat_penalty, x * p.repeat_penalty)
    return ids, x - (c * p.frequency_penalty + p.presence_penalty)


def candidates(logits: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids still allowed after top_k, typical_p, top_p and min_p, with their probabilities
    (descending, equal ones by id). Penalties are not applied here: pass penalized logits."""
    if 0 < p.top_k < logits.numel():
        rows = logits.contiguous().unsqueeze(0)
        values, ids = top_k_rows(rows, [0], [p.top_k], block_maxima(rows))[0]
    else:
        values, ids = sorted_row(logits)
    return truncate(values, ids, p)


def truncate(
    values: torch.Tensor, ids: torch.Tensor, p: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """From the top_k logits (descending) and their ids: typical_p, temperature, softmax, top_p
    and min_p; the ids kept, with their probabilities. typical_p reads the distribution before
    temperature, as llama.cpp's chain does (Ollama's engine has no typical_p); the rest follow
    Ollama's order."""
    if p.typical_p < 1.0:
        ids, values = typical(ids, values, p.typical_p)
    probs = torch.softmax(values / max(p.temperature, 1e-7), dim=-1)
    # checked before the filters, which would drop NaN rows to nothing (Ollama's message)
    if not bool(torch.isfinite(probs.sum())):
        raise ValueError("logits sum to NaN")
    if p.top_p < 1.0:
        # keep the smallest prefix whose cumulative probability exceeds top_p
        before = probs.cumsum(0) - probs
        probs = probs[before < p.top_p] if p.top_p > 0 else probs[:1]
        ids = ids[: probs.numel()]
    if p.min_p > 0.0:
        keep = probs >= p.min_p * probs[0]
        probs, ids = probs[keep], ids[keep]
    return ids, probs


def typical(
    ids: torch.Tensor, values: torch.Tensor, mass: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Locally typical sampling (llama.cpp's typical sampler) over logits (descending): the
    tokens whose surprise -log p is closest to the entropy, until their probabilities sum past
    mass. The kept ids and logits come back in their descending order."""
    probs = torch.softmax(values, dim=-1)
    if not bool(torch.isfinite(probs.sum())):
        return ids, values  # truncate's check names it
    entropy = -torch.special.xlogy(probs, probs).sum()
    shifted = (-probs.log() - entropy).abs()
    order = shifted.argsort(stable=True)
    past = (probs[order].cumsum(0) > mass).nonzero()
    last = int(past[0]) + 1 if past.numel() else order.numel()
    keep = order[:last].sort().values  # positions in values, so still descending
    return ids[keep], values[keep]


def logprobs(logits: torch.Tensor, token: int, top_n: int) -> tuple[float, list[tuple[int, float]]]:
    """From raw logits (V,) (before penalties and temperature, as Ollama): the log probability of
    token, and the top_n most likely (id, logprob), descending (ties by id)."""
    if not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise OptionsError(f"top_logprobs must be within [0, {MAX_TOP_LOGPROBS}], got {top_n}")
    if not 0 <= token < logits.numel():
        raise ValueError(f"token {token} is outside the vocabulary of {logits.numel()}")
    lp = torch.log_softmax(logits.float(), dim=-1)  # max-subtracted: stable
    top: list[tuple[int, float]] = []
    if top_n:
        # every id tied with the n-th value, so that ties resolve by id, not by topk's whim
        nth = lp.topk(min(top_n, lp.numel())).values[-1]
        ids = (lp >= nth).nonzero().squeeze(1)
        pairs = zip(ids.tolist(), lp[ids].tolist(), strict=True)
        top = sorted(pairs, key=lambda t: (-t[1], t[0]))[:top_n]
    return float(lp[token]), top
