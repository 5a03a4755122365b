"""Chat templates: the GGUF's Jinja template rendered in minijinja's sandbox with a fuel limit,
Ollama's Go templates (Modelfile TEMPLATEs) in gotemplate.py's, and built-in templates for
models whose files carry none (Gemma 3)."""

import functools
import json
from datetime import datetime
from typing import Any

import minijinja

from ember.errors import EmberError
from ember.gochat import render_go, render_go_fill
from ember.gotemplate import GoTemplate, GoTemplateError, is_go_template

FUEL = 2_000_000  # bounds the work an untrusted template may do

GEMMA3 = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
BUILTIN = {"gemma3": GEMMA3, "gemma2": GEMMA3}  # Gemma 2 uses the same turn format
# the special tokens when a template is rendered to learn what it writes (tools, thinking,
# calls): templates add them to turns (Mistral's eos_token), and the model's output never
# holds them, so they are nothing
PROBE_SPECIALS: dict[str, Any] = {"bos_token": "", "eos_token": ""}


class TemplateError(EmberError):
    """A chat template that does not parse or fails to render."""


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template raised: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # HF's filter: plain JSON, where minijinja's (as Jinja's) escapes <, >, & and ' for HTML,
    # so a tool's "a < b" reached the model as "a \u003c b"
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _jinja() -> minijinja.Environment:
    """The environment HF's apply_chat_template (and llama.cpp's) renders templates in: blocks'
    newlines trimmed and their indentation stripped, and its tojson and strftime_now (gpt-oss's
    template calls it unguarded)."""
    env = minijinja.Environment()
    env.fuel = FUEL
    env.pycompat = True  # HF templates call Python string methods (.strip(), .startswith())
    env.trim_blocks = True
    env.lstrip_blocks = True
    env.add_global("raise_exception", _raise)
    env.add_global("strftime_now", _strftime_now)
    env.add_filter("tojson", _tojson)
    return env


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    **context: Any,
) -> str:
    """Renders messages, plus any extra variables (bos_token, tools...). add_generation_prompt
    False leaves the assistant turn unopened (to continue a final assistant message).

    A Go template sees what Ollama's do (System, Messages, Tools, Think...; its own rules for a
    final assistant message), from the tools, enable_thinking and reasoning_effort given."""
    if is_go_template(template):
        think = context.get("reasoning_effort", context.get("enable_thinking"))
        try:
            go = _parsed_go(template)
            return render_go(go, messages, tools=context.get("tools"), think=think)
        except GoTemplateError as e:
            raise TemplateError(str(e)) from None
        except RecursionError:  # a template nested deeper than Python's stack
            raise TemplateError("the Go template failed: it nests too deeply") from None
    try:
        return _jinja().render_str(
            template, messages=messages, add_generation_prompt=add_generation_prompt, **context
        )
    except TemplateError:
        raise
    except Exception as e:  # minijinja reports syntax, runtime and fuel errors alike
        raise TemplateError(f"the chat template failed: {str(e).splitlines()[0]}") from None


def check_jinja(template: str) -> None:
    """Raises TemplateError when a Jinja template does not parse (it is not rendered)."""
    try:
        _jinja().add_template("template", template)
    except Exception as e:  # minijinja's TemplateError; its first line names the fault
        raise TemplateError(f"the chat template does not parse: {str(e).splitlines()[0]}") from None


@functools.lru_cache(maxsize=64)
def _parsed_go(source: str) -> GoTemplate:
    return GoTemplate(source)


def fills_gaps(template: str | None) -> bool:
    """Whether a template fills a gap itself: a Go template that reads .Suffix (Ollama's
    "insert" capability)."""
    if not template or not is_go_template(template):
        return False
    try:
        return "suffix" in _parsed_go(template).identifiers
    except (GoTemplateError, RecursionError):
        return False


def render_fill(template: str, prompt: str, suffix: str, think: bool | str | None = None) -> str:
    """The prompt of a gap to fill through a template that fills_gaps."""
    try:
        return render_go_fill(_parsed_go(template), prompt, suffix, think)
    except GoTemplateError as e:
        raise TemplateError(str(e)) from None
    except RecursionError:
        raise TemplateError("the Go template failed: it nests too deeply") from None
