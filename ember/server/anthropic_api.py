"""Request bodies of Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), and
their translation to Ember's native chat: messages, tools, tool_choice, thinking, options.

Parse them with api.parse_body; responses and routes are anthropic.py's."""

import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from ember.server.api import (
    Body,
    ChatMessage,
    ChatRequest,
    Int,
    RequestError,
    RequestOptions,
    Tool,
    ToolChoice,
    ToolFunction,
    image_bytes,
)
from ember.server.image_urls import NOTHING_FETCHED, Fetched, ImageRef, image_at
from ember.server.prompt import Message

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # as Anthropic accepts


def _blocks(value: Any) -> Any:
    # content (and system) may be a plain string or a list of blocks
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class ImageSource(Body):
    type: str  # base64 (media_type, data) or url
    media_type: str = ""
    data: str = ""
    url: str = ""


class Block(Body):
    """A text or image block: the content of a tool result, and of system."""

    type: str
    text: str = ""
    source: ImageSource | None = None


Blocks = Annotated[list[Block], BeforeValidator(_blocks)]


class ContentBlock(Block):
    """A block of a message: also tool_use (assistant), tool_result (user) and thinking."""

    id: str = ""  # tool_use
    name: str = ""
    input: dict[str, Any] = Field(default_factory=dict)
    tool_use_id: str = ""  # tool_result
    content: Blocks = Field(default_factory=list)
    is_error: bool = False
    thinking: str = ""


class MessageParam(Body):
    role: Literal["user", "assistant"]
    content: Annotated[list[ContentBlock], BeforeValidator(_blocks)]


class AnthropicTool(Body):
    type: str = "custom"
    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)


class AnthropicToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str = ""
    disable_parallel_tool_use: bool = False


class ThinkingConfig(Body):
    # adaptive and between_tools: the model thinks as its template lets it, with no budget
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Int | None = Field(None, ge=1)


class OutputFormat(Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Body):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Conversation(Body):
    """What /v1/messages and /v1/messages/count_tokens share: the prompt's parts."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: Blocks = Field(default_factory=list)
    tools: list[AnthropicTool] = Field(default_factory=list)
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None

    def native(self, fetched: Fetched = NOTHING_FETCHED, **fields: Any) -> ChatRequest:
        """The native chat request of this conversation (images named by URL taken from
        fetched), with fields (stream, options) added."""
        choice = self.tool_choice
        output = self.output_config
        return ChatRequest.model_construct(
            model=self.model,
            messages=[ChatMessage.from_prompt(m) for m in self.ollama_messages(fetched)],
            tools=[_native_tool(t, i) for i, t in enumerate(self.tools)],
            tool_choice=_native_choice(choice) if choice else None,
            parallel_tool_calls=not (choice and choice.disable_parallel_tool_use),
            think=self.ollama_think(),
            format=output.format.schema_ if output and output.format else None,
            **fields,
        )

    def estimated_tokens(self) -> int:
        """Ollama's estimate of the input tokens (a quarter of the characters of the system,
        roles, texts and tools, at least 1): a stream's message_start tells it before the
        runner's count comes with message_delta."""
        texts = [b.text for b in self.system]
        for m in self.messages:
            texts.append(m.role)
            for block in m.content:
                texts += [block.text, block.thinking, *(b.text for b in block.content)]
                texts.append(json.dumps(block.input) if block.input else "")
        for tool in self.tools:
            texts += [tool.name, tool.description, json.dumps(tool.input_schema)]
        return max(1, sum(len(t) for t in texts) // 4)

    def ollama_think(self) -> bool | str | None:
        """thinking as Ollama's think: enabled and disabled say it; otherwise (adaptive, none)
        output_config.effort as a level (xhigh is high), else None leaves it to the model."""
        kind = self.thinking.type if self.thinking else None
        if kind in ("enabled", "disabled"):
            return kind == "enabled"
        effort = self.output_config.effort if self.output_config else None
        return "high" if effort == "xhigh" else effort

    def image_urls(self) -> list[ImageRef]:
        """The images of the messages (and their tool results) with a url source, with where:
        for image_urls.fetch_images."""
        refs = []
        for i, m in enumerate(self.messages):
            for j, block in enumerate(m.content):
                where = f"messages[{i}].content[{j}]"
                nested = [(f"{where}.content[{k}]", b) for k, b in enumerate(block.content)]
                for at, b in [(where, block), *nested]:
                    if b.type == "image" and b.source and b.source.type == "url":
                        refs.append((b.source.url, f"{at}.source"))
        return refs

    def ollama_messages(self, fetched: Fetched = NOTHING_FETCHED) -> list[Message]:
        """system first, then each message: a user's tool_result blocks become tool messages
        (named after the tool_use they answer) before its other content."""
        system = _joined(b.text for b in self.system if b.type == "text")
        messages = [Message("system", system)] if system else []
        names: dict[str, str] = {}
        for i, m in enumerate(self.messages):
            names.update((b.id, b.name) for b in m.content if b.type == "tool_use")
            messages += _ollama_messages(m, names, f"messages[{i}]", fetched)
        return messages


class MessagesRequest(Conversation):
    max_tokens: Int = Field(ge=1)
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int | None = None
    stop_sequences: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None  # accepted and ignored, as Anthropic's user_id

    def thinking_budget(self) -> int | None:
        """budget_tokens of enabled thinking: required, and below max_tokens (as Anthropic;
        its minimum of 1024 is not kept, for small local models)."""
        if self.thinking is None or self.thinking.type != "enabled":
            return None
        budget = self.thinking.budget_tokens
        if budget is None:
            raise RequestError("thinking.budget_tokens is required when thinking is enabled")
        if budget >= self.max_tokens:
            raise RequestError("thinking.budget_tokens must be less than max_tokens")
        return budget

    def ollama_options(self) -> RequestOptions:
        given = {
            "num_predict": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": self.stop_sequences or None,
        }
        return RequestOptions.model_validate({k: v for k, v in given.items() if v is not None})


def _joined(texts: Iterable[str]) -> str:
    return "\n".join(t for t in texts if t)


def _native_tool(tool: AnthropicTool, index: int) -> Tool:
    if tool.type != "custom":  # Anthropic's server tools (web search, code execution) run there
        raise RequestError(f"unsupported tool type {tool.type!r}", f"tools[{index}].type")
    function = ToolFunction(
        name=tool.name, description=tool.description, parameters=tool.input_schema
    )
    return Tool(function=function)


def _native_choice(choice: AnthropicToolChoice) -> ToolChoice:
    if choice.type == "tool":
        if not choice.name:
            raise RequestError("tool_choice of type tool needs a name", "tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _ollama_messages(
    m: MessageParam, names: dict[str, str], param: str, fetched: Fetched
) -> list[Message]:
    texts: list[str] = []
    images: list[bytes] = []
    calls: list[dict[str, Any]] = []
    thinking = ""
    results: list[Message] = []
    for j, block in enumerate(m.content):
        where = f"{param}.content[{j}]"
        if block.type in ("text", "image"):
            _add_block(block, texts, images, where, fetched)
        elif block.type == "tool_use" and m.role == "assistant":
            calls.append(_tool_call(block, where))
        elif block.type == "tool_result" and m.role == "user":
            results.append(_tool_result(block, names, where, fetched))
        elif block.type == "thinking" and m.role == "assistant":
            thinking += block.thinking
        elif block.type != "redacted_thinking":  # encrypted: nothing a local model can read
            raise RequestError(f"unsupported content block type {block.type!r} here", where)
    text = _joined(texts)
    if not (text or images or calls or thinking):
        # tool results alone are those; an empty user turn stays one (as Ollama's and Ember's
        # other routes keep it), an empty assistant one says nothing (Anthropic: no prefill)
        return results if results or m.role == "assistant" else [Message("user", "")]
    message = Message(
        m.role, text, images=tuple(images), tool_calls=tuple(calls), thinking=thinking
    )
    return [*results, message]


def _add_block(
    block: Block, texts: list[str], images: list[bytes], where: str, fetched: Fetched
) -> None:
    if block.type == "text":
        texts.append(block.text)
    elif block.type == "image":
        images.append(_image(block.source, f"{where}.source", fetched))
    else:
        raise RequestError(f"unsupported content block type {block.type!r} here", where)


def _image(source: ImageSource | None, where: str, fetched: Fetched) -> bytes:
    if source is not None and source.type == "url":
        return image_at(source.url, where, fetched)
    if source is None or source.type != "base64":
        raise RequestError("invalid image source: use a base64 or url source", where)
    if source.media_type not in IMAGE_TYPES:
        kinds = ", ".join(IMAGE_TYPES)
        raise RequestError(f"invalid image media_type {source.media_type!r}: use {kinds}", where)
    return image_bytes(source.data, where)


def _tool_call(block: ContentBlock, where: str) -> dict[str, Any]:
    if not block.id or not block.name:
        raise RequestError("a tool_use block needs an id and a name", where)
    return {"id": block.id, "function": {"name": block.name, "arguments": block.input}}


def _tool_result(
    block: ContentBlock, names: dict[str, str], where: str, fetched: Fetched
) -> Message:
    name = names.get(block.tool_use_id, "")  # a result of an earlier turn's call: no name
    texts: list[str] = []
    images: list[bytes] = []
    for k, part in enumerate(block.content):
        _add_block(part, texts, images, f"{where}.content[{k}]", fetched)
    text = _joined(texts)
    if block.is_error:  # the model should know the call failed
        text = f"Error: {text}"
    return Message(
        "tool", text, images=tuple(images), tool_name=name, tool_call_id=block.tool_use_id
    )
