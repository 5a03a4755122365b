"""Errors the server answers with a status: every route turns them into `{"error": message}`
(OpenAI's routes into OpenAI's error object). Ollama's exact wording where clients match on it."""

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
