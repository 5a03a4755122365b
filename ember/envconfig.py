"""Typed EMBER_* settings: the only place in Ember that reads os.environ.

Every function reads the environment when called, so a test or a child process sees changes.
"""

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ember.errors import OptionsError
from ember.hostaddress import HostAddress, parse_host

# Go's strconv.ParseBool, which Ollama's envconfig reads its switches with
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def _get(name: str) -> str:
    # as Ollama's envconfig.Var: spaces, then quotes, trimmed
    return os.environ.get(name, "").strip().strip("\"'")


def _path(name: str, default: str) -> Path:
    return Path(_get(name) or default).expanduser()


def _int(name: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
    text = _get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionsError(f"{name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise OptionsError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise OptionsError(f"{name} must be at most {maximum}, got {value}")
    return value


def _bool(name: str) -> bool:
    # As Ollama's envconfig.Bool: unset or one of Go's false words (0, f, false, ...) is off;
    # any other value is on, even one Go's ParseBool refuses ("no" included)
    text = _get(name)
    return bool(text) and text not in _GO_FALSE


def models_dir() -> Path:
    """Where pulled and created models live (EMBER_MODELS, default ~/.ember/models)."""
    return _path("EMBER_MODELS", "~/.ember/models")


DEFAULT_REGISTRY = "https://registry.ollama.ai"


def registry_url() -> str:
    """The registry that pulls and pushes of names without a host of their own use
    (EMBER_REGISTRY, a base URL such as http://127.0.0.1:5000; default Ollama's registry)."""
    return (_get("EMBER_REGISTRY") or DEFAULT_REGISTRY).rstrip("/")


def registries() -> tuple[str, ...]:
    """The registries pulls and pushes may reach (EMBER_REGISTRIES: comma-separated hosts, each
    `host` for any port or `host:port`); default: the host of EMBER_REGISTRY."""
    hosts = tuple(h.strip().lower() for h in _get("EMBER_REGISTRIES").split(",") if h.strip())
    return hosts or (urlsplit(registry_url()).netloc.lower(),)


def allowed_image_hosts() -> tuple[str, ...]:
    """The hosts whose http(s) image URLs the server fetches (EMBER_ALLOW_IMAGE_URLS:
    comma-separated, each `host` for any port, `host:port`, or `*.domain` for its subdomains);
    default none: an image URL is refused, as Ollama fetches none."""
    return tuple(h.strip().lower() for h in _get("EMBER_ALLOW_IMAGE_URLS").split(",") if h.strip())


def cache_dir() -> Path:
    """Where assembled model files and checksum records live (EMBER_CACHE, ~/.ember/cache)."""
    return _path("EMBER_CACHE", "~/.ember/cache")


def num_threads() -> int:
    """CPU threads for compute (EMBER_NUM_THREADS); 0 means let the backend choose."""
    return _int("EMBER_NUM_THREADS", 0, minimum=0)


# the native kernels' paths, numbered as the native library's (avxvnni: AVX2 with AVX-VNNI's
# 256-bit int8/int16 dot products, as Intel's cores since Alder Lake have without AVX-512; amx:
# avx512 with AMX's int8 tiles for 8-16 rows of x and for prompts, Intel's Xeons since Sapphire
# Rapids; neondot: neon with the dot product instructions, ARMv8.2's FEAT_DotProd)
CPU_ISAS = ("generic", "avx2", "avxvnni", "avx512", "neon", "amx", "neondot")


def cpu_isa() -> str:
    """The native kernels' path (EMBER_CPU_ISA: one of CPU_ISAS); "" = the best the CPU runs.
    Forcing one the CPU lacks is an error where the kernels are loaded."""
    text = _get("EMBER_CPU_ISA").lower()
    if text and text not in CPU_ISAS:
        raise OptionsError(f"EMBER_CPU_ISA must be one of {', '.join(CPU_ISAS)}, got {text!r}")
    return text


def debug() -> bool:
    """Verbose logging (EMBER_DEBUG at DEBUG or TRACE)."""
    return log_level() <= logging.DEBUG


# --- durations: Go's time.ParseDuration forms, as Ollama's keep_alive and env values take them ---

FOREVER = math.inf  # a keep-alive or timeout that never runs out, in seconds
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_SECONDS = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string ("300ms", "5m", "1h30m", "-1h", "0"); else ValueError."""
    text = text.strip()
    if text in ("0", "+0", "-0"):
        return 0.0
    if not _DURATION.fullmatch(text):
        raise ValueError(f"invalid duration {text!r}")
    total = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))
    return -total if text.startswith("-") else total


def parse_keep_alive(value: str | int | float) -> float:
    """Seconds from a keep_alive value: a number of seconds or a duration string ("5m", "1h30m");
    a string of digits counts as seconds too; anything negative is FOREVER, 0 unloads at once."""
    if isinstance(value, bool):
        raise ValueError('a duration must be a number of seconds or a string such as "5m"')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _SECONDS.fullmatch(value.strip()):
        seconds = float(value.strip())
    elif isinstance(value, str):
        seconds = parse_duration(value)
    else:
        raise ValueError('a duration must be a number of seconds or a string such as "5m"')
    if math.isnan(seconds):
        raise ValueError("a duration cannot be NaN")
    return FOREVER if seconds < 0 else seconds


def format_duration(seconds: float) -> str:
    """Go's Duration.String() form ("5m0s", "1h30m0s", "1.5s"); FOREVER as "forever"."""
    if math.isinf(seconds):
        return "forever"
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.9f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{int(minutes)}m{text}"
    if hours:
        text = f"{int(hours)}h{text}"
    return sign + text


# --- server settings (names as Ollama's OLLAMA_*, see the reference's environment table) ---

def host() -> HostAddress:
    """The server's address (EMBER_HOST, default http://127.0.0.1:11434)."""
    return parse_host(_get("EMBER_HOST"))


_LOCAL_ORIGINS = ("localhost", "127.0.0.1", "0.0.0.0")
_APP_ORIGINS = ("app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")


def allowed_origins() -> list[str]:
    """CORS origins: EMBER_ORIGINS (comma list, `*` wildcards), then Ollama's local defaults."""
    origins = [o.strip() for o in _get("EMBER_ORIGINS").split(",") if o.strip()]
    for name in _LOCAL_ORIGINS:
        for scheme in ("http", "https"):
            origins += [f"{scheme}://{name}", f"{scheme}://{name}:*"]
    return [*origins, *_APP_ORIGINS]


def api_key() -> str | None:
    """A key every request must carry as `Authorization: Bearer <key>` (EMBER_API_KEY)."""
    return _get("EMBER_API_KEY") or None


def metrics() -> bool:
    """Serve Prometheus metrics on GET /metrics (EMBER_METRICS); off by default."""
    return _bool("EMBER_METRICS")


@dataclass(frozen=True, slots=True)
class TLSFiles:
    cert: Path  # the server's certificate chain (PEM)
    key: Path  # its private key (PEM)


def tls_files() -> TLSFiles | None:
    """The certificate and key `ember serve` serves HTTPS with (EMBER_TLS_CERT, EMBER_TLS_KEY):
    both or neither; None serves plain HTTP."""
    cert, key = _get("EMBER_TLS_CERT"), _get("EMBER_TLS_KEY")
    if bool(cert) != bool(key):
        missing = "EMBER_TLS_KEY" if cert else "EMBER_TLS_CERT"
        raise OptionsError(f"EMBER_TLS_CERT and EMBER_TLS_KEY go together: {missing} is not set")
    return TLSFiles(Path(cert).expanduser(), Path(key).expanduser()) if cert else None


def ca_file() -> Path | None:
    """The CA bundle clients of the server trust instead of the default (SSL_CERT_FILE, as
    OpenSSL and most HTTP clients read it)."""
    text = _get("SSL_CERT_FILE")
    return Path(text).expanduser() if text else None


def keep_alive() -> float:
    """Seconds an idle model stays loaded (EMBER_KEEP_ALIVE, default 5m; negative: FOREVER)."""
    text = _get("EMBER_KEEP_ALIVE")
    if not text:
        return 300.0
    try:
        return parse_keep_alive(text)
    except ValueError as e:
        raise OptionsError(f"EMBER_KEEP_ALIVE: {e}") from None


def load_timeout() -> float:
    """Seconds a model load may stall before it is given up (EMBER_LOAD_TIMEOUT, default 5m;
    zero or negative: FOREVER)."""
    text = _get("EMBER_LOAD_TIMEOUT")
    try:
        seconds = parse_keep_alive(text) if text else 300.0
    except ValueError as e:
        raise OptionsError(f"EMBER_LOAD_TIMEOUT: {e}") from None
    return seconds if seconds > 0 else FOREVER


def context_length() -> int:
    """The default num_ctx of a request that sets none (EMBER_CONTEXT_LENGTH, default 4096; 0 is
    Ollama's "unset" too)."""
    return _int("EMBER_CONTEXT_LENGTH", 0, minimum=0) or 4096


# the KV cache's sequences at most (kvcache.causal's: a bit each in one int64)
MAX_PARALLEL = 63


def num_parallel() -> int:
    """Sequences a loaded model decodes at once (EMBER_NUM_PARALLEL); 0 lets the server choose."""
    return _int("EMBER_NUM_PARALLEL", 0, minimum=0, maximum=MAX_PARALLEL)


def max_loaded_models() -> int:
    """Models held loaded at once (EMBER_MAX_LOADED_MODELS); 0 lets the server choose."""
    return _int("EMBER_MAX_LOADED_MODELS", 0, minimum=0)


def max_queue() -> int:
    """Requests that may wait for a model before new ones get 503 (EMBER_MAX_QUEUE, 512)."""
    return _int("EMBER_MAX_QUEUE", 512, minimum=1)


def flash_attention() -> bool | None:
    """Force flash attention on or off (EMBER_FLASH_ATTENTION); None: the model's default."""
    return _bool("EMBER_FLASH_ATTENTION") if _get("EMBER_FLASH_ATTENTION") else None


KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")  # as ember.kvcache.KV_TYPES


def kv_cache_type() -> str:
    """KV cache type (EMBER_KV_CACHE_TYPE: f32, f16, bf16, q8_0, q4_0); "" = default (f16)."""
    text = _get("EMBER_KV_CACHE_TYPE").lower()
    if text and text not in KV_CACHE_TYPES:
        raise OptionsError(f"EMBER_KV_CACHE_TYPE must be one of {', '.join(KV_CACHE_TYPES)}")
    return text


def gpu_overhead() -> int:
    """Bytes of each GPU's memory to leave unused (EMBER_GPU_OVERHEAD, default 0)."""
    return _int("EMBER_GPU_OVERHEAD", 0, minimum=0)


def sched_spread() -> bool:
    """Spread a model over every GPU even when it fits on one (EMBER_SCHED_SPREAD)."""
    return _bool("EMBER_SCHED_SPREAD")


def multiuser_cache() -> bool:
    """Prompt-cache slots chosen for many users rather than one (EMBER_MULTIUSER_CACHE)."""
    return _bool("EMBER_MULTIUSER_CACHE")


TRACE = 5  # below logging.DEBUG, as Ollama's slog level -8


def log_level() -> int:
    """A `logging` level from EMBER_DEBUG as Ollama's LogLevel: one of Go's true words DEBUG;
    another integer n slog's level -4n (2 TRACE, -1 WARN, -2 ERROR); anything else INFO."""
    text = _get("EMBER_DEBUG")
    if text in _GO_TRUE:
        return logging.DEBUG
    steps = int(text) if re.fullmatch(r"[-+]?\d+", text) else 0
    if steps == 0:
        return logging.INFO
    if steps >= 2:
        return TRACE
    return {1: logging.DEBUG, -1: logging.WARNING, -2: logging.ERROR}.get(steps, logging.CRITICAL)


def debug_log_requests() -> bool:
    """Log the body of every request (EMBER_DEBUG_LOG_REQUESTS)."""
    return _bool("EMBER_DEBUG_LOG_REQUESTS")


def no_history() -> bool:
    """Keep no REPL history file (EMBER_NOHISTORY)."""
    return _bool("EMBER_NOHISTORY")


def no_prune() -> bool:
    """Leave unused blobs in the model store at startup (EMBER_NOPRUNE)."""
    return _bool("EMBER_NOPRUNE")


def editor() -> str:
    """The editor the REPL opens on Ctrl+G (EMBER_EDITOR, else VISUAL, else EDITOR)."""
    return _get("EMBER_EDITOR") or _get("VISUAL") or _get("EDITOR")


def server_settings() -> dict[str, str]:
    """The settings the server logs at startup (the API key only as set or not)."""
    return {
        "EMBER_HOST": host().url,
        "EMBER_ORIGINS": _get("EMBER_ORIGINS"),
        "EMBER_API_KEY": "(set)" if api_key() else "",
        "EMBER_MODELS": str(models_dir()),
        "EMBER_KEEP_ALIVE": format_duration(keep_alive()),
        "EMBER_LOAD_TIMEOUT": format_duration(load_timeout()),
        "EMBER_CONTEXT_LENGTH": str(context_length()),
        "EMBER_NUM_PARALLEL": str(num_parallel()),
        "EMBER_MAX_LOADED_MODELS": str(max_loaded_models()),
        "EMBER_MAX_QUEUE": str(max_queue()),
        "EMBER_KV_CACHE_TYPE": kv_cache_type(),
        "EMBER_CPU_ISA": _get("EMBER_CPU_ISA"),  # as set: the system info line says what it does
        "EMBER_MULTIUSER_CACHE": str(multiuser_cache()).lower(),
        "EMBER_NOPRUNE": str(no_prune()).lower(),
        "EMBER_METRICS": str(metrics()).lower(),
        "EMBER_TLS_CERT": _get("EMBER_TLS_CERT"),
        "EMBER_REGISTRIES": ",".join(registries()),
        "EMBER_ALLOW_IMAGE_URLS": ",".join(allowed_image_hosts()),
        "EMBER_DEBUG": logging.getLevelName(log_level()),
    }
