"""The `ember` commands as a user runs them, against a fake Ollama-API server (real model routes,
fake generation): outputs, one-line errors and exit codes."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_support import Ember, one_line_error
from fake_server import FakeServer


def write_modelfile(folder: Path, gguf: Path, extra: str = "") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "tiny.gguf").write_bytes(gguf.read_bytes())
    path = folder / "Modelfile"
    path.write_text(
        "FROM ./tiny.gguf\nSYSTEM You are terse.\nPARAMETER temperature 0.3\n"
        "PARAMETER stop <|im_end|>\n" + extra
    )
    return path


def test_version(ember: Ember) -> None:
    result = ember("--version")
    assert result.returncode == 0 and result.stdout.startswith("ember version ")


def test_create_list_show_copy_remove(ember: Ember, tmp_path: Path, tiny_gguf: Path) -> None:
    modelfile = write_modelfile(tmp_path / "work", tiny_gguf)
    created = ember("create", "tiny", "-f", str(modelfile))
    assert created.returncode == 0, created.stderr
    assert "success" in created.stderr and "writing manifest" in created.stderr
    listed = ember("list")
    assert listed.stdout.splitlines()[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert listed.stdout.splitlines()[1].startswith("tiny:latest ")
    shown = ember("show", "tiny")
    assert shown.returncode == 0, shown.stderr
    assert "architecture        llama" in shown.stdout
    assert "completion" in shown.stdout and "temperature" in shown.stdout
    assert ember("show", "tiny", "--system").stdout.strip() == "You are terse."
    verbose = ember("show", "tiny", "-v").stdout  # as Ollama's: the metadata and tensors too
    assert "  Metadata" in verbose and "general.architecture" in verbose
    assert "  Tensors" in verbose and "token_embd.weight" in verbose
    assert "Metadata" not in shown.stdout
    assert "FROM " in ember("show", "tiny", "--modelfile").stdout
    copied = ember("cp", "tiny", "tiny:two")
    assert copied.stdout.strip() == "copied 'tiny' to 'tiny:two'"
    removed = ember("rm", "tiny", "tiny:two")
    assert removed.returncode == 0
    assert removed.stdout.splitlines() == ["deleted 'tiny'", "deleted 'tiny:two'"]
    assert len(ember("ls").stdout.splitlines()) == 1


def test_create_from_a_relative_path_in_the_modelfiles_folder(
    ember: Ember, tmp_path: Path, tiny_gguf: Path
) -> None:
    write_modelfile(tmp_path / "work", tiny_gguf)
    created = ember("create", "tiny", cwd=tmp_path / "work")  # -f defaults to ./Modelfile
    assert created.returncode == 0, created.stderr


def test_create_from_a_folder_of_a_gguf_file(ember: Ember, tmp_path: Path, tiny_gguf: Path) -> None:
    """As Ollama's filesForModel: a folder without safetensors weights gives its GGUF files."""
    write_modelfile(tmp_path / "work", tiny_gguf)
    (tmp_path / "work" / "Modelfile").write_text("FROM .\n")
    created = ember("create", "tiny", cwd=tmp_path / "work")
    assert created.returncode == 0, created.stderr
    # without a Modelfile at all, as Ollama's create: the folder's weights (FROM .)
    (tmp_path / "work" / "Modelfile").unlink()
    created = ember("create", "tiny2", cwd=tmp_path / "work")
    assert created.returncode == 0, created.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "Modelfile").write_text("FROM .\n")
    refused = ember("create", "x", cwd=tmp_path / "empty")
    assert refused.returncode != 0 and one_line_error(refused.stderr)
    assert "the folder has no .safetensors or .gguf files" in refused.stderr


def test_errors_are_one_line_and_nonzero(ember: Ember, tmp_path: Path, tiny_gguf: Path) -> None:
    bad = tmp_path / "Bad"
    bad.write_text("PARAMETER temperature hot\n")
    cases = [
        (ember("show", "nope"), "model 'nope:latest' not found"),
        (ember("rm", "nope"), "not found"),
        (ember("cp", "nope", "other"), "not found"),
        (ember("create", "x", "-f", str(tmp_path / "missing")), "cannot read"),
        (ember("create", "x", "-f", str(bad)), ""),
        (ember("show", "bad name!"), "invalid model name"),
        (ember("nosuchcommand"), "No such command"),
        (ember("run", str(tmp_path / "bad.gguf"), "hello"), "invalid model name"),
        (ember("run", "tiny", "--temperature", "hot"), "Invalid value"),
    ]
    for result, text in cases:
        assert result.returncode != 0
        assert one_line_error(result.stderr), result.stderr
        assert text in result.stderr


def test_a_modelfile_from_a_file_that_is_not_gguf(ember: Ember, tmp_path: Path) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"junk")
    (tmp_path / "Modelfile").write_text("FROM ./junk.gguf\n")
    result = ember("create", "junk", "-f", str(tmp_path / "Modelfile"))
    assert result.returncode == 1 and "not in GGUF format" in result.stderr


def test_run_with_a_prompt_answers_once(ember: Ember, fake: FakeServer, tiny_gguf: Path) -> None:
    result = ember("run", "tiny", "Why", "is", "the", "sky", "blue?", "--verbose")
    assert result.returncode == 0, result.stderr
    assert "You said: Why is the sky blue?" in result.stdout
    assert "eval rate:            50.00 tokens/s" in result.stderr
    assert "pulling manifest" in result.stderr  # the model was missing: run pulled it
    assert fake.bodies("/api/generate")[-1]["prompt"] == "Why is the sky blue?"


def test_text_that_is_not_utf8_is_sent_with_replacements(ember: Ember, fake: FakeServer) -> None:
    """A Latin-1 argument (its byte 0xE9 reaches Python as a surrogate) is sent with U+FFFD, as
    Ollama's Go client sends it: no traceback."""
    result = ember("run", "tiny", "caf\udce9 latin1")
    assert result.returncode == 0, result.stderr
    assert fake.bodies("/api/generate")[-1]["prompt"] == "caf\ufffd latin1"


def test_run_keepalive_is_sent_as_given_and_empty_is_unset(ember: Ember, fake: FakeServer) -> None:
    assert ember("run", "tiny", "--keepalive", "10m", "hi").returncode == 0
    assert fake.bodies("/api/generate")[-1]["keep_alive"] == "10m"
    assert ember("run", "tiny", "--keepalive", "", "hi").returncode == 0
    assert "keep_alive" not in fake.bodies("/api/generate")[-1]


def test_run_think_takes_a_level_or_stands_alone(ember: Ember, fake: FakeServer) -> None:
    # as Ollama's: --think alone is true and leaves the next word to the prompt; a level
    # comes with "="; --nothink is false
    levels = [(["--think", "hi"], True), (["--think=high", "hi"], "high")]
    for flags, think in [*levels, (["--think=max", "hi"], "max")]:
        result = ember("run", "tiny", *flags)
        assert result.returncode == 0, result.stderr
        assert fake.bodies("/api/generate")[-1]["think"] == think
        assert fake.bodies("/api/generate")[-1]["prompt"] == "hi"
    assert ember("run", "tiny", "--nothink", "hi").returncode == 0
    assert fake.bodies("/api/generate")[-1]["think"] is False
    result = ember("run", "tiny", "--think=maybe", "hi")
    assert result.returncode != 0 and one_line_error(result.stderr)
    must = "(must be true, false, high, medium, low, or max)"
    assert f'invalid value for --think: "maybe" {must}' in result.stderr


def test_run_of_an_embedding_model_prints_the_vector(ember: Ember, fake: FakeServer) -> None:
    # as Ollama's: the input's embedding as JSON, with --truncate and --dimensions
    fake.embedders.add("tiny")
    result = ember("run", "tiny", "some", "text", "--dimensions", "3", "--no-truncate")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0.5,0.5,0.5]"
    body = fake.bodies("/api/embed")[-1]
    assert body == {"model": "tiny", "input": "some text", "truncate": False, "dimensions": 3}
    # Go's flag forms too, as Ollama's help says: "Set --truncate=false"
    for flag, truncate in (("--truncate=false", False), ("--truncate=true", True)):
        assert ember("run", "tiny", "some", "text", flag).returncode == 0
        assert fake.bodies("/api/embed")[-1]["truncate"] is truncate
    assert not fake.bodies("/api/generate")
    result = ember("run", "tiny", stdin="")
    assert result.returncode != 0 and one_line_error(result.stderr)
    assert "embedding models require input text" in result.stderr


def test_start_is_an_alias_of_serve(ember: Ember) -> None:
    assert "Start the ember server" in ember("start", "--help").stdout


def test_run_reads_a_piped_prompt(ember: Ember, fake: FakeServer) -> None:
    result = ember("run", "tiny", "--temperature", "0", stdin="question from a pipe\n")
    assert result.returncode == 0, result.stderr
    assert "You said: question from a pipe (temperature 0.0)" in result.stdout
    assert "eval rate" not in result.stderr


def test_run_without_a_model_uses_smollm2(ember: Ember, fake: FakeServer) -> None:
    result = ember("run", stdin="hi")
    assert result.returncode == 0, result.stderr
    assert fake.bodies("/api/pull")[0]["model"] == "smollm2:135m"
    assert fake.bodies("/api/generate")[-1]["model"] == "smollm2:135m"


def test_run_of_a_model_that_cannot_be_pulled(ember: Ember, fake: FakeServer) -> None:
    fake.gguf = None
    result = ember("run", "nosuchmodel:7b", "hello")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "Error: pull model manifest: file does not exist"
    assert "Traceback" not in result.stderr


def test_ps_and_stop(ember: Ember, fake: FakeServer) -> None:
    assert ember("run", "tiny", "hi").returncode == 0
    ember("run", "tiny", stdin="")  # an empty prompt loads the model
    listed = ember("ps").stdout.splitlines()
    header = ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", "SLOTS", "KV CACHE"]
    assert re.split(r"\s{4,}", listed[0]) == header  # Ollama's columns four spaces apart
    assert listed[1].startswith("tiny ") and "100% CPU" in listed[1]
    # context, until, then Ember's own: slots in use and the KV cache type
    assert listed[1].split()[6:10] == ["4096", "Forever", "1/4", "q8_0"]
    assert ember("ps", "ti").stdout == ember("ps").stdout  # a name prefix, as Ollama's
    assert len(ember("ps", "other").stdout.splitlines()) == 1
    assert ember("stop", "tiny").returncode == 0
    assert fake.bodies("/api/generate")[-1] == {"model": "tiny", "keep_alive": 0}
    assert len(ember("ps").stdout.splitlines()) == 1
    stopped = ember("stop", "other")
    assert stopped.returncode == 1 and 'couldn\'t find model "other"' in stopped.stderr
    assert ember("stop", "tiny").returncode == 0  # stored, not running: as Ollama, no error


def test_rm_of_a_running_model_stops_it_first(ember: Ember, fake: FakeServer) -> None:
    """As Ollama's: a deleted model must not hold its memory until its keep_alive ends."""
    ember("run", "tiny", stdin="")  # an empty prompt loads the model
    assert ember("rm", "tiny").returncode == 0
    assert fake.bodies("/api/generate")[-1] == {"model": "tiny", "keep_alive": 0}
    assert len(ember("ps").stdout.splitlines()) == 1


def test_run_format_takes_json_or_a_schema(ember: Ember, fake: FakeServer) -> None:
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    for given, sent in (("json", "json"), (schema, json.loads(schema))):
        result = ember("run", "tiny", "--format", given, "give a")
        assert result.returncode == 0, result.stderr
        assert fake.bodies("/api/generate")[-1]["format"] == sent
    result = ember("run", "tiny", "--format", "xml", "give a")
    assert result.returncode != 0 and one_line_error(result.stderr)
    assert "invalid value for --format" in result.stderr


def test_pull_shows_progress(ember: Ember, tiny_gguf: Path) -> None:
    result = ember("pull", "some/model:1")
    assert result.returncode == 0, result.stderr
    assert "pulling manifest" in result.stderr and "success" in result.stderr
    assert "some/model:1" in ember("list").stdout


def test_no_server_is_a_clear_error(tmp_path: Path) -> None:
    import socket
    import subprocess

    from cli_support import EMBER, cli_env

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # a port nobody listens on
    result = subprocess.run(
        [*EMBER, "list"],
        text=True,
        capture_output=True,
        timeout=60,
        env=cli_env(tmp_path, f"127.0.0.1:{port}"),
    )
    assert result.returncode == 1
    assert one_line_error(result.stderr)
    assert "could not connect to ember server" in result.stderr


def test_push_to_a_loopback_registry(
    ember: Ember, tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "store"))
    from registry_server import RegistryServer

    with RegistryServer(tmp_path / "registry") as registry:
        host = registry.url.removeprefix("http://")
        modelfile = write_modelfile(tmp_path / "work", tiny_gguf)
        refused = ember("push", "--insecure", f"{host}/me/tiny:v1")  # not in EMBER_REGISTRIES
        assert refused.returncode == 1 and one_line_error(refused.stderr)
        assert "is not allowed" in refused.stderr
        monkeypatch.setenv("EMBER_REGISTRIES", host)  # read by the fake server, in this process
        assert ember("create", f"{host}/me/tiny:v1", "-f", str(modelfile)).returncode == 0
        refused = ember("push", f"{host}/me/tiny:v1")  # https by default: the registry is http
        assert refused.returncode == 1 and one_line_error(refused.stderr.splitlines()[-1] + "\n")
        pushed = ember("push", "--insecure", f"{host}/me/tiny:v1")
        assert pushed.returncode == 0, pushed.stderr
        assert "pushing manifest" in pushed.stderr and "success" in pushed.stderr
        assert ("me", "tiny", "v1") in registry.manifests


def test_show_prints_two_lines_of_system_and_license_then_an_ellipsis() -> None:
    """As Ollama's `show` (its head(s, 2)): blank lines skipped, "..." when more follow."""
    from ember.cli.commands import format_show

    shown = {"system": "You are a pirate.\n\nSpeak in rhymes.", "license": "one\ntwo\n three\n"}
    text = format_show(shown)
    system = text.split("  System\n", 1)[1].split("\n\n", 1)[0]
    assert system.split() == ["You", "are", "a", "pirate.", "Speak", "in", "rhymes."]
    assert text.split("  License\n", 1)[1].split() == ["one", "two", "..."]


def test_show_verbose_prints_metadata_and_requires_as_ollamas_show() -> None:
    """Go's %t and %g (JSON numbers are float64 there), null as <nil>, a list as what fits in
    10 columns; the requires row after quantization."""
    from ember.cli.commands import format_show

    info = {
        "general.languages": ["en"],
        "a.add_bos_token": False,
        "a.freq_base": 100000.0,
        "a.count": 134515008,
        "a.tokens": None,
        "a.ids": list(range(2000)),
    }
    text = format_show({"model_info": info, "requires": "0.14.0"}, verbose=True)
    lines = [line.split(None, 1) for line in text.splitlines() if "." in line]
    rows = {key: value.rstrip() for key, value in lines}
    assert rows == {
        "general.languages": "[en]",
        "a.add_bos_token": "false",
        "a.freq_base": "100000",
        "a.count": "1.34515008e+08",
        "a.tokens": "<nil>",
        "a.ids": "[0 1 2 ...+1997 more]",
        "requires": "0.14.0",
    }


@pytest.mark.parametrize(
    ("size", "shown"),
    [(475_850_312, "475 MB"), (999_600_000, "999 MB"), (5_500_000, "5.5 MB"), (1_500, "1.5 KB"),
     (1_000_000_000, "1 GB"), (1_990_000_000, "2.0 GB"), (1_940_000_000, "1.9 GB"),
     (1_999_999_999_999, "2.0 TB"), (999, "999 B")],
)  # fmt: skip
def test_sizes_as_ollamas_human_bytes(size: int, shown: str) -> None:
    from ember.cli.commands import human_bytes

    assert human_bytes(size) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(-30.5, "30 seconds from now"), (-5400, "About an hour from now"),
     (-3599.5, "59 minutes from now"), (-86400, "24 hours from now"),
     (0.2, "Less than a second ago"), (70, "About a minute ago"), (3 * 86400, "3 days ago"),
     (20 * 86400, "2 weeks ago"), (-30 * 365 * 86400, "Forever")],
)  # fmt: skip
def test_times_as_ollamas_human_time(seconds: float, shown: str) -> None:
    from datetime import UTC, datetime, timedelta

    from ember.cli.commands import human_time

    then = datetime.now(UTC) - timedelta(seconds=seconds)
    assert human_time(then.isoformat()) == shown


@pytest.mark.parametrize(
    ("ns", "shown"),
    [(0, "0s"), (999, "999ns"), (1500, "1.5µs"), (100_000, "100µs"), (271_006_000, "271.006ms"),
     (5_000_000_000, "5s"), (66_907_794_100, "1m6.9077941s"), (3_600_000_000_000, "1h0m0s")],
)  # fmt: skip
def test_verbose_durations_as_go_prints_them(ns: int, shown: str) -> None:
    from ember.cli.chat import go_duration

    assert go_duration(ns) == shown


def test_verbose_leaves_out_what_is_zero_as_ollamas_summary() -> None:
    import io

    from ember.cli.chat import print_timings

    out = io.StringIO()
    print_timings({"total_duration": 271_006_000, "prompt_eval_count": 10, "eval_count": 0}, out)
    assert out.getvalue() == "total duration:       271.006ms\nprompt eval count:    10 token(s)\n"


def test_rm_stops_its_model_at_best(capsys) -> None:
    """As Ollama's: a stop that fails is a warning and the delete goes on; a server that
    answers /api/ps with nothing is no crash."""
    from ember.cli.client import CLIError
    from ember.cli.commands import unload

    class Failing:
        def request(self, method: str, path: str, body: object = None) -> object:
            raise CLIError("boom")

    class Empty:
        def request(self, method: str, path: str, body: object = None) -> object:
            return None

    unload(Failing(), "tiny")  # type: ignore[arg-type]
    assert capsys.readouterr().err == "Warning: unable to stop model 'tiny'\n"
    unload(Empty(), "tiny")  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""


DETAILS = {"family": "test", "parameter_size": "7B", "quantization_level": "FP16"}
BARE = (
    "  Model\n    architecture    test    \n    parameters      7B      \n"
    "    quantization    FP16    \n\n"
)


@pytest.mark.parametrize(
    ("shown", "verbose", "expected"),
    [
        ({"details": DETAILS}, False, BARE),
        (
            {
                "details": DETAILS,
                "model_info": {
                    "general.architecture": "test",
                    "general.parameter_count": 7_000_000_000,
                    "test.context_length": 0,
                    "test.embedding_length": 0,
                },
            },
            False,
            "  Model\n    architecture        test    \n    parameters          7B      \n"
            "    context length      0       \n    embedding length    0       \n"
            "    quantization        FP16    \n\n",
        ),
        (
            {
                "details": {**DETAILS, "parameter_size": "8B"},
                "parameters": "\n\t\t\tstop up",
                "model_info": {
                    "general.architecture": "test",
                    "general.parameter_count": 8_000_000_000,
                    "some.true_bool": True,
                    "some.false_bool": False,
                    "test.context_length": 1000,
                    "test.embedding_length": 11434,
                },
                "tensors": [
                    {"name": "blk.0.attn_k.weight", "type": "BF16", "shape": [42, 3117]},
                    {"name": "blk.0.attn_q.weight", "type": "FP16", "shape": [3117, 42]},
                ],
            },
            True,
            "  Model\n    architecture        test     \n    parameters          8B       \n"
            "    context length      1000     \n    embedding length    11434    \n"
            "    quantization        FP16     \n\n"
            "  Parameters\n    stop    up    \n\n"
            "  Metadata\n    general.architecture       test     \n"
            "    general.parameter_count    8e+09    \n    some.false_bool            false    \n"
            "    some.true_bool             true     \n    test.context_length        1000     \n"
            "    test.embedding_length      11434    \n\n"
            "  Tensors\n    blk.0.attn_k.weight    BF16    [42 3117]    \n"
            "    blk.0.attn_q.weight    FP16    [3117 42]    \n\n",
        ),
        (
            {
                "details": DETAILS,
                "projector_info": {
                    "general.architecture": "clip",
                    "general.parameter_count": 133_700_000,
                    "clip.vision.embedding_length": 0,
                    "clip.vision.projection_dim": 0,
                },
            },
            False,
            BARE + "  Projector\n    architecture        clip       \n"
            "    parameters          133.70M    \n    embedding length    0          \n"
            "    dimensions          0          \n\n",
        ),
        (
            {"details": DETAILS, "system": "You are a pirate!\nAhoy, matey!\nWeigh anchor!\n\t"},
            False,
            BARE + "  System\n    You are a pirate!    \n    Ahoy, matey!         \n"
            "    ...                  \n\n",
        ),
        (
            {"details": DETAILS, "capabilities": ["vision", "tools"]},
            False,
            BARE + "  Capabilities\n    vision    \n    tools     \n\n",
        ),
    ],
)
def test_show_prints_ollamas_tables(shown: dict[str, Any], verbose: bool, expected: str) -> None:
    """Ollama's cmd_test.go TestShowInfo cases, byte for byte."""
    from ember.cli.commands import format_show

    assert format_show(shown, verbose=verbose) == expected


@pytest.mark.parametrize(
    ("thought", "printed"),
    [
        ("a plan", "Thinking...\na plan\n...done thinking.\n\nHi!\n\n"),
        ("a plan\n", "Thinking...\na plan\n...done thinking.\n\nHi!\n\n"),  # no blank line more
    ],
)
def test_run_prints_thinking_and_the_answer_as_ollamas(thought: str, printed: str) -> None:
    """As Ollama's generate: the closing line on a line of its own, two newlines at the end
    (a terminal or not)."""
    import io

    from ember.cli.chat import Session, _print_stream

    class Streamed:
        def stream(self, path: str, body: object) -> list[dict[str, object]]:
            return [{"thinking": thought}, {"response": "Hi!"}, {"response": "", "done": True}]

    out = io.StringIO()
    _print_stream(Streamed(), "/api/generate", {}, Session("tiny"), out)  # type: ignore[arg-type]
    assert out.getvalue() == printed


def test_run_without_a_terminal_for_its_output_is_not_interactive(monkeypatch) -> None:
    """As Ollama's: `ember run m > out.txt` loads the model and ends, no REPL in the file."""
    import sys

    from ember.cli.app import _prompt_text

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert _prompt_text([]) == ""
    assert _prompt_text(["hi", "there"]) == "hi there"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert _prompt_text([]) is None  # a terminal on both sides: the REPL


def test_the_repl_starts_with_the_models_own_messages(capsys) -> None:
    from ember.cli.app import _print_history

    _print_history([{"role": "user", "content": "Is the sky blue?"},
                    {"role": "assistant", "content": "Yes, it is."}])  # fmt: skip
    assert capsys.readouterr().out == ">>> Is the sky blue?\nYes, it is.\n\n"


def test_run_keepalive_must_be_a_go_duration(ember: Ember, fake: FakeServer) -> None:
    """As Ollama's time.ParseDuration, before anything is asked of the server."""
    for given, error in [
        ("5", 'time: missing unit in duration "5"'),
        ("5x", 'time: unknown unit "x" in duration "5x"'),
        ("soon", 'time: invalid duration "soon"'),
    ]:
        result = ember("run", "tiny", "--keepalive", given, "hi")
        assert result.returncode == 1 and result.stderr == f"Error: {error}\n"
    assert fake.requests == []


def test_show_takes_one_part_at_a_time(ember: Ember) -> None:
    result = ember("show", "tiny", "--license", "--system")
    assert result.returncode == 1
    assert result.stderr == (
        "Error: only one of '--license', '--modelfile', '--parameters', '--system', or "
        "'--template' can be specified\n"
    )


@pytest.fixture
def repl_run(fake: FakeServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`ember run` in this process as in a terminal, its REPL replaced: the models it opened."""
    from ember.cli import app, repl

    monkeypatch.setenv("EMBER_HOST", fake.url)
    monkeypatch.setattr(app, "_prompt_text", lambda words: None)  # a terminal on both sides
    opened: list[str] = []

    class NoRepl:
        def __init__(self, client: object, session: Any) -> None:
            self.session = session

        def loop(self) -> None:
            opened.append(self.session.model)

    monkeypatch.setattr(repl, "Repl", NoRepl)
    return opened


def test_run_loads_with_think_and_keepalive_before_the_repl(
    fake: FakeServer, repl_run: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """As Ollama's loadOrUnloadModel: a model that cannot think fails before the REPL opens."""
    from ember.cli.app import main

    assert main(["run", "tiny", "--think"]) == 1
    assert capsys.readouterr().err.endswith('Error: "tiny" does not support thinking\n')
    assert repl_run == []
    assert main(["run", "tiny", "--keepalive", "5m"]) == 0
    loaded = {"model": "tiny", "stream": False}
    assert fake.bodies("/api/generate")[-1] == loaded | {"keep_alive": "5m"}
    fake.thinkers.add("tiny")
    assert main(["run", "tiny", "--think=high"]) == 0
    assert fake.bodies("/api/generate")[-1] == loaded | {"think": "high"}
    assert repl_run == ["tiny", "tiny"]
