"""What the model commands do against the server (list, show, ps, stop, cp, rm, pull, push,
create) and how their answers are printed; app.py only wires them to the command line."""

import json
import math
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ember.cli.client import Client, CLIError
from ember.cli.progress import show_progress
from ember.gofuncs import go_format
from ember.human import human_number
from ember.weightfiles import model_safetensors


def human_bytes(num: float) -> str:
    """Sizes as Ollama's format.HumanBytes prints them (decimal units): from 10 truncated (475
    MB), below it one decimal, rounded (5.5 MB, 2.0 GB for 1.99 GB), a whole value bare (1 GB)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if num >= size:
            value = num / size
            if value >= 10 or value == int(value):
                return f"{int(value)} {unit}"
            return f"{value:.1f} {unit}"
    return f"{int(num)} B"


def human_time(timestamp: str, zero: str = "Never") -> str:
    """An ISO time as Ollama's format.HumanTime says it: "4 hours ago", "29 seconds from now",
    "Forever" past twenty years ahead."""
    try:
        then = datetime.fromisoformat(timestamp)
    except (TypeError, ValueError):
        return zero
    delta = (datetime.now(UTC) - then).total_seconds()
    if int(delta / 3600) // 24 // 365 < -20:
        return "Forever"
    return f"{_duration(-delta)} from now" if delta < 0 else f"{_duration(delta)} ago"


def _duration(seconds: float) -> str:
    """Ollama's humanDuration: "Less than a second", "About a minute", "3 days"."""
    if int(seconds) < 1:
        return "Less than a second"
    if int(seconds) < 60:
        return "1 second" if int(seconds) == 1 else f"{int(seconds)} seconds"
    minutes = int(seconds / 60)
    if minutes < 60:
        return "About a minute" if minutes == 1 else f"{minutes} minutes"
    hours = math.floor(seconds / 3600 + 0.5)  # Go's math.Round: halves away from zero
    if hours == 1:
        return "About an hour"
    for limit, unit, per in ((48, "hours", 1), (24 * 14, "days", 24), (24 * 60, "weeks", 24 * 7)):
        if hours < limit:
            return f"{hours // per} {unit}"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(seconds / 3600) // 24 // 365} years"


def table(rows: list[list[str]]) -> str:
    """Columns padded as Ollama's tables pad them (four spaces between)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "    ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


def list_models(client: Client, prefix: str = "") -> str:
    """`ember list [PREFIX]`: the models whose name starts with prefix (any case), as Ollama's."""
    models = client.request("GET", "/api/tags")["models"]
    rows = [["NAME", "ID", "SIZE", "MODIFIED"]]
    for m in models:
        if m["name"].lower().startswith(prefix.lower()):
            size, modified = human_bytes(m["size"]), human_time(m["modified_at"])
            rows.append([m["name"], m["digest"][:12], size, modified])
    return table(rows)


def list_running(client: Client, prefix: str = "") -> str:
    """`ember ps [PREFIX]`: Ollama's columns, then Ember's slots in use and KV cache type."""
    models = client.request("GET", "/api/ps")["models"]
    rows = [["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", "SLOTS", "KV CACHE"]]
    for m in models:
        if not m["name"].startswith(prefix):
            continue
        vram, size = m.get("size_vram", 0), m.get("size", 0)
        processor = "100% GPU" if size and vram >= size else "100% CPU"
        if 0 < vram < size:
            processor = f"{round(100 * (size - vram) / size)}%/{round(100 * vram / size)}% CPU/GPU"
        until = _until(m.get("expires_at", ""))
        context = str(m.get("context_length", ""))
        rows.append(
            [m["name"], m["digest"][:12], human_bytes(size), processor, context, until, *_slots(m)]
        )
    return table(rows)


def _slots(model: dict[str, Any]) -> tuple[str, str]:
    """SLOTS as in use/total and the KV cache type: Ember's own /api/ps fields ("" from a
    server that has none)."""
    total, busy = model.get("num_parallel"), model.get("slots_in_use", 0)
    slots = f"{busy}/{total}" if isinstance(total, int) else ""
    return slots, str(model.get("kv_cache_type") or "")


def _until(timestamp: str) -> str:
    try:
        then = datetime.fromisoformat(timestamp)
    except (TypeError, ValueError):
        return ""
    if then < datetime.now(UTC):
        return "Stopping..."
    return human_time(timestamp)


def stop(client: Client, model: str) -> None:
    """As Ollama's: an unload request, whether it runs or not; only a model that does not
    exist is an error."""
    try:
        client.request("POST", "/api/generate", {"model": model, "keep_alive": 0})
    except CLIError as err:
        if "not found" in str(err):
            raise CLIError(f'couldn\'t find model "{model}" to stop') from None
        raise


def unload(client: Client, model: str) -> None:
    """Stops model if it runs: `rm` does first, as Ollama's, so that a deleted model does not
    hold its memory until its keep_alive ends; at best: a failure is a warning, the delete
    goes on."""
    try:
        if _is_running(client, model):
            client.request("POST", "/api/generate", {"model": model, "keep_alive": 0})
    except CLIError as err:
        if "not found" not in str(err).lower():
            print(f"Warning: unable to stop model '{model}'", file=sys.stderr)


def _is_running(client: Client, model: str) -> bool:
    running = (client.request("GET", "/api/ps") or {}).get("models") or []
    names = {m.get("name", "").removesuffix(":latest") for m in running}
    return any(model in (m.get("name"), m.get("model")) for m in running) or model in names


def pull(client: Client, model: str, *, insecure: bool = False) -> None:
    show_progress(client.stream("/api/pull", {"model": model, "insecure": insecure}))


def push(client: Client, model: str, *, insecure: bool = False) -> None:
    show_progress(client.stream("/api/push", {"model": model, "insecure": insecure}))


def create(
    client: Client, model: str, modelfile: Path | None, *, quantize: str | None = None
) -> None:
    """Creates `model` from a Modelfile; a FROM naming a local GGUF file is uploaded first.
    Without one (none given, no ./Modelfile) the current folder's weights, as Ollama's
    `FROM .`."""
    from ember.store import ModelfileError, parse_modelfile  # late: the store pulls in torch

    modelfile, modelfile_text = _modelfile(modelfile)
    try:
        commands = parse_modelfile(modelfile_text)
    except ModelfileError as e:
        raise CLIError(f"{modelfile}: {e}") from None
    body: dict[str, Any] = {"model": model, "stream": True}
    if quantize:
        body["quantize"] = quantize
    licenses: list[str] = []
    messages: list[dict[str, str]] = []
    params: dict[str, list[str]] = {}
    for c in commands:
        if c.name == "model":  # a second FROM: the projector beside the model's file
            source = _from(client, c.args, modelfile.parent)
            if "files" in source and "files" in body:
                source["files"] = body["files"] | source["files"]
            body.update(source)
        elif c.name in ("template", "system", "renderer", "parser", "requires", "draft"):
            body[c.name] = c.args
        elif c.name == "license":
            licenses.append(c.args)
        elif c.name == "message":
            role, _, text = c.args.partition(": ")
            messages.append({"role": role, "content": text})
        elif c.name == "adapter":
            raise CLIError("ADAPTER is not supported")
        else:
            params.setdefault(c.name, []).append(c.args)
    body.update({k: v for k, v in _extras(licenses, messages, params).items() if v})
    show_progress(client.stream("/api/create", body))


def _modelfile(given: Path | None) -> tuple[Path, bytes]:
    """The Modelfile (its FROMs are relative to its folder) and its text: ./Modelfile when none
    is given, and without that `FROM .`."""
    path = given or Path("Modelfile")
    if given is None and not path.exists():
        return path, b"FROM .\n"
    try:
        return path, path.read_bytes()
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None


def _from(client: Client, source: str, base: Path) -> dict[str, Any]:
    path = (base / Path(source).expanduser()).resolve()
    if path.is_dir():
        return {"files": _upload_directory(client, path, source)}
    if path.is_file():
        return {"files": {path.name: client.upload_blob(path)}}
    if source.startswith((".", "/", "~")) or source.endswith(".gguf"):
        raise CLIError(f"FROM {source}: no such file")
    return {"from": source}


# The files of an HF model directory that a conversion reads (as Ollama's create uploads;
# README.md too: a Qwen3-Reranker is told by its title there, as llama.cpp tells it).
HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
            "chat_template.jinja", "preprocessor_config.json", "processor_config.json",
            "modules.json", "README.md")  # fmt: skip


def _upload_directory(client: Client, path: Path, source: str) -> dict[str, str]:
    weights = model_safetensors(path.glob("*.safetensors"))
    if not weights:  # as Ollama's filesForModel: a folder of GGUF files is those files
        ggufs = sorted(path.glob("*.gguf"))
        if not ggufs:
            raise CLIError(f"FROM {source}: the folder has no .safetensors or .gguf files")
        return {f.name: client.upload_blob(f) for f in ggufs}
    files = weights + [path / n for n in HF_FILES if (path / n).is_file()]
    named = {f.name: f for f in files}
    for module in _module_folders(path):  # sentence-transformers' Pooling and Dense modules
        for name in ("config.json", "model.safetensors"):
            if (path / module / name).is_file():
                named[f"{module}/{name}"] = path / module / name
    return {name: client.upload_blob(f) for name, f in named.items()}


def _module_folders(path: Path) -> list[str]:
    """The one-level folders of a sentence-transformers modules.json, as Ollama's create
    uploads their config.json (and a Dense module's weights)."""
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(modules, list):
        return []
    folders = [m.get("path") for m in modules if isinstance(m, dict)]
    return [f for f in folders if isinstance(f, str) and re.fullmatch(r"[\w.-]+", f)
            and f not in (".", "..")]  # fmt: skip


def _extras(
    licenses: list[str], messages: list[dict[str, str]], params: dict[str, list[str]]
) -> dict[str, Any]:
    # parameters as strings: the server types them as Ollama's FormatParams does
    parameters = {k: v if k == "stop" else v[-1] for k, v in params.items()}
    return {"license": licenses, "messages": messages, "parameters": parameters}


def format_show(shown: dict[str, Any], *, verbose: bool = False) -> str:
    """`ember show MODEL`'s summary as Ollama's showInfo prints it: model facts, capabilities,
    projector, parameters; with verbose every metadata key and the tensors; then the first
    lines of the system message and the license. Each section is a table whose columns are as
    wide as their widest cell, and four spaces after each (trailing ones too)."""
    details = shown.get("details") or {}
    sections = [("Model", _model_rows(shown.get("model_info"), details, shown.get("requires")))]
    sections.append(("Capabilities", [[c] for c in shown.get("capabilities") or []]))
    if shown.get("projector_info"):
        sections.append(("Projector", _projector_rows(shown["projector_info"])))
    lines = (shown.get("parameters") or "").splitlines()
    sections.append(("Parameters", [line.split() for line in lines if line.strip()]))
    if verbose:
        metadata = sorted((shown.get("model_info") or {}).items())
        sections.append(("Metadata", [[k, _shown_value(v)] for k, v in metadata]))
        tensors = [t for t in shown.get("tensors") or [] if "name" in t]
        sections.append(("Tensors", [[t["name"], t.get("type", ""), _shape(t)] for t in tensors]))
    for title, key in (("System", "system"), ("License", "license")):
        if shown.get(key):
            sections.append((title, [[line] for line in _head(shown[key], 2)]))
    return "".join(_table(title, rows) for title, rows in sections if rows)


def _shape(tensor: dict[str, Any]) -> str:
    return "[" + " ".join(map(str, tensor.get("shape") or ())) + "]"  # Go's %v of a slice


def _model_rows(info: Any, details: dict[str, Any], requires: Any) -> list[list[str]]:
    rows = []
    if isinstance(info, dict):
        arch = info.get("general.architecture") or ""
        if arch:
            rows.append(["architecture", str(arch)])
        count = info.get("general.parameter_count")
        size = details.get("parameter_size") or (
            human_number(count) if isinstance(count, int | float) else ""
        )
        if size:
            rows.append(["parameters", size])
        for key in ("context_length", "embedding_length"):
            if isinstance(info.get(f"{arch}.{key}"), int | float):
                rows.append([key.replace("_", " "), _shown_value(info[f"{arch}.{key}"])])
    else:
        rows += [["architecture", details.get("family", "")]]
        rows += [["parameters", details.get("parameter_size", "")]]
    rows.append(["quantization", details.get("quantization_level", "")])
    if requires:
        rows.append(["requires", str(requires)])
    return rows


def _projector_rows(info: dict[str, Any]) -> list[list[str]]:
    arch = info.get("general.architecture") or ""
    rows = [["architecture", str(arch)]] if arch else []
    if isinstance(info.get("general.parameter_count"), int | float):
        rows.append(["parameters", human_number(info["general.parameter_count"])])
    for suffix, label in (
        ("embedding_length", "embedding length"),
        ("projection_dim", "dimensions"),
    ):
        for modality in ("vision", "audio"):
            value = info.get(f"{arch}.{modality}.{suffix}")
            if isinstance(value, int | float):
                rows.append([label, _shown_value(value)])
                break
    return rows


def _table(title: str, rows: list[list[str]]) -> str:
    """One of showInfo's tables: its title, its rows under an empty first column, a blank line."""
    cells = [["", *row] for row in rows]
    columns = max(len(row) for row in cells)
    cells = [row + [""] * (columns - len(row)) for row in cells]
    widths = [max(len(row[i]) for row in cells) for i in range(columns)]
    body = "".join(
        "".join(cell.ljust(width) + "    " for cell, width in zip(row, widths, strict=True)) + "\n"
        for row in cells
    )
    return f"  {title}\n{body}\n"


def _shown_value(value: Any) -> str:
    """A metadata value as Ollama's show prints it: JSON's numbers as Go's float64 (%g), null
    as <nil>, a list as the items that fit in 10 columns and a count of the rest."""
    if value is None:
        return "<nil>"
    if not isinstance(value, list):
        return go_format(_as_float64(value))
    items = [go_format(_as_float64(x), False) for x in value]
    width, shown = 1, 0
    for i, item in enumerate(items):
        width += len(item) + 2 * (i > 0)
        if width > 10 and i > 0:
            break
        shown += 1
    more = f" ...+{len(items) - shown} more" if shown < len(items) else ""
    return f"[{' '.join(items[:shown])}{more}]"


def _as_float64(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, list):
        return [_as_float64(x) for x in value]
    return value


def _head(text: str, n: int) -> list[str]:
    """The first n non-empty lines, stripped, and "..." when more follow (Ollama's head)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[:n] + ["..."] * (len(lines) > n)


def show_part(client: Client, model: str, part: str | None, *, verbose: bool = False) -> str:
    shown = client.request("POST", "/api/show", {"model": model, "verbose": verbose})
    if part is None:
        return format_show(shown, verbose=verbose)
    return str(shown.get(part, ""))


def ensure_model(client: Client, model: str, *, insecure: bool = False) -> dict[str, Any]:
    """Pulls `model` when the server does not have it (as `ollama run`); returns its /api/show
    answer (its capabilities decide, for one, whether a prompt may name images)."""
    try:
        return client.request("POST", "/api/show", {"model": model})
    except CLIError as e:
        if "not found" not in str(e):
            raise
    pull(client, model, insecure=insecure)
    return client.request("POST", "/api/show", {"model": model})
