"""Request bodies of OpenAI's API (/v1/chat/completions, /v1/completions, /v1/embeddings), and
their translation to Ollama's options, format, think and messages, as Ollama's middleware does.

Parse them with api.parse_body; responses and routes are the server's."""

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from ember.server.api import (
    Body,
    Int,
    KeepAlive,
    LogitBias,
    RequestError,
    RequestOptions,
    Strings,
    Tool,
    image_bytes,
    parse_arguments,
)
from ember.server.image_urls import NOTHING_FETCHED, Fetched, ImageRef, image_at, is_url
from ember.server.prompt import Message

# Ollama's: four image types, or a blank one ("to match /api/chat's unadorned base64")
_DATA_URI = (
    *(f"data:image/{kind};base64," for kind in ("jpeg", "jpg", "png", "webp")),
    "data:;base64,",
)


def _url(value: Any) -> Any:
    # image_url may be the URL itself or {"url": ...}
    return {"url": value} if isinstance(value, str) else value


def _parts(value: Any) -> Any:
    # content may be a plain string or a list of parts; one form keeps errors free of unions
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class ImageUrl(Body):
    url: str


class ContentPart(Body):
    type: str
    text: str = ""
    image_url: Annotated[ImageUrl, BeforeValidator(_url)] | None = None


class OpenAIFunctionCall(Body):
    name: str
    arguments: str = ""  # a JSON string, as OpenAI sends it


class OpenAIToolCall(Body):
    id: str = ""
    type: str = "function"
    function: OpenAIFunctionCall


class OpenAIMessage(Body):
    role: str
    content: Annotated[list[ContentPart], BeforeValidator(_parts)] = Field(default_factory=list)
    name: str = ""
    tool_calls: list[OpenAIToolCall] = Field(default_factory=list)
    tool_call_id: str = ""
    reasoning: str = ""  # thinking of an earlier turn, as Ollama returns it


class StreamOptions(Body):
    include_usage: bool = False


class JsonSchema(Body):
    name: str = ""
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:  # a 400 at OpenAI too
            raise ValueError("a response_format of type json_schema needs its json_schema")
        return self


def _lower_or_float(value: Any) -> Any:
    if isinstance(value, str):
        return value.lower() or "float"
    return value


# OpenAI's efforts and clients' own tiers past both ends of Ollama's think levels: clamped to
# the nearest, as Ollama's thinkFromReasoningEffort
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]
_CLAMPED_EFFORTS = {"minimal": "low", "xhigh": "max", "ultra": "max"}


def think_of_effort(effort: str | None) -> bool | str | None:
    """A reasoning effort as Ollama's think: "none" turns it off, None leaves it unset."""
    if effort is None:
        return None
    return False if effort == "none" else _CLAMPED_EFFORTS.get(effort, effort)


class Reasoning(Body):
    effort: Effort | None = None


MAX_CHOICES = 8

# OpenAI fields that would change the output and that Ember does not honour, each with the
# test of its "no effect" values: any other value is a 400 naming the field, never ignored.
# Fields that do not change the output (user, metadata, store, service_tier, prediction, ...)
# are accepted and ignored, as every unknown field is.
IsDefault = Callable[[Any], bool]
UNHONOURED_CHAT: dict[str, IsDefault] = {
    "functions": lambda v: v == [],  # the legacy form of tools
    "function_call": lambda v: v in ("none", "auto"),  # the legacy form of tool_choice
    "audio": lambda v: False,
    "modalities": lambda v: v == ["text"],
    "web_search_options": lambda v: False,
    "verbosity": lambda v: v == "medium",
}
UNHONOURED_COMPLETIONS: dict[str, IsDefault] = {
    "best_of": lambda v: v == 1,
}


def refuse_unhonoured(given: dict[str, Any], table: dict[str, IsDefault]) -> None:
    """RequestError (400) for the first field of table that given sets to a value with effect
    (null is "not given", as everywhere)."""
    for name, is_default in table.items():
        if given.get(name) is not None and not is_default(given[name]):
            raise RequestError(
                f'"{name}" is not supported by Ember; remove it (or send its default)', name
            )


def sampling_defaults(temperature: float | None, top_p: float | None) -> dict[str, float]:
    """temperature and top_p with OpenAI's defaults (1.0) where absent, as Ollama's middleware
    sets them rather than the model's own."""
    return {
        "temperature": 1.0 if temperature is None else temperature,
        "top_p": 1.0 if top_p is None else top_p,
    }


def openai_options(given: dict[str, Any], extra: RequestOptions | None) -> dict[str, Any]:
    """Ollama's options of an OpenAI request: the fields it gives (None: not given), over the
    native `options` it may carry (Ember's extension), over OpenAI's defaults (temperature and
    top_p 1.0), as Ollama's middleware sets them."""
    native = extra.model_dump(exclude_unset=True) if extra else {}
    chosen = {k: v for k, v in given.items() if v is not None}
    return sampling_defaults(None, None) | native | chosen


class Sampling(Body):
    """Sampling fields /v1/chat/completions and /v1/completions share."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Int | None = None
    seed: Int | None = None
    stop: Strings | None = None
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    n: Int = Field(1, ge=1, le=MAX_CHOICES)  # choices: sequences that share the batch
    logit_bias: LogitBias = Field(default_factory=dict)  # token id -> bias in [-100, 100]
    # Ember's extensions, as the native API's (OpenAI's client: extra_body): Ollama's options,
    # under the OpenAI fields (num_ctx had no way through /v1: Ollama's issue #2722), and how
    # long the model stays loaded after the request
    options: RequestOptions | None = None
    keep_alive: KeepAlive | None = None
    debug_render_only: bool = Field(False, alias="_debug_render_only")  # as Ollama's /v1

    def ollama_options(self) -> dict[str, Any]:
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "num_predict": self.max_tokens,
            "seed": self.seed,
            "stop": self.stop,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
        }
        return openai_options(given, self.options)


class ChatCompletionRequest(Sampling):
    messages: list[OpenAIMessage]
    max_completion_tokens: Int | None = None  # newer clients send this for max_tokens
    response_format: ResponseFormat | None = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None  # "none", "auto", "required", or a function
    parallel_tool_calls: bool = True
    reasoning_effort: Effort | None = None
    reasoning: Reasoning | None = None
    logprobs: bool = False
    top_logprobs: Int = Field(0, ge=0, le=20)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unhonoured(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_unhonoured(data, UNHONOURED_CHAT)
            if not data.get("messages"):  # none, or missing: Ollama's middleware's words
                raise RequestError("[] is too short - 'messages'", "messages")
        return data

    def ollama_options(self) -> dict[str, Any]:
        options = super().ollama_options()
        if self.max_tokens is None and self.max_completion_tokens is not None:
            options["num_predict"] = self.max_completion_tokens
        return options

    def ollama_tools(self) -> tuple[list[Tool], str | dict[str, Any] | None]:
        """The native request's tools and tool_choice: a function named as chat names it or as
        the Responses API does ({"type": "function", "name"}); allowed_tools as the tools it
        lists under its mode."""
        choice = self.tool_choice
        if not isinstance(choice, dict):
            return self.tools, choice
        return native_tool_choice(self.tools, choice, choice.get("allowed_tools"))

    def ollama_format(self) -> str | dict[str, Any] | None:
        """response_format as Ollama's format: "json", a JSON schema, or None."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return "json"
        assert fmt.json_schema is not None  # ResponseFormat requires it
        return fmt.json_schema.schema_

    def ollama_think(self) -> bool | str | None:
        """reasoning.effort (or reasoning_effort) as Ollama's think: the object first, as
        Ollama's FromChatRequest."""
        effort = (self.reasoning.effort if self.reasoning else None) or self.reasoning_effort
        return think_of_effort(effort)

    def image_urls(self) -> list[ImageRef]:
        """The images named by URL (not data URIs), with where: for image_urls.fetch_images."""
        return [
            (part.image_url.url, _image_param(i, j))
            for i, m in enumerate(self.messages)
            for j, part in enumerate(m.content)
            if part.type == "image_url" and part.image_url and is_url(part.image_url.url)
        ]

    def ollama_messages(self, fetched: Fetched = NOTHING_FETCHED) -> list[Message]:
        """The messages as Ollama's: content parts joined, data-URI images decoded (URL ones
        taken from fetched), tool call arguments parsed, a tool result named after the call it
        answers."""
        names: dict[str, str] = {}
        messages = []
        for i, m in enumerate(self.messages):
            for call in m.tool_calls:
                names[call.id] = call.function.name
            messages.append(_ollama_message(m, names, i, fetched))
        return messages


def _image_param(message: int, part: int) -> str:
    return f"messages[{message}].content[{part}].image_url"


def _ollama_message(
    m: OpenAIMessage, names: dict[str, str], index: int, fetched: Fetched
) -> Message:
    texts: list[str] = []
    images: list[bytes] = []
    for j, part in enumerate(m.content):
        if part.type == "text":
            texts.append(part.text)
        elif part.type == "image_url" and part.image_url is not None:
            param = _image_param(index, j)
            images.append(data_uri_image(part.image_url.url, param, fetched))
        else:
            raise RequestError(f"unsupported content part type {part.type!r}", "messages")
    calls = tuple(_ollama_call(c, index) for c in m.tool_calls)
    tool_name = (m.name or names.get(m.tool_call_id, "")) if m.role == "tool" else ""
    role = m.role.lower()
    return Message(
        # OpenAI's newer name for system, which most templates would leave out (as /v1/responses)
        "system" if role == "developer" else role,
        "\n".join(t for t in texts if t),
        images=tuple(images),
        tool_calls=calls,
        thinking=m.reasoning,
        tool_name=tool_name,
        tool_call_id=m.tool_call_id,
    )


def data_uri_image(url: str, param: str, fetched: Fetched = NOTHING_FETCHED) -> bytes:
    """The bytes of an image sent as a base64 data URI, or fetched from its URL (only from
    the hosts EMBER_ALLOW_IMAGE_URLS lists; by default none, as Ollama)."""
    if is_url(url):
        return image_at(url, param, fetched)
    prefix = next((p for p in _DATA_URI if url.startswith(p)), None)
    if prefix is None:
        raise RequestError("invalid image input: only base64 data URIs are supported", param)
    return image_bytes(url[len(prefix) :], param)


def _ollama_call(call: OpenAIToolCall, index: int) -> dict[str, Any]:
    try:
        args = parse_arguments(call.function.arguments)
    except ValueError as e:
        raise RequestError(str(e), f"messages[{index}].tool_calls") from None
    if not isinstance(args, dict):
        raise RequestError("tool call arguments must be a JSON object", "messages")
    function = {"name": call.function.name, "arguments": args}
    return {"id": call.id, "function": function} if call.id else {"function": function}


class CompletionRequest(Sampling):
    prompt: str  # a string only, as Ollama's /v1/completions
    suffix: str = ""
    echo: bool = False
    logprobs: Int | None = Field(None, ge=0, le=20)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unhonoured(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_unhonoured(data, UNHONOURED_COMPLETIONS)
        return data


def _inputs(value: Any) -> Any:
    # one string is one input, "" too (Ollama's middleware makes it [""]); only [] is no input
    return [value] if isinstance(value, str) else value


class EmbeddingsRequest(Body):
    model: str
    input: Annotated[list[str], BeforeValidator(_inputs)]
    dimensions: Int | None = None  # as /api/embed's: only one under the vector's length cuts
    encoding_format: Annotated[
        Literal["float", "base64"], BeforeValidator(_lower_or_float)
    ] = "float"  # any case, and "" for float, as Ollama's


def native_tool_choice(
    tools: list[Tool], choice: dict[str, Any], allowed: Any
) -> tuple[list[Tool], str | dict[str, Any]]:
    """An object tool_choice of OpenAI's as the native request's tools and tool_choice: a named
    function, or "allowed_tools" (allowed: its {"mode": "auto" | "required", "tools": [...]})
    as the tools it lists, in the request's order, and its mode. Other types (custom tools,
    hosted ones) are a 400 naming them."""
    kind = choice.get("type", "function")
    name = _function_name(choice)
    if kind == "function" and name is not None:
        return tools, {"function": {"name": name}}
    if kind != "allowed_tools":
        raise RequestError(f"tool_choice of type {kind!r} is not supported", "tool_choice")
    listed = allowed.get("tools") if isinstance(allowed, dict) else None
    mode = allowed.get("mode") if isinstance(allowed, dict) else None
    if mode not in ("auto", "required") or not isinstance(listed, list):
        raise RequestError(
            'allowed_tools needs a mode ("auto" or "required") and a list of tools', "tool_choice"
        )
    names = [_function_name(t) for t in listed]
    known = {t.function.name for t in tools}
    for name in names:
        if name not in known:
            raise RequestError(f"allowed_tools names an unknown function {name!r}", "tool_choice")
    return [t for t in tools if t.function.name in names], mode


def _function_name(entry: Any) -> str | None:
    """The function an entry names, as chat writes it ({"function": {"name"}}) or the Responses
    API ({"name"})."""
    if not isinstance(entry, dict):
        return None
    inner = entry.get("function")
    name = inner.get("name") if isinstance(inner, dict) else entry.get("name")
    return name if isinstance(name, str) else None
