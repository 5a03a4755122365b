"""Errors the server answers with a status: every route turns them into `{"error": message}`
(OpenAI's routes into OpenAI's error object, Anthropic's into Anthropic's). Ollama's exact
wording where clients match on it."""

from ember.errors import EmberError

MAX_QUEUE_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"
RUNNER_STOPPED_MESSAGE = (
    "model runner has unexpectedly stopped, this may be due to resource limitations or an "
    "internal error, check ember server logs for details"
)


class APIError(EmberError):
    """A request that ends with `status` and `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def not_found(name: str) -> APIError:
    return APIError(404, f"model '{name}' not found")


def unsupported(name: str, capability: str) -> APIError:
    """A request for what the model cannot do: `"name" does not support chat` (Ollama's)."""
    return APIError(400, f'"{name}" does not support {capability}')


ANTHROPIC_PREFIX = "/v1/messages"  # Anthropic's routes: errors in Anthropic's shape
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def anthropic_error(status: int, message: str) -> dict[str, object]:
    """Anthropic's error object; a 4xx it has no name for is an invalid request."""
    fallback = "invalid_request_error" if 400 <= status < 500 else "api_error"
    kind = _ANTHROPIC_TYPES.get(status, fallback)
    return {"type": "error", "error": {"type": kind, "message": message}}


def openai_error(status: int, message: str, param: str | None = None) -> dict[str, object]:
    """OpenAI's error object."""
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def error_body(path: str, status: int, message: str, param: str | None = None) -> dict[str, object]:
    """The error object of the API path belongs to: Anthropic's, OpenAI's (/v1/) or Ollama's."""
    if is_anthropic_path(path):
        return anthropic_error(status, message)
    if path.startswith("/v1/"):
        return openai_error(status, message, param)
    return {"error": message}
