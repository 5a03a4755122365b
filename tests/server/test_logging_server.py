"""Server log lines in Ollama's slog text form."""

import io
import logging
import re
from collections.abc import Iterator

import pytest

from ember import envconfig
from ember.server.logging import (
    format_line,
    format_value,
    log_startup,
    setup_logging,
    system_info,
)

LINE = re.compile(
    r"time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(\w+) source=([\w.]+:\d+) msg=(.*)"
)


def test_line_layout() -> None:
    line = format_line(1795860000.25, "INFO", "routes.py:12", "Listening on x", {"port": 11434})
    assert line == (
        'time=2026-11-28T10:00:00.250Z level=INFO source=routes.py:12 msg="Listening on x" '
        "port=11434"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ("", '""'),
        ("a=b", '"a=b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("line\nbreak", '"line\\nbreak"'),
        (True, "true"),
        (None, "<nil>"),
        (1.5, "1.5"),
    ],
)
def test_values_quoted_as_slog_does(value: object, text: str) -> None:
    assert format_value(value) == text


@pytest.fixture
def output() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)


def test_records_become_lines_with_extra_attrs(output: io.StringIO) -> None:
    setup_logging(logging.INFO, output)
    log = logging.getLogger("ember.server.test")
    log.info("model loaded", extra={"model": "smollm2:135m", "duration": "1.2s"})
    log.warning("slow")
    log.debug("hidden at INFO")
    lines = output.getvalue().splitlines()
    assert len(lines) == 2
    match = LINE.fullmatch(lines[0])
    assert match is not None
    assert match.group(1) == "INFO"
    assert match.group(2).startswith("test_logging_server.py:")
    assert match.group(3) == '"model loaded" model=smollm2:135m duration=1.2s'
    assert " level=WARN " in lines[1]


def test_exceptions_are_one_line_with_an_error_attr(output: io.StringIO) -> None:
    setup_logging(logging.INFO, output)
    try:
        raise ValueError("bad thing")
    except ValueError:
        logging.getLogger("ember").exception("failed")
    (line,) = output.getvalue().splitlines()
    assert line.endswith('msg=failed error="ValueError: bad thing"')


def test_ember_debug_sets_the_level(output: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DEBUG", "1")
    setup_logging(stream=output)
    logging.getLogger("ember").debug("now shown")
    assert "level=DEBUG" in output.getvalue()
    monkeypatch.setenv("EMBER_DEBUG", "2")
    setup_logging(stream=output)
    logging.getLogger("ember").log(envconfig.TRACE, "trace")
    assert "level=TRACE" in output.getvalue()


def test_setup_twice_keeps_one_handler(output: io.StringIO) -> None:
    setup_logging(logging.INFO, output)
    setup_logging(logging.INFO, output)
    logging.getLogger("ember").info("once")
    assert output.getvalue().count("msg=once") == 1


def test_startup_lines(output: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_API_KEY", "topsecret")
    setup_logging(logging.INFO, output)
    log_startup(logging.getLogger("ember"), address="127.0.0.1:11434", version="0.1.0")
    text = output.getvalue()
    assert 'msg="Listening on 127.0.0.1:11434 (version 0.1.0)"' in text
    assert "EMBER_API_KEY:(set)" in text and "topsecret" not in text
    info = system_info("cpu")
    for key in ("cpus", "total_memory", "available_memory", "torch", "device"):
        assert f" {key}=" in text, key
    assert int(info["cpus"]) >= 1 and info["total_memory"].endswith("GiB")
    (line,) = [ln for ln in text.splitlines() if "msg=\"system info\"" in ln]
    assert " kernels=" in line and " cpu=" in line and " threads=" in line
