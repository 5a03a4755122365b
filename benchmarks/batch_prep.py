"""How long the run loop spends preparing a batch, against the whole step, with N sequences
decoding at once: what pipelining the next batch's preparation could gain at most.

    .venv/bin/python benchmarks/batch_prep.py --model smollm2:135m --threads 2 --parallel 8
"""

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def timed(fn: Callable[..., Any], durations: list[int]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        result = fn(*args, **kwargs)
        durations.append(time.perf_counter_ns() - start)
        return result

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--gen-tokens", type=int, default=96)
    args = parser.parse_args()

    import torch

    from ember.backend.threads import in_fresh_thread
    from ember.catalog import resolve_model
    from ember.gguf import GGUFFile
    from ember.model import load_model
    from ember.options import Options
    from ember.runner.engine import Engine
    from ember.runner.sequence import Done, Request
    from ember.tokenizer import Tokenizer

    torch.set_num_threads(args.threads)
    gguf = GGUFFile.open(resolve_model(args.model))
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    model = in_fresh_thread(lambda: load_model(gguf))
    engine = Engine(model, tokenizer, num_parallel=args.parallel, num_ctx=256, num_batch=512)
    choose: list[int] = []
    build: list[int] = []
    steps: list[int] = []
    engine._next_batch = timed(engine._next_batch, choose)  # type: ignore[method-assign]
    engine._batch = timed(engine._batch, build)  # type: ignore[method-assign]
    engine._step = timed(engine._step, steps)  # type: ignore[method-assign]
    greedy = Options(temperature=0, num_predict=args.gen_tokens)
    seqs = [
        engine.submit(Request(tokenizer.encode(f"Story number {i}: once upon a time"), greedy))
        for i in range(args.parallel)
    ]
    for seq in seqs:
        while not isinstance(seq.events.get(), Done):
            pass
    engine.close()
    prep = statistics.median(choose) + statistics.median(build)
    step = statistics.median(steps)
    print(f"model {args.model}, {args.parallel} sequences, {len(steps)} steps (medians)")
    print(f"batch preparation {prep / 1e3:.1f} us, step {step / 1e6:.2f} ms ({prep / step:.2%})")


if __name__ == "__main__":
    main()
