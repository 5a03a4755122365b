"""Request bodies of the native API (/api/*) as pydantic models, with Ollama's field names and
defaults (OpenAI's: openai_api.py); `parse_body` (bodies.py) reads them.

As Go's JSON decoding: fields are strictly typed, null means "not given", unknown fields are
ignored. Only request bodies: responses and routes are the server's."""

import base64
import binascii
import json
import math
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    FiniteFloat,
    model_validator,
)

from ember.envconfig import parse_keep_alive

# parse_body and its errors live in bodies.py; routes import them from here with the models
from ember.server.bodies import RequestError as RequestError
from ember.server.bodies import field_path as field_path
from ember.server.bodies import parse_body as parse_body
from ember.server.bodies import validation_message as validation_message
from ember.server.prompt import Message


def _integral(value: Any) -> Any:
    # JSON clients send 4096.0 for an integer; Go's decoder takes it
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _toward_zero(value: Any) -> Any:
    # an integer option sent as 3.7 is 3: Ollama's Options.FromMap casts JSON's float64 to int
    return int(value) if isinstance(value, float) and math.isfinite(value) else value


def _base64(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return _strict_base64(value)
    except binascii.Error:
        raise ValueError("images must be base64-encoded") from None


def _strict_base64(text: str) -> bytes:
    # Go's base64.StdEncoding, which Ollama's []byte fields decode with: padded, no other
    # alphabet, but line breaks (`base64 img.png`'s 76 columns, CRLF) skipped wherever they are
    return base64.b64decode(text.replace("\r", "").replace("\n", ""), validate=True)


def image_bytes(data: str, param: str) -> bytes:
    """An image sent as base64 text; RequestError naming param when it is not base64."""
    try:
        return _strict_base64(data)
    except binascii.Error:
        raise RequestError("invalid image input: bad base64 data", param) from None


def _keep_alive(value: Any) -> Any:
    try:
        return parse_keep_alive(value)
    except ValueError:
        raise ValueError('must be a number of seconds or a duration such as "5m"') from None


def _think(value: Any) -> Any:
    if isinstance(value, bool) or value in ("high", "medium", "low", "max"):
        return value
    raise ValueError('must be true, false, "high", "medium", "low" or "max"')


def _format(value: Any) -> Any:
    # as Ollama: null and "" mean no format (LangChain's OllamaLLM sends "" on every request)
    if value is None or value == "":
        return None
    if value == "json" or isinstance(value, dict):
        return value
    raise ValueError('must be "json" or a JSON schema object')


def _strings(value: Any) -> Any:
    # a single string where a list of them is allowed ("stop": "\n", "input": "text")
    if isinstance(value, str):
        return [value] if value else []
    return value


def _token_ids(value: Any) -> Any:
    # OpenAI's logit_bias: {"<token id>": bias}; JSON object keys are strings
    if not isinstance(value, dict):
        return value
    try:
        return {int(k): v for k, v in value.items()}
    except ValueError:
        raise ValueError("logit_bias keys must be token ids (integers as strings)") from None


def parse_arguments(value: Any) -> Any:
    """Tool call arguments sent as a JSON string (OpenAI's form) as the object they hold."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            raise ValueError("tool call arguments must be a JSON object") from None
    return value


Int = Annotated[int, BeforeValidator(_integral)]
OptionInt = Annotated[int, BeforeValidator(_toward_zero)]
Image = Annotated[bytes, BeforeValidator(_base64)]
KeepAlive = Annotated[float, BeforeValidator(_keep_alive)]  # seconds; math.inf: forever
Think = Annotated[bool | str, BeforeValidator(_think)]
Format = Annotated[str | dict[str, Any] | None, BeforeValidator(_format)]
Strings = Annotated[list[str], BeforeValidator(_strings)]
Arguments = Annotated[dict[str, Any], BeforeValidator(parse_arguments)]
# finite: JSON has no infinity (Python's decoder makes one of 1e999), nor can the runner's request
LogitBias = Annotated[dict[int, FiniteFloat], BeforeValidator(_token_ids)]


class Body(BaseModel):
    """Every request model: strict types, unknown fields ignored, null taken as not given."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class Named(Body):
    """A request naming a model in `model`, or in the deprecated `name`."""

    model: str = ""
    name: str = Field("", exclude=True)

    @model_validator(mode="after")
    def _require_model(self) -> "Named":
        self.model = self.model or self.name
        if not self.model:
            raise ValueError("model is required")
        return self


# --- native API ---


class RequestOptions(Body):
    """Ollama's `options`: all optional; names it does not know are kept (model_extra) for the
    server to warn about and drop, as Ollama does."""

    model_config = ConfigDict(extra="allow")

    num_ctx: OptionInt | None = None
    num_batch: OptionInt | None = None
    num_gpu: OptionInt | None = None
    main_gpu: OptionInt | None = None
    use_mmap: bool | None = None
    num_thread: OptionInt | None = None
    num_keep: OptionInt | None = None
    seed: OptionInt | None = None
    num_predict: OptionInt | None = None
    top_k: OptionInt | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_last_n: OptionInt | None = None
    temperature: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: Strings | None = None
    draft_ngram: OptionInt | None = None
    draft_num_predict: OptionInt | None = None
    draft_model: str | None = None

    def given(self) -> dict[str, Any]:
        """The known options the request set, for ember.options.Options.parse."""
        return self.model_dump(exclude_unset=True, exclude_none=True, exclude=self.unknown())

    def unknown(self) -> set[str]:
        return set(self.model_extra or {})


class ToolCallFunction(Body):
    index: Int | None = None
    name: str
    arguments: Arguments = Field(default_factory=dict)


class ToolCall(Body):
    id: str = ""
    function: ToolCallFunction


class ChatMessage(Body):
    role: str
    content: str = ""
    thinking: str = ""
    images: list[Image] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_name: str = ""
    tool_call_id: str = ""

    @model_validator(mode="after")
    def _lower_role(self) -> "ChatMessage":
        self.role = self.role.lower()
        return self

    @classmethod
    def from_prompt(cls, m: Message) -> "ChatMessage":
        """A prompt message (as the /v1 translations make them) as a native one."""
        calls = [
            ToolCall.model_construct(
                id=c.get("id", ""),
                function=ToolCallFunction.model_construct(
                    name=c["function"]["name"], arguments=c["function"]["arguments"]
                ),
            )
            for c in m.tool_calls
        ]
        return cls.model_construct(
            role=m.role,
            content=m.content,
            thinking=m.thinking,
            images=list(m.images),
            tool_calls=calls,
            tool_name=m.tool_name,
            tool_call_id=m.tool_call_id,
        )

    def to_prompt(self) -> Message:
        calls = tuple(
            {"function": c.function.model_dump(exclude_none=True)} | ({"id": c.id} if c.id else {})
            for c in self.tool_calls
        )
        return Message(
            self.role,
            self.content,
            images=tuple(self.images),
            tool_calls=calls,
            thinking=self.thinking,
            tool_name=self.tool_name,
            tool_call_id=self.tool_call_id,
        )


class ToolFunction(Body):
    model_config = ConfigDict(extra="allow")  # kept: the template shows the model all of it

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class Tool(Body):
    model_config = ConfigDict(extra="allow")

    type: str = "function"
    function: ToolFunction

    def to_template(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Generation(Named):
    """Fields /api/generate and /api/chat share."""

    format: Format = None
    options: RequestOptions | None = None
    stream: bool = True
    keep_alive: KeepAlive | None = None
    think: Think | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool = False
    top_logprobs: Int = Field(0, ge=0, le=20)
    logit_bias: LogitBias = Field(default_factory=dict)  # Ember's extension, as OpenAI's
    debug_render_only: bool = Field(False, alias="_debug_render_only")


class GenerateRequest(Generation):
    prompt: str = ""
    suffix: str = ""
    system: str = ""
    template: str = ""
    context: list[Int] | None = None  # deprecated by Ollama; still honoured
    raw: bool = False
    images: list[Image] = Field(default_factory=list)


ToolChoice = str | dict[str, Any]  # "auto", "none", "required", or {"function": {"name": ...}}


class ChatRequest(Generation):
    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[Tool] = Field(default_factory=list)
    # Ember's extensions (Ollama has neither); /v1, /v1/responses and /v1/messages map theirs here
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    def chosen_tools(self) -> list[Tool]:
        """The tools tool_choice leaves: "none" hides them, a named function leaves that one."""
        choice = self.tool_choice
        if choice == "none":
            return []
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            chosen = [t for t in self.tools if t.function.name == name]
            if not chosen:
                raise RequestError(f"tool_choice names an unknown function {name!r}", "tool_choice")
            return chosen
        if choice not in (None, "auto", "required"):
            raise RequestError(f"invalid tool_choice {choice!r}", "tool_choice")
        if choice == "required" and not self.tools:  # a 400 at OpenAI and Anthropic too
            raise RequestError('tool_choice "required" needs at least one tool', "tool_choice")
        return self.tools


class EmbedRequest(Named):
    input: Strings = Field(default_factory=list)  # "" and [] both: no input
    truncate: bool | None = None
    dimensions: Int | None = None  # cuts only from 1 to the vector's length, as Ollama's
    keep_alive: KeepAlive | None = None
    options: RequestOptions | None = None


class EmbeddingRequest(Named):
    """The legacy /api/embeddings."""

    prompt: str = ""
    keep_alive: KeepAlive | None = None
    options: RequestOptions | None = None


def _documents(value: Any) -> Any:
    # Cohere's v1 also takes {"text": ...} objects where v2, Jina and llama-server take strings
    if isinstance(value, list):
        return [d["text"] if isinstance(d, dict) and "text" in d else d for d in value]
    return value


class RerankRequest(Named):
    """/api/rerank and /v1/rerank: llama-server's and Cohere's / Jina's body."""

    query: str = ""
    documents: Annotated[list[str], BeforeValidator(_documents)] = Field(default_factory=list)
    top_n: Int | None = Field(None, ge=0)  # 0 or none: every document
    return_documents: bool = False
    truncate: bool | None = None
    keep_alive: KeepAlive | None = None
    options: RequestOptions | None = None


class ShowRequest(Named):
    system: str = ""
    template: str = ""
    verbose: bool = False
    options: RequestOptions | None = None


class CreateRequest(Named):
    from_: str = Field("", alias="from")
    files: dict[str, str] = Field(default_factory=dict)  # file name -> "sha256:<hex>"
    adapters: dict[str, str] = Field(default_factory=dict)
    template: str = ""
    license: Strings = Field(default_factory=list)
    system: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    messages: list[ChatMessage] = Field(default_factory=list)
    quantize: str = ""
    quantization: str = Field("", exclude=True)  # deprecated name of quantize
    renderer: str = ""
    parser: str = ""
    requires: str = ""
    draft: str = ""  # a model that drafts for speculative decoding (the Modelfile's DRAFT)
    stream: bool = True

    @model_validator(mode="after")
    def _quantize(self) -> "CreateRequest":
        self.quantize = self.quantize or self.quantization
        return self


class CopyRequest(Body):
    source: str
    destination: str


class DeleteRequest(Named):
    pass


class PullRequest(Named):
    insecure: bool = False
    stream: bool = True


class PushRequest(PullRequest):
    pass
