"""How far llama.cpp's q8_K over every feed-forward gate/up input moves a model's logits, on any
file: the weights as stored, float32 everywhere else.

    .venv/bin/python benchmarks/gate_up_int8.py --model gemma3:270m

A K-type gate/up takes one q8_K pass over its input (ember/backend/precision.py's
activation_passes), in decode and prefill. The bundled models' gate/up are no K types (their
hidden sizes are no multiple of 256), so activation_passes.py cannot measure them; this
simulates the pass (the input quantized per 256 values and expanded back, zero-padded to whole
blocks) to see whether a model's feed-forward inputs (Gemma's outlier channels, say) make one
pass worse for it than for the others. One forward pass over a mixed prompt; per position, the
largest logit difference relative to the largest logit, and whether the top token is the same.
"""

import argparse

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.llm import LLM
from ember.model import forward

TEXT = (
    "The quick brown fox jumps over the lazy dog. In 1905, Einstein published four papers that "
    "changed physics: on the photoelectric effect, Brownian motion, special relativity and "
    "mass-energy equivalence.\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
)


def q8_k(x: torch.Tensor) -> torch.Tensor:
    """x (T, n) as one q8_K pass leaves it: per 256 values iscale = -127 / the value of largest
    magnitude, codes round(iscale * x) (at most 127), times 1 / iscale."""
    rows, n = x.shape
    blocks = F.pad(x, (0, -n % 256)).reshape(rows, -1, 256)
    top = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
    iscale = torch.where(top != 0, -127 / top, torch.zeros_like(top))
    codes = torch.round(iscale * blocks).clamp(max=127)
    d = torch.where(iscale != 0, 1 / iscale, torch.zeros_like(iscale))
    return (codes * d).reshape(rows, -1)[:, :n]


def all_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    model, cache = llm.model, llm.model.make_cache()
    cache.init(max_sequences=1, capacity=len(ids), max_batch=len(ids), dtype="f32")
    n = len(ids)
    return forward(model, cache, Batch(tuple(ids), tuple(range(n)), (0,) * n, tuple(range(n))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3:270m")
    args = parser.parse_args()
    llm = LLM(args.model)
    llm.model._native = None  # the Python blocks, whose gate/up calls can be wrapped
    ids = llm.tokenize(TEXT)
    with torch.inference_mode():
        reference = all_logits(llm, ids)
        for block in llm.model.blocks:
            gate_up = block.ffn_gate_up
            block.ffn_gate_up = lambda x, w=gate_up: w(q8_k(x))
        quantized = all_logits(llm, ids)
    error = (quantized - reference).abs().amax(-1) / reference.abs().amax(-1)
    agree = float((quantized.argmax(-1) == reference.argmax(-1)).float().mean())
    print(
        f"{args.model}: logits moved by {error.median():.3f} of their largest (median over "
        f"{len(ids)} positions), {error.max():.3f} at most; top token kept at {agree:.1%}"
    )


if __name__ == "__main__":
    main()
