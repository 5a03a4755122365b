"""How a request's output is held and read: the grammar its tools or its format give the runner
(tool_grammar.py writes it), and the parser its text goes through (thinking, content and calls:
output.py, or harmony.py for gpt-oss)."""

from collections.abc import Mapping, Sequence

from ember.server import harmony
from ember.server.api import ChatRequest, GenerateRequest, Generation, Tool
from ember.server.model import ServedModel
from ember.server.output import OutputParser, Parser
from ember.server.thinking import ThinkingTags
from ember.server.tool_grammar import chat_grammar, choice_mode, format_grammar


def thinking_tags(model: ServedModel, req: Generation) -> ThinkingTags | None:
    """The tags of the thinking this request's output may hold, None when it holds none."""
    thinks = "thinking" in model.capabilities and req.think is not False
    return model.thinking_tags if thinks else None


def reads_calls(model: ServedModel) -> bool:
    """Whether tool_choice "auto" leaves the model's calls free, to be read: Harmony's channels
    and calls written as text (Qwen3-Coder's parameters, a name before its JSON) have no JSON
    call for auto's lazy grammar to hold (a forced call: Harmony's grammar, else a 400)."""
    return model.harmony or model.tool_format.style != "json"


def forces_unreadable_call(model: ServedModel, req: ChatRequest) -> bool:
    """A forced call in a format no grammar of Ember's holds yet (calls written as text)."""
    return (
        choice_mode(req) == "required" and model.tool_format.style != "json" and not model.harmony
    )


def chat_constraint(model: ServedModel, req: ChatRequest, prompt: str) -> str | None:
    """The grammar of a chat's output: its tool_choice's, else its format's after free thinking;
    None when the runner's format (or nothing) holds it."""
    thinking = thinking_tags(model, req)
    if model.harmony and choice_mode(req) == "required":
        names = harmony.HarmonyNames(t.function.name for t in req.tools)
        analysis = req.think is not False
        return harmony.call_grammar(req.tools, names, control_tokens(model), analysis=analysis)
    if model.harmony:
        return harmony_format(model, req)
    if not reads_calls(model):
        specials = control_tokens(model)
        grammar = chat_grammar(req, model.tool_format, thinking, prompt=prompt, specials=specials)
        if grammar is not None:
            return grammar
    return thinking_format(model, req, thinking, prompt)


def generate_constraint(model: ServedModel, req: GenerateRequest, prompt: str) -> str | None:
    """The grammar of a generate's output: its format's after free thinking (or gpt-oss's
    analysis); None when the runner's format (or nothing) holds it. Raw output is not read as
    thinking, so its format holds all of it."""
    if req.raw:
        return None
    if model.harmony:
        return harmony_format(model, req)
    return thinking_format(model, req, thinking_tags(model, req), prompt)


def thinking_format(
    model: ServedModel, req: Generation, tags: ThinkingTags | None, prompt: str
) -> str | None:
    """The grammar of a format that lets the model think first (None without a format, or
    without thinking: the runner then holds the whole output to the format)."""
    if req.format is None or tags is None:
        return None
    specials = control_tokens(model)
    return format_grammar(req.format, tags, prompt=prompt, specials=specials)  # or a 400


def harmony_format(model: ServedModel, req: Generation) -> str | None:
    """gpt-oss's format after its analysis; with think false the prompt opened the final
    channel instead, and the runner's format holds the whole output."""
    if req.format is None or req.think is False or getattr(req, "raw", False):
        return None
    return harmony.format_grammar(req.format, control_tokens(model))


def control_tokens(model: ServedModel) -> Mapping[str, int]:
    return model.facts.control_tokens if model.facts is not None else {}


def output_parser(
    model: ServedModel, req: Generation, prompt: str, *, tools: Sequence[Tool] = ()
) -> Parser:
    """The parser of this request's output, which the prompt leaves where it ends."""
    names = [t.function.name for t in tools]
    if model.harmony and not getattr(req, "raw", False):  # as Ollama: raw output stays raw
        return harmony.HarmonyParser(
            harmony.HarmonyNames(names),
            prefill=harmony.prefill(prompt),
            thinking=req.think is not False,
        )
    schemas = [t.to_template()["function"] for t in tools]
    return OutputParser(
        thinking=thinking_tags(model, req),
        prompt=prompt,
        tools=model.tool_format if tools else None,
        tool_names=names,
        tool_params={
            f["name"]: (f.get("parameters") or {}).get("properties") or {} for f in schemas
        },
    )
