"""The `ember` command: `ember serve` runs the server; `ember run MODEL [PROMPT]` runs a model in
this process."""

import argparse
import sys
from typing import TYPE_CHECKING

from ember import __version__
from ember.errors import EmberError

if TYPE_CHECKING:
    from ember.llm import GenerateResult


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ember", description="Run large language models locally.")
    parser.add_argument("--version", action="version", version=f"ember version {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="answer a prompt with a model")
    run.add_argument("model", nargs="?", default="smollm2:135m")
    run.add_argument("prompt", nargs="*", help="the prompt (read from stdin when absent)")
    run.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    run.add_argument("--verbose", action="store_true", help="print timings after the answer")
    run.add_argument("--temperature", type=float, default=None)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--num-predict", type=int, default=None)
    commands.add_parser("serve", help="start the server (on EMBER_HOST, default 127.0.0.1:11434)")
    runner = commands.add_parser("runner", help="serve one model to the server (internal)")
    runner.add_argument("--model", required=True, help="path of the GGUF file")
    runner.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "runner":
            from ember.runner.server import main as runner_main

            return runner_main(args.model, args.port)
        if args.command == "serve":
            from ember.server.app import serve

            return serve()
        return _run(args)
    except EmberError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    from ember.llm import LLM, TokenStream

    prompt = " ".join(args.prompt) if args.prompt else sys.stdin.read()
    if not prompt.strip():
        print("Error: no prompt given (pass it as an argument or on stdin)", file=sys.stderr)
        return 1
    options = {
        k: v
        for k, v in (
            ("temperature", args.temperature),
            ("seed", args.seed),
            ("num_predict", args.num_predict),
        )
        if v is not None
    }
    llm = LLM(args.model)
    stream = llm.generate(prompt, raw=args.raw, options=options, stream=True)
    assert isinstance(stream, TokenStream)
    for piece in stream:
        print(piece, end="", flush=True)
    print()
    result = stream.result
    if args.verbose and result is not None:
        _print_timings(result, llm.load_duration)
    return 0


def _print_timings(r: "GenerateResult", load_ns: int) -> None:
    def rate(n: int, ns: int) -> str:
        return f"{n / (ns / 1e9):.2f} tokens/s" if ns else "-"

    lines = [
        ("total duration", f"{r.total_duration / 1e9:.3f}s"),
        ("load duration", f"{load_ns / 1e9:.3f}s"),
        ("prompt eval count", f"{r.prompt_eval_count} token(s)"),
        ("prompt eval rate", rate(r.prompt_eval_count, r.prompt_eval_duration)),
        ("eval count", f"{r.eval_count} token(s)"),
        ("eval rate", rate(r.eval_count, r.eval_duration)),
    ]
    for name, value in lines:
        print(f"{name + ':':<20}{value}", file=sys.stderr)
