"""Request bodies of OpenAI's Responses API (/v1/responses) and their translation to the native
chat request: input items to messages (as Ollama's openai/responses.go), tools, tool_choice,
text.format, reasoning and sampling fields. Fields that would change the answer but that Ember
does not implement are refused by name. Responses and routes are responses.py's."""

from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from ember.server.api import (
    Body,
    ChatMessage,
    ChatRequest,
    Int,
    KeepAlive,
    RequestError,
    RequestOptions,
    Strings,
    Tool,
    ToolFunction,
    parse_arguments,
)
from ember.server.image_urls import NOTHING_FETCHED, Fetched, ImageRef, is_url
from ember.server.openai_api import (
    Effort,
    data_uri_image,
    native_tool_choice,
    openai_options,
    sampling_defaults,
    think_of_effort,
)
from ember.server.prompt import Message

# Fields that do not change what the model writes: accepted and left aside.
_IGNORED_FIELDS = frozenset(
    {
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "service_tier",
        "stream_options",
    }
)
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _text_parts(value: Any) -> Any:
    # content (and a call's output) may be a plain string or a list of parts
    return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


def _items(value: Any) -> Any:
    # input may be a plain string: one user message
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return value


class InputPart(Body):
    """A part of a message's content, a call's output, or a reasoning item's summary."""

    type: str
    text: str = ""
    refusal: str = ""
    image_url: str = ""
    file_id: str = ""


Parts = Annotated[list[InputPart], BeforeValidator(_text_parts)]


class InputItem(Body):
    """One input item; `type` says which fields it uses (a message may leave `type` out)."""

    type: str = ""
    role: str = ""
    content: Parts = Field(default_factory=list)  # message; reasoning's reasoning_text
    call_id: str = ""  # function_call, function_call_output
    name: str = ""  # function_call
    arguments: str = ""  # function_call: a JSON string
    output: Parts = Field(default_factory=list)  # function_call_output
    summary: list[InputPart] = Field(default_factory=list)  # reasoning
    encrypted_content: str = ""  # reasoning: ours hold the thinking as it is

    def kind(self) -> str:
        return self.type or ("message" if self.role else "")


class FunctionTool(Body):
    model_config = ConfigDict(extra="allow")  # kept: the template shows the model all of it

    type: str
    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None


class TextFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str = ""
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None
    description: str = ""


class TextConfig(Body):
    format: TextFormat | None = None
    verbosity: str | None = None  # a hint; Ember's models take none


class ReasoningConfig(Body):
    effort: Effort | None = None
    summary: str | None = None  # the whole thinking is the summary


class ResponsesRequest(Body):
    model_config = ConfigDict(extra="allow")  # names not below: refused (check_supported)

    model: str
    input: Annotated[list[InputItem], BeforeValidator(_items)] = Field(default_factory=list)
    instructions: str = ""
    previous_response_id: str = ""
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: Int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    seed: Int | None = None
    stop: Strings | None = None
    top_logprobs: Int = Field(0, ge=0, le=20)
    include: list[str] = Field(default_factory=list)
    store: bool = True
    stream: bool = False
    background: bool = False
    truncation: Literal["auto", "disabled"] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    user: str = ""
    options: RequestOptions | None = None  # Ember's extensions, as on /v1/chat/completions
    keep_alive: KeepAlive | None = None

    def check_supported(self) -> None:
        """RequestError naming what Ember would otherwise silently not do."""
        unsupported = sorted(set(self.model_extra or {}) - _IGNORED_FIELDS)
        if self.background:
            unsupported.append("background")
        if unsupported:
            names = ", ".join(unsupported)
            raise RequestError(f"unsupported field(s) on /v1/responses: {names}", unsupported[0])
        for i, tool in enumerate(self.tools):
            if tool.type != "function":
                raise RequestError(
                    f"tool type {tool.type!r} is not supported: only function tools", f"tools[{i}]"
                )
            if not tool.name:
                raise RequestError("a function tool needs a name", f"tools[{i}].name")

    def native(self, history: list[InputItem], fetched: Fetched = NOTHING_FETCHED) -> ChatRequest:
        """The native chat request: the instructions, then history, then this input (images
        named by URL taken from fetched)."""
        system = [Message("system", self.instructions)] if self.instructions else []
        messages = system + prompt_messages(history + self.input, fetched)
        if not messages:
            raise RequestError("input is required", "input")
        wants_logprobs = LOGPROBS_INCLUDE in self.include or self.top_logprobs > 0
        tools, tool_choice = self._native_tools()
        return ChatRequest.model_construct(
            model=self.model,
            messages=[ChatMessage.from_prompt(m) for m in messages],
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            format=self._native_format(),
            options=RequestOptions.model_validate(self._options()),
            stream=self.stream,
            think=self._think(),
            truncate=None if self.truncation is None else self.truncation == "auto",
            logprobs=wants_logprobs,
            top_logprobs=self.top_logprobs,
            keep_alive=self.keep_alive,
        )

    def echo(self) -> dict[str, Any]:
        """The request's fields that the response object repeats."""
        fmt = self.text.format if self.text else None
        reasoning = self.reasoning or ReasoningConfig()
        return {
            "instructions": self.instructions or None,
            "previous_response_id": self.previous_response_id or None,
            "tools": [t.model_dump(exclude_unset=True) for t in self.tools],
            "tool_choice": self.tool_choice or "auto",
            "parallel_tool_calls": self.parallel_tool_calls,
            **sampling_defaults(self.temperature, self.top_p),
            "text": {"format": _format_echo(fmt)},
            "reasoning": {"effort": reasoning.effort, "summary": reasoning.summary},
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": None,
            "metadata": self.metadata,
            "store": self.store,
            "truncation": self.truncation or "auto",  # Ember drops the oldest turns to fit
            "background": False,
            "service_tier": "default",
            "top_logprobs": self.top_logprobs,
            "user": self.user or None,
        }

    def _options(self) -> dict[str, Any]:
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "num_predict": self.max_output_tokens,
            "seed": self.seed,
            "stop": self.stop,
        }
        return openai_options(given, self.options)

    def _native_tools(self) -> tuple[list[Tool], str | dict[str, Any] | None]:
        """The native request's tools and tool_choice (allowed_tools written flat here)."""
        tools, choice = [_native_tool(t) for t in self.tools], self.tool_choice
        if choice is None or isinstance(choice, str):
            return tools, choice
        return native_tool_choice(tools, choice, choice)

    def _native_format(self) -> str | dict[str, Any] | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return "json"
        return fmt.schema_ or "json"

    def _think(self) -> bool | str | None:
        return think_of_effort(self.reasoning.effort if self.reasoning else None)


def _format_echo(fmt: TextFormat | None) -> dict[str, Any]:
    if fmt is None:
        return {"type": "text"}
    return fmt.model_dump(by_alias=True, exclude_defaults=True) | {"type": fmt.type}


def _native_tool(tool: FunctionTool) -> Tool:
    function = ToolFunction(
        name=tool.name, description=tool.description, parameters=tool.parameters
    )
    return Tool(type="function", function=function)


# --- input items as chat messages ---


def image_urls(items: list[InputItem]) -> list[ImageRef]:
    """The input images of items named by URL (not data URIs), with where: for fetch_images."""
    return [
        (part.image_url, f"input[{i}].content[{j}].image_url")
        for i, item in enumerate(items)
        if item.kind() == "message"
        for j, part in enumerate(item.content)
        if part.type == "input_image" and part.image_url and is_url(part.image_url)
    ]


def prompt_messages(items: list[InputItem], fetched: Fetched = NOTHING_FETCHED) -> list[Message]:
    """Items as chat messages, as Ollama does: function calls join the assistant message before
    them, a call's output is a tool message named after its call, a reasoning item becomes the
    thinking of the assistant message that follows it."""
    messages: list[Message] = []
    names: dict[str, str] = {}  # call_id -> function name
    thinking = ""
    for i, item in enumerate(items):
        kind = item.kind()
        if kind == "reasoning":
            thinking += _reasoning_text(item)
            continue
        if kind == "message":
            message = _message(item, i, fetched)
        elif kind == "function_call":
            names[item.call_id] = item.name
            message = _with_call(messages, item, i)
        elif kind == "function_call_output":
            text = _text(item.output, f"input[{i}].output")
            name = names.get(item.call_id, "")
            message = Message("tool", text, tool_name=name, tool_call_id=item.call_id)
        else:
            raise RequestError(_unknown_item(kind), f"input[{i}].type")
        if thinking and message.role == "assistant":
            message, thinking = replace(message, thinking=thinking), ""
        messages.append(message)
    if thinking:
        messages.append(Message("assistant", thinking=thinking))
    return messages


def _unknown_item(kind: str) -> str:
    if not kind:
        return "an input item needs a type"
    return f"input item type {kind!r} is not supported"


def _message(item: InputItem, index: int, fetched: Fetched) -> Message:
    role = item.role.lower()
    if role not in ("user", "assistant", "system", "developer"):
        raise RequestError(f"invalid role {item.role!r}", f"input[{index}].role")
    images = tuple(
        _image(part, f"input[{index}].content[{j}]", fetched)
        for j, part in enumerate(item.content)
        if part.type == "input_image"
    )
    text = _text(item.content, f"input[{index}].content")
    return Message("system" if role == "developer" else role, text, images=images)


def _text(parts: list[InputPart], param: str) -> str:
    """The parts' text joined; images are taken by the caller, other parts are refused."""
    texts = []
    for j, part in enumerate(parts):
        if part.type in ("input_text", "output_text", "text"):
            texts.append(part.text)
        elif part.type == "refusal":
            texts.append(part.refusal)
        elif part.type != "input_image":
            raise RequestError(f"content part type {part.type!r} is not supported", f"{param}[{j}]")
    return "\n".join(t for t in texts if t)


def _image(part: InputPart, param: str, fetched: Fetched) -> bytes:
    if not part.image_url:
        raise RequestError("an input_image needs an image_url (a base64 data URI)", param)
    return data_uri_image(part.image_url, f"{param}.image_url", fetched)


def _with_call(messages: list[Message], item: InputItem, index: int) -> Message:
    """An assistant message with item's call: the one just before it, or a new one."""
    try:
        arguments = parse_arguments(item.arguments)
    except ValueError as err:
        raise RequestError(str(err), f"input[{index}].arguments") from None
    if not isinstance(arguments, dict):
        raise RequestError("function call arguments must be a JSON object", f"input[{index}]")
    call: dict[str, Any] = {"function": {"name": item.name, "arguments": arguments}}
    if item.call_id:  # the template may show it (a call's .ID)
        call["id"] = item.call_id
    if messages and messages[-1].role == "assistant":
        last = messages.pop()
        return replace(last, tool_calls=(*last.tool_calls, call))
    return Message("assistant", tool_calls=(call,))


def _reasoning_text(item: InputItem) -> str:
    texts = [p.text for p in item.content if p.type == "reasoning_text"]
    texts = texts or [p.text for p in item.summary]
    return "\n".join(texts) or item.encrypted_content
