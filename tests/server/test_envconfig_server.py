"""The server's EMBER_* settings and the duration forms of keep_alive."""

import logging
import math
import socket

import pytest

from ember import envconfig
from ember.envconfig import FOREVER, HostAddress, parse_duration, parse_host, parse_keep_alive
from ember.errors import OptionsError

HOSTS = [
    # (EMBER_HOST, scheme, host, port) as Ollama's envconfig.Host test table
    ("", "http", "127.0.0.1", 11434),
    ("1.2.3.4", "http", "1.2.3.4", 11434),
    (":1234", "http", "", 1234),
    ("1.2.3.4:1234", "http", "1.2.3.4", 1234),
    ("example.com", "http", "example.com", 11434),
    ("example.com:1234", "http", "example.com", 1234),
    ("0.0.0.0", "http", "0.0.0.0", 11434),
    ("0.0.0.0:1234", "http", "0.0.0.0", 1234),
    ("::", "http", "::", 11434),
    ("[::]:1234", "http", "::", 1234),
    ("::1", "http", "::1", 11434),
    ("[::1]:1234", "http", "::1", 1234),
    ("http://example.com", "http", "example.com", 80),
    ("https://example.com", "https", "example.com", 443),
    ("https://example.com:8443", "https", "example.com", 8443),
    ("  '127.0.0.1:5000'  ", "http", "127.0.0.1", 5000),
]


@pytest.mark.parametrize(("text", "scheme", "host", "port"), HOSTS)
def test_host_forms_parse_as_ollama(text: str, scheme: str, host: str, port: int) -> None:
    address = parse_host(text)
    assert (address.scheme, address.host, address.port) == (scheme, host, port)


def test_host_keeps_path_and_writes_ipv6_in_brackets() -> None:
    assert parse_host("http://[::1]:9/base").url == "http://[::1]:9/base"
    assert parse_host("::1").hostport == "[::1]:11434"


def test_host_with_a_bad_port_is_an_error() -> None:
    with pytest.raises(OptionsError, match="port"):
        parse_host("localhost:99999")
    with pytest.raises(OptionsError, match="port"):
        parse_host("localhost:http")


@pytest.mark.parametrize(
    ("host", "is_loopback"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("", False)],
)
def test_loopback_hosts(host: str, is_loopback: bool) -> None:
    assert HostAddress("http", host, 1).is_loopback is is_loopback


def test_host_reads_ember_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_HOST", raising=False)
    assert envconfig.host().url == "http://127.0.0.1:11434"
    monkeypatch.setenv("EMBER_HOST", "0.0.0.0:8080")
    assert envconfig.host().hostport == "0.0.0.0:8080"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("300ms", 0.3),
        ("2h45m30.5s", 9930.5),
        ("-1h", -3600.0),
        (".5m", 30.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "m", "5 m", "1d", "5m-3s", "--1s", "forever"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (2.5, 2.5),
        (-1, FOREVER),
        (-0.5, FOREVER),
        ("5m", 300.0),
        ("-1", FOREVER),
        ("-1m", FOREVER),
        ("0", 0.0),
        ("120", 120.0),  # digits alone: seconds (Go would want a unit)
    ],
)
def test_keep_alive_values(value: str | float, seconds: float) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", [True, "soon", math.nan, "1x"])
def test_bad_keep_alive_values(value: str | float) -> None:
    with pytest.raises(ValueError):
        parse_keep_alive(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(300, "5m0s"), (5400, "1h30m0s"), (1.5, "1.5s"), (0, "0s"), (FOREVER, "forever")],
)
def test_durations_print_as_go_does(seconds: float, text: str) -> None:
    assert envconfig.format_duration(seconds) == text


DEFAULTED = [
    "EMBER_KEEP_ALIVE",
    "EMBER_LOAD_TIMEOUT",
    "EMBER_CONTEXT_LENGTH",
    "EMBER_NUM_PARALLEL",
    "EMBER_MAX_LOADED_MODELS",
    "EMBER_MAX_QUEUE",
    "EMBER_API_KEY",
    "EMBER_ORIGINS",
    "EMBER_FLASH_ATTENTION",
    "EMBER_KV_CACHE_TYPE",
    "EMBER_DEBUG",
    "EMBER_NOPRUNE",
]


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in DEFAULTED:
        monkeypatch.delenv(name, raising=False)
    assert envconfig.keep_alive() == 300.0
    assert envconfig.load_timeout() == 300.0
    assert envconfig.context_length() == 4096
    assert envconfig.num_parallel() == 0
    assert envconfig.max_loaded_models() == 0
    assert envconfig.max_queue() == 512
    assert envconfig.api_key() is None
    assert envconfig.flash_attention() is None
    assert envconfig.kv_cache_type() == ""
    assert envconfig.log_level() == logging.INFO
    assert envconfig.no_prune() is False


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_KEEP_ALIVE", "-1")
    monkeypatch.setenv("EMBER_LOAD_TIMEOUT", "0")
    monkeypatch.setenv("EMBER_CONTEXT_LENGTH", "8192")
    monkeypatch.setenv("EMBER_MAX_QUEUE", '"16"')  # quotes are trimmed, as Ollama's Var
    monkeypatch.setenv("EMBER_API_KEY", "secret")
    monkeypatch.setenv("EMBER_FLASH_ATTENTION", "false")
    monkeypatch.setenv("EMBER_KV_CACHE_TYPE", "F16")
    monkeypatch.setenv("EMBER_NOPRUNE", "1")
    assert envconfig.keep_alive() == FOREVER
    assert envconfig.load_timeout() == FOREVER
    assert envconfig.context_length() == 8192
    assert envconfig.max_queue() == 16
    assert envconfig.api_key() == "secret"
    assert envconfig.flash_attention() is False
    assert envconfig.kv_cache_type() == "f16"
    assert envconfig.no_prune() is True


def test_keep_alive_as_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_KEEP_ALIVE", "600")
    assert envconfig.keep_alive() == 600.0
    monkeypatch.setenv("EMBER_KEEP_ALIVE", "1h")
    assert envconfig.keep_alive() == 3600.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("EMBER_KEEP_ALIVE", "soon"),
        ("EMBER_LOAD_TIMEOUT", "5 minutes"),
        ("EMBER_NUM_PARALLEL", "-1"),
        ("EMBER_NUM_PARALLEL", "64"),  # past the KV cache's sequences: at start, not at loads
        ("EMBER_MAX_QUEUE", "many"),
        ("EMBER_KV_CACHE_TYPE", "q5_1"),
    ],
)
def test_bad_settings_are_errors_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    getter = {
        "EMBER_KEEP_ALIVE": envconfig.keep_alive,
        "EMBER_LOAD_TIMEOUT": envconfig.load_timeout,
        "EMBER_CONTEXT_LENGTH": envconfig.context_length,
        "EMBER_NUM_PARALLEL": envconfig.num_parallel,
        "EMBER_MAX_QUEUE": envconfig.max_queue,
        "EMBER_KV_CACHE_TYPE": envconfig.kv_cache_type,
    }[name]
    with pytest.raises(OptionsError, match=name):
        getter()


@pytest.mark.parametrize(
    ("value", "level"),
    [
        # Ollama's TestLogLevel table
        ("", logging.INFO),
        ("false", logging.INFO),
        ("f", logging.INFO),
        ("0", logging.INFO),
        ("true", logging.DEBUG),
        ("t", logging.DEBUG),
        ("1", logging.DEBUG),
        ("2", envconfig.TRACE),
        ("-1", logging.WARNING),
        ("-2", logging.ERROR),
        # neither Go's bool nor an integer
        ("yes", logging.INFO),
        ("random", logging.INFO),
    ],
)
def test_log_level_from_ember_debug(monkeypatch: pytest.MonkeyPatch, value: str, level: int):
    monkeypatch.setenv("EMBER_DEBUG", value)
    assert envconfig.log_level() == level


@pytest.mark.parametrize(
    ("value", "on"),
    # Ollama's TestBool table, and Go's ParseBool words: a value it refuses is on
    [("", False), ("true", True), ("false", False), ("1", True), ("0", False), ("random", True),
     ("something", True), ("f", False), ("F", False), ("FALSE", False), ("no", True),
     ("off", True), ("fAlSe", True)],
)
def test_switches_read_as_ollamas_bool(monkeypatch: pytest.MonkeyPatch, value: str, on: bool):
    monkeypatch.setenv("EMBER_NOPRUNE", value)
    assert envconfig.no_prune() is on


def test_context_length_zero_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CONTEXT_LENGTH", "0")
    assert envconfig.context_length() == 4096


def test_a_name_counts_by_the_address_it_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    # the Host check's switch: the address a name binds, not its spelling (Ollama checks ln.Addr)
    addresses = {"vm": "127.0.0.1", "lan": "10.1.2.3", "v6": "::1"}

    def getaddrinfo(host: str, port: int, **_: object) -> list[tuple]:
        if host not in addresses:
            raise socket.gaierror("unknown")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addresses[host], port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert envconfig.parse_host("vm:11588").is_loopback
    assert envconfig.parse_host("v6:11588").is_loopback
    assert not envconfig.parse_host("lan:11588").is_loopback
    assert not envconfig.parse_host("nowhere:11588").is_loopback
    assert envconfig.parse_host("127.0.0.2:1").is_loopback
    assert not envconfig.parse_host("0.0.0.0:1").is_loopback


def test_origins_are_the_users_then_ollamas_local_defaults(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EMBER_ORIGINS", " https://a.example , http://b.example:*,")
    origins = envconfig.allowed_origins()
    assert origins[:2] == ["https://a.example", "http://b.example:*"]
    for expected in ("http://localhost", "https://127.0.0.1:*", "http://0.0.0.0:*", "app://*"):
        assert expected in origins
    assert {"file://*", "tauri://*", "vscode-webview://*", "vscode-file://*"} <= set(origins)


def test_server_settings_never_show_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_API_KEY", "hunter2")
    settings = envconfig.server_settings()
    assert settings["EMBER_API_KEY"] == "(set)"
    assert "hunter2" not in repr(settings)


def test_registries_default_to_the_configured_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_REGISTRIES", raising=False)
    monkeypatch.delenv("EMBER_REGISTRY", raising=False)
    assert envconfig.registries() == ("registry.ollama.ai",)
    monkeypatch.setenv("EMBER_REGISTRY", "http://127.0.0.1:5000/")
    assert envconfig.registries() == ("127.0.0.1:5000",)
    monkeypatch.setenv("EMBER_REGISTRIES", " Registry.Ollama.ai, mirror.example:8443 ,")
    assert envconfig.registries() == ("registry.ollama.ai", "mirror.example:8443")


def test_tls_files_go_together(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("EMBER_TLS_CERT", raising=False)
    monkeypatch.delenv("EMBER_TLS_KEY", raising=False)
    assert envconfig.tls_files() is None
    monkeypatch.setenv("EMBER_TLS_KEY", str(tmp_path / "k.pem"))
    with pytest.raises(OptionsError, match="EMBER_TLS_CERT is not set"):
        envconfig.tls_files()
    monkeypatch.setenv("EMBER_TLS_CERT", str(tmp_path / "c.pem"))
    tls = envconfig.tls_files()
    assert tls is not None and (tls.cert, tls.key) == (tmp_path / "c.pem", tmp_path / "k.pem")


def test_metrics_and_the_ca_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_METRICS", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    assert envconfig.metrics() is False and envconfig.ca_file() is None
    monkeypatch.setenv("EMBER_METRICS", "1")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ca.pem")
    assert envconfig.metrics() is True and str(envconfig.ca_file()) == "/etc/ca.pem"
