"""Chat templates: the GGUF's Jinja template rendered in minijinja's sandbox with a fuel limit,
and built-in templates for models whose files carry none (Gemma 3)."""

from typing import Any

import minijinja

from ember.errors import EmberError

FUEL = 2_000_000  # bounds the work an untrusted template may do

GEMMA3 = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
BUILTIN = {"gemma3": GEMMA3, "gemma2": GEMMA3}  # Gemma 2 uses the same turn format


class TemplateError(EmberError):
    """A chat template that does not parse or fails to render."""


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template raised: {message}")


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    **context: Any,
) -> str:
    """Renders messages, plus any extra variables (bos_token, tools...). add_generation_prompt
    False leaves the assistant turn unopened (to continue a final assistant message)."""
    env = minijinja.Environment()
    env.fuel = FUEL
    env.pycompat = True  # HF templates call Python string methods (.strip(), .startswith())
    env.add_global("raise_exception", _raise)
    try:
        return env.render_str(
            template, messages=messages, add_generation_prompt=add_generation_prompt, **context
        )
    except TemplateError:
        raise
    except Exception as e:  # minijinja reports syntax, runtime and fuel errors alike
        raise TemplateError(f"the chat template failed: {str(e).splitlines()[0]}") from None
