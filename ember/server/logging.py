"""Server logs in Ollama's form (Go slog text): `time=... level=INFO source=file.py:12 msg="..."
key=value`, one line a record; the level from EMBER_DEBUG; the startup lines."""

import json
import logging
import os
import platform
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from typing import Any, TextIO

import psutil

from ember import envconfig
from ember.backend import native

_LEVEL_NAMES = {
    envconfig.TRACE: "TRACE",
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARN",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "ERROR",
}
# attributes every LogRecord has: the rest came in through `extra=` and are printed as key=value
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def format_value(value: Any) -> str:
    """A value as slog prints it: bare when it can be, else quoted with escapes."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "<nil>"
    else:
        text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' "='):
        return text
    return json.dumps(text, ensure_ascii=False)


def format_line(
    record_time: float, level: str, source: str, msg: str, attrs: Mapping[str, Any]
) -> str:
    """One log line: time in UTC with milliseconds, then level, source, msg and attrs."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record_time))
    millis = int(record_time * 1000) % 1000
    parts = [f"time={stamp}.{millis:03d}Z", f"level={level}", f"source={source}"]
    parts.append(f"msg={format_value(msg)}")
    parts += [f"{key}={format_value(value)}" for key, value in attrs.items()]
    return " ".join(parts)


class SlogFormatter(logging.Formatter):
    """Formats records as Ollama's slog lines; `extra={...}` items become key=value pairs."""

    def format(self, record: logging.LogRecord) -> str:
        attrs = {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS}
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            attrs["error"] = f"{type(err).__name__}: {err}"
        level = _LEVEL_NAMES.get(record.levelno, record.levelname)
        source = f"{record.filename}:{record.lineno}"
        return format_line(record.created, level, source, record.getMessage(), attrs)


def setup_logging(level: int | None = None, stream: TextIO | None = None) -> None:
    """Sends every log record (Ember's and uvicorn's, when uvicorn runs with log_config=None)
    through one SlogFormatter handler at level (default: envconfig.log_level())."""
    logging.addLevelName(envconfig.TRACE, "TRACE")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(SlogFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h.formatter, SlogFormatter)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(envconfig.log_level() if level is None else level)


def system_info(device: str = "cpu") -> dict[str, str]:
    """What the machine offers, for the startup line. device: as the backend describes it
    (the server passes it; only backend/ asks torch about accelerators). torch is not
    imported: the server process has no use for it."""
    memory = psutil.virtual_memory()
    return {
        "os": f"{platform.system().lower()}/{platform.machine().lower()}",
        "cpus": str(os.cpu_count() or 0),
        "total_memory": _gib(memory.total),
        "available_memory": _gib(memory.available),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "device": device,
    }


def log_startup(logger: logging.Logger, *, address: str, version: str, device: str = "cpu") -> None:
    """Ollama's startup lines: the settings, the address listened on, the compute found, and
    the CPU path (as llama.cpp's system info once its backend is up): the native kernels' ISA
    (or why none), the CPU features seen, the threads."""
    logger.info("server config", extra={"env": _settings_text()})
    logger.info(f"Listening on {address} (version {version})")
    logger.info("inference compute", extra=system_info(device))
    logger.info("system info", extra=native.system_info_fields())


def _settings_text() -> str:
    # as Go prints a map: map[KEY:value KEY:value]
    items = " ".join(f"{k}:{v}" for k, v in envconfig.server_settings().items())
    return f"map[{items}]"


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"
