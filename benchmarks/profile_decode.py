"""Where one decode step's time goes: weight matmuls, attention, the KV cache's bookkeeping, the
output head, sampling, and the rest (Python and torch dispatch), with the ops dispatched per token.

    .venv/bin/python benchmarks/profile_decode.py --model smollm2:135m --threads 2
    .venv/bin/python benchmarks/profile_decode.py --model gemma3:270m --context 1024 --torch-profile

A step runs the model's native layer call (one call a layer: weights, attention, norms and the
rest in C) where the model has one; --python-layers runs its Python blocks instead, whose parts
are timed one by one. A prompt of --context tokens is evaluated first (so attention sees that
many keys), then
--steps single-token steps are run as the engine runs them (start_forward, hidden, logits, one
sampling step). Three passes, each over fresh positions of the same cache:

1. plain: the wall time of a step, nothing measured inside it, and its CPU time;
2. timed: every weight call, attention call, cache start_forward, head and sampling call
   wrapped in perf_counter timers (adds ~1 µs per wrapped call; "other" is the step's time
   that no timer covers: Python, norms, RoPE, residuals, torch dispatch);
3. counted: one step under a TorchDispatchMode that counts the aten ops it dispatches (torch
   ops on tensors, composite ops counted as what they decompose into), and the native weight
   calls beside them.

--torch-profile adds torch.profiler's table of the ops that take the most self time.
"""

import argparse
import collections
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.sample import SamplingParams
from ember.sample.batched import sample_rows
from ember.sample.sampler import Sampler

TIMED_WEIGHTS = ("attn_qkv", "attn_output", "ffn_gate_up", "ffn_down")


class Timers:
    def __init__(self) -> None:
        self.total: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.on = False

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[name] += time.perf_counter() - t0
                self.calls[name] += 1

        return timed


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.views = 0  # ops that only make a view (no kernel, no allocation)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.counts[str(func.overloadpacket.__name__)] += 1
        self.views += bool(func.is_view)
        return func(*args, **(kwargs or {}))


class _Proxy:
    """Stands for a weight object: calls go through a timer, attributes to the weight."""

    def __init__(self, inner: Any, call: Callable[..., Any]) -> None:
        self._inner, self._call = inner, call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def instrument(model: Any, cache: Any, timers: Timers) -> None:
    """Puts timers around the weights of every block, attention, the head and the cache."""
    import sys

    for block in model.blocks:
        for name in TIMED_WEIGHTS:
            w = getattr(block, name)
            setattr(block, name, _Proxy(w, timers.wrap("weights " + name, w)))
    model.output = _Proxy(model.output, timers.wrap("output head", model.output))
    for mod in list(sys.modules.values()):  # every arch module's own name for attention
        name = getattr(mod, "__name__", "")
        if name.startswith("ember.model.archs.") and hasattr(mod, "attention"):
            mod.attention = timers.wrap("attention (cache put/get + sdpa)", mod.attention)
    layers = model.native_layers() if hasattr(model, "native_layers") else None
    if layers:  # a step through the native layer call: one timer around each layer's call
        name = "native layers (weights, attention, norms, ...)"
        model._native = [_Proxy(layer, timers.wrap(name, layer)) for layer in layers]
    cache.start_forward = timers.wrap("cache start_forward (cells, mask)", cache.start_forward)
    lookup = model.token_embd.lookup
    model.token_embd = _Proxy(model.token_embd, lambda *a: None)
    model.token_embd.lookup = timers.wrap("embedding lookup", lookup)  # type: ignore[attr-defined]


def stub(model: Any) -> None:
    """Every block weight becomes a call that returns a zero tensor of its output's shape."""
    for block in model.blocks:
        for name in TIMED_WEIGHTS:
            w = getattr(block, name)
            out = torch.zeros(8, w.out_features)

            def ready(x: torch.Tensor, out: torch.Tensor = out) -> torch.Tensor:
                return out[: x.shape[0]]

            setattr(block, name, _Proxy(w, ready))


def step(model: Any, cache: Any, sampler: Sampler, token: int, pos: int) -> int:
    """One decode step as the engine runs it."""
    batch = Batch.single([token], pos)
    cache.start_forward(batch)
    with torch.inference_mode():
        hidden = model.hidden(batch, cache)
        logits = model.logits(hidden)
    return sample_rows([sampler], logits)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=512, help="tokens in the cache first")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per pass")
    parser.add_argument("--capacity", type=int, default=0, help="cache cells (0: just enough)")
    parser.add_argument("--kv-type", default="", help="cache type (f32, f16, q8_0, q4_0)")
    parser.add_argument("--sampling", choices=["greedy", "default"], default="greedy")
    parser.add_argument("--torch-profile", action="store_true")
    parser.add_argument(
        "--python-layers",
        action="store_true",
        help="run the blocks' Python layers, not the native layer call",
    )
    parser.add_argument(
        "--stub-weights",
        action="store_true",
        help="block weights return a ready tensor (no matmul): times everything but kernels",
    )
    args = parser.parse_args()

    from ember.catalog import resolve_model

    torch.set_num_threads(args.threads)
    path = str(resolve_model(args.model))
    model: Any = load_model(GGUFFile.open(path))
    cache: Any = model.make_cache()
    need = args.context + 4 * args.steps + 8
    init: dict[str, Any] = {"max_sequences": 1, "capacity": max(need, args.capacity)}
    init["max_batch"] = 512
    if args.kv_type:
        init["dtype"] = args.kv_type
    cache.init(**init)
    params = SamplingParams(temperature=0.0) if args.sampling == "greedy" else SamplingParams()
    sampler = Sampler(params)

    ids = [(i * 7919) % 1000 + 10 for i in range(args.context)]
    with torch.inference_mode():
        for start in range(0, len(ids), 512):
            chunk = ids[start : start + 512]
            batch = Batch.single(chunk, start)
            cache.start_forward(batch)
            model.forward(batch, cache)
    pos, token = len(ids), 1

    cpu: list[float] = []

    def run(n: int) -> list[float]:
        nonlocal pos, token
        times = []
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.process_time()
            token = step(model, cache, sampler, token, pos)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            pos += 1
        return times

    if args.python_layers or args.stub_weights:
        model._native = None
    if args.stub_weights:
        stub(model)
    run(4)  # warm up
    cpu.clear()
    plain = run(args.steps)
    step_ms = statistics.median(plain) * 1e3
    cpu_ms = statistics.median(cpu) * 1e3

    timers = Timers()
    instrument(model, cache, timers)
    sample = timers.wrap("sampling", sample_rows)
    globals()["sample_rows"] = sample
    timers.on = True
    timed = run(args.steps)
    timers.on = False
    timed_total = sum(timed)

    counter = CountOps()
    native_calls = sum(c for n, c in timers.calls.items() if n.startswith("weights")) // len(timed)
    with counter:
        run(1)

    print(
        f"model {args.model}, {args.threads} threads, {pos - args.steps} tokens in the cache, "
        f"kv {cache_type(cache)}, {args.sampling} sampling, {torch.__version__}"
    )
    print(
        f"decode step (plain): median {step_ms:.2f} ms = {1e3 / step_ms:.1f} tok/s; "
        f"CPU time {cpu_ms:.2f} ms (all threads; with --threads 1 the figure that a busy "
        "machine disturbs least)"
    )
    print(f"timed pass: mean {timed_total / len(timed) * 1e3:.2f} ms a step")
    print(f"{'part':<40} {'ms/step':>8} {'share':>6} {'calls/step':>10}")
    covered = 0.0
    for name, total in sorted(timers.total.items(), key=lambda kv: -kv[1]):
        covered += total
        per = total / len(timed)
        print(
            f"{name:<40} {per * 1e3:>8.3f} {total / timed_total:>6.1%} "
            f"{timers.calls[name] / len(timed):>10.0f}"
        )
    other = (timed_total - covered) / len(timed)
    print(
        f"{'other (python, norms, rope, dispatch)':<40} {other * 1e3:>8.3f} "
        f"{(timed_total - covered) / timed_total:>6.1%}"
    )
    total_ops = sum(counter.counts.values())
    print(
        f"\naten ops dispatched in one step: {total_ops}, {counter.views} of them views "
        f"(+ {native_calls} weight calls)"
    )
    for name, n in counter.counts.most_common(15):
        print(f"  {name:<36} {n:>5}")

    if args.torch_profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run(args.steps)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def cache_type(cache: Any) -> str:
    inner = getattr(cache, "caches", [cache])[0]
    return str(getattr(inner, "kind", "?"))


if __name__ == "__main__":
    main()
