"""The `ember` command line (typer): serve, run, pull, push, create, list, show, ps, stop, cp, rm,
and the hidden `runner` the server starts. Commands talk to the server at EMBER_HOST; errors
are one line (`Error: ...`) and a non-zero exit, printed by main()."""

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.exceptions import TyperException

from ember import __version__
from ember.cli import commands
from ember.cli.chat import Session, generate_once, load_model
from ember.cli.client import Client, CLIError
from ember.cli.gotext import check_duration
from ember.cli.images import has_vision
from ember.cli.serve import ensure_server
from ember.cli.wordwrap import WordWrap
from ember.errors import EmberError

DEFAULT_MODEL = "smollm2:135m"

app = typer.Typer(
    name="ember",
    help="Large language model runner",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def main(argv: list[str] | None = None) -> int:
    """The console script: runs a command and returns its exit status."""
    args = sys.argv[1:] if argv is None else argv
    # a bare --think is true and takes no value from the next word, as Ollama's (a level comes
    # with "=": --think=high)
    args = _go_bools(["--think=true" if a == "--think" else a for a in args])
    try:
        result = app(args=args, prog_name="ember", standalone_mode=False)
    except (KeyboardInterrupt, typer.Abort):
        return 130
    except TyperException as e:  # usage errors: one line, not click's box
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        print(f"Error: {message}", file=sys.stderr)
        return int(getattr(e, "exit_code", 2))
    except EmberError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


# the boolean flags, off unless given; and Go's words for true and false (strconv.ParseBool)
_BOOL_FLAGS = {"verbose", "nothink", "hidethinking", "nowordwrap", "insecure", "truncate"}
_BOOL_FLAGS |= {"license", "modelfile", "parameters", "template", "system"}
_TRUE, _FALSE = {"1", "t", "T", "TRUE", "true", "True"}, {"0", "f", "F", "FALSE", "false", "False"}


def _go_bools(args: list[str]) -> list[str]:
    """`--flag=false` and `--flag=true` as Go's flags take them (Ollama's own help says "Set
    --truncate=false"): the bare flag, or none (--no-truncate for truncate, unset otherwise)."""
    out = []
    for arg in args:
        name, eq, value = arg.partition("=")
        if not (
            eq and name.startswith("--") and name[2:] in _BOOL_FLAGS and value in _TRUE | _FALSE
        ):
            out.append(arg)
        elif value in _TRUE:
            out.append(name)
        elif name == "--truncate":
            out.append("--no-truncate")
    return out


def _version(value: bool) -> None:
    if value:
        print(f"ember version {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", "-v", is_eager=True, callback=_version, help="Show version"),
    ] = False,
) -> None:
    """Large language model runner."""


@app.command()
def serve() -> None:
    """Start the ember server."""
    from ember.cli.serve import serve as run_server

    raise typer.Exit(run_server())


app.command("start", hidden=True, help="Start the ember server.")(serve)  # Ollama's alias


@app.command(hidden=True)
def runner(
    model: Annotated[str, typer.Option("--model", help="path of the GGUF file")],
    port: Annotated[int, typer.Option("--port")],
    projector: Annotated[str | None, typer.Option("--projector", help="an mmproj GGUF")] = None,
) -> None:
    """Serve one model to the server (internal)."""
    from ember.runner.server import main as runner_main

    raise typer.Exit(runner_main(model, port, projector))


@app.command()
def run(
    model: Annotated[str, typer.Argument(help="model name")] = DEFAULT_MODEL,
    prompt: Annotated[list[str] | None, typer.Argument(help="prompt, else stdin or a REPL")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show timings for response")] = False,
    format: Annotated[
        str | None, typer.Option("--format", help="Response format: json, or a JSON schema")
    ] = None,
    keepalive: Annotated[str | None, typer.Option("--keepalive", help="e.g. 5m")] = None,
    think: Annotated[
        str | None,
        typer.Option("--think", help="Thinking: true, false, high, medium or low (--think=high)"),
    ] = None,
    nothink: Annotated[bool, typer.Option("--nothink", help="No thinking")] = False,
    hidethinking: Annotated[bool, typer.Option("--hidethinking")] = False,
    nowordwrap: Annotated[bool, typer.Option("--nowordwrap")] = False,
    insecure: Annotated[bool, typer.Option("--insecure", help="Use an insecure registry")] = False,
    truncate: Annotated[
        bool | None,
        typer.Option(help="Embedding models: cut an input past the context (else an error)"),
    ] = None,
    dimensions: Annotated[
        int, typer.Option(help="Embedding models: cut the vector to this many dimensions")
    ] = 0,
    temperature: Annotated[float | None, typer.Option(hidden=True)] = None,
    seed: Annotated[int | None, typer.Option(hidden=True)] = None,
    num_predict: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run a model: answer PROMPT (or stdin) once, or chat in a REPL."""
    options = {
        k: v
        for k, v in (("temperature", temperature), ("seed", seed), ("num_predict", num_predict))
        if v is not None
    }
    session = Session(
        model,
        options=options,
        format=_format(format),
        keep_alive=_keep_alive(keepalive),
        think=False if nothink else _think(think),
        hide_thinking=hidethinking,
        verbose=verbose,
        word_wrap=not nowordwrap and sys.stdout.isatty(),
    )
    with Client() as client:
        ensure_server(client)
        shown = commands.ensure_model(client, model, insecure=insecure)
        session.vision = has_vision(shown)
        text = _prompt_text(prompt or [])
        if "embedding" in (shown.get("capabilities") or []):
            body: dict[str, Any] = {"model": model, "input": text or ""}
            body |= {"truncate": truncate} if truncate is not None else {}
            body |= {"dimensions": dimensions} if dimensions > 0 else {}
            _embed_once(client, body | ({"keep_alive": keepalive} if keepalive else {}))
            return
        if text is None:
            from ember.cli.repl import Repl

            load_model(client, session)
            _print_history(shown.get("messages") or [], session.word_wrap)
            Repl(client, session).loop()
        elif text.strip():
            generate_once(client, session, text)
        else:
            client.request("POST", "/api/generate", {"model": model, "stream": False})


def _print_history(messages: list[dict[str, Any]], word_wrap: bool = False) -> None:
    """The model's own MESSAGEs, as Ollama's REPL shows them before its first prompt (an
    answer wrapped as a streamed one)."""
    for m in messages:
        if m.get("role") == "user":
            print(f">>> {m.get('content', '')}")
        elif m.get("role") == "assistant":
            WordWrap(sys.stdout, word_wrap).write(m.get("content", ""))
            print("\n")


def _embed_once(client: Client, body: dict[str, Any]) -> None:
    """An embedding model's run, as Ollama's: the input's vector printed as JSON."""
    if not body["input"].strip():
        usage = f'ember run {body["model"]} "your text here"'
        raise CLIError(f"embedding models require input text. Usage: {usage}")
    vectors = client.request("POST", "/api/embed", body).get("embeddings") or []
    if not vectors:
        raise CLIError("no embeddings returned")
    print(json.dumps(vectors[0], separators=(",", ":")))


def _format(value: str | None) -> str | dict[str, Any] | None:
    """--format as the API takes it: "json", or the JSON (a schema) given, as Ollama's."""
    if value is None or value == "json":
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise CLIError(f"invalid value for --format: not json nor a JSON schema ({e})") from None


def _keep_alive(value: str | None) -> str | None:
    """--keepalive as given ("" is unset), once Go's time.ParseDuration would take it, as
    Ollama's: "5" has no unit and is an error."""
    if not value:
        return None
    try:
        check_duration(value)
    except ValueError as e:
        raise CLIError(str(e)) from None
    return value


def _think(value: str | None) -> bool | str | None:
    """--think's value as the API takes it: `--think` alone is true, as Ollama's."""
    if value is None:
        return None
    level = value.strip().lower()
    if level in ("true", "false"):
        return level == "true"
    if level in ("high", "medium", "low", "max"):
        return level
    must = "must be true, false, high, medium, low, or max"
    raise CLIError(f'invalid value for --think: "{value}" ({must})')


def _prompt_text(words: list[str]) -> str | None:
    """The one-shot prompt: piped stdin then the arguments; None for an interactive session,
    which needs a terminal on both sides (output to a file or a pipe is quiet, as Ollama's)."""
    if not sys.stdin.isatty():
        piped = sys.stdin.read()
        return " ".join(p for p in (piped, *words) if p)
    if words or not sys.stdout.isatty():
        return " ".join(words)
    return None


@app.command()
def pull(
    model: str,
    insecure: Annotated[bool, typer.Option("--insecure")] = False,
) -> None:
    """Pull a model from a registry (bundled models install offline)."""
    with Client() as client:
        commands.pull(client, model, insecure=insecure)


@app.command()
def push(
    model: str,
    insecure: Annotated[bool, typer.Option("--insecure")] = False,
) -> None:
    """Push a model to a registry."""
    with Client() as client:
        commands.push(client, model, insecure=insecure)


@app.command()
def create(
    model: str,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Modelfile (default ./Modelfile)")
    ] = None,
    quantize: Annotated[str | None, typer.Option("--quantize", "-q")] = None,
) -> None:
    """Create a model from a Modelfile."""
    with Client() as client:
        commands.create(client, model, file, quantize=quantize)


@app.command("list")
def list_(prefix: Annotated[str, typer.Argument()] = "") -> None:
    """List models (those whose name starts with PREFIX)."""
    with Client() as client:
        print(commands.list_models(client, prefix))


app.command("ls", hidden=True)(list_)


@app.command()
def show(
    model: str,
    license: Annotated[bool, typer.Option("--license")] = False,
    modelfile: Annotated[bool, typer.Option("--modelfile")] = False,
    parameters: Annotated[bool, typer.Option("--parameters")] = False,
    template: Annotated[bool, typer.Option("--template")] = False,
    system: Annotated[bool, typer.Option("--system")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Show information for a model."""
    flags = {
        "license": license,
        "modelfile": modelfile,
        "parameters": parameters,
        "template": template,
        "system": system,
    }
    chosen = [name for name, on in flags.items() if on]
    if len(chosen) > 1:
        raise CLIError(
            "only one of '--license', '--modelfile', '--parameters', '--system', or "
            "'--template' can be specified"
        )
    with Client() as client:
        print(commands.show_part(client, model, chosen[0] if chosen else None, verbose=verbose))


@app.command()
def ps(prefix: Annotated[str, typer.Argument()] = "") -> None:
    """List running models (those whose name starts with PREFIX)."""
    with Client() as client:
        print(commands.list_running(client, prefix))


@app.command()
def stop(model: str) -> None:
    """Stop a running model."""
    with Client() as client:
        commands.stop(client, model)


@app.command()
def cp(source: str, destination: str) -> None:
    """Copy a model."""
    with Client() as client:
        client.request("POST", "/api/copy", {"source": source, "destination": destination})
    print(f"copied '{source}' to '{destination}'")


@app.command()
def rm(models: Annotated[list[str], typer.Argument(help="models to delete")]) -> None:
    """Remove models."""
    with Client() as client:
        for name in models:
            commands.unload(client, name)
            client.request("DELETE", "/api/delete", {"model": name})
            print(f"deleted '{name}'")


if __name__ == "__main__":
    sys.exit(main())
