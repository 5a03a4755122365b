"""Ember: a local LLM engine and server in Python, compatible with Ollama."""

from ember.errors import EmberError, ModelNotFoundError, OptionsError

__version__ = "0.1.0"
# The Ollama release whose API (and engine) Ember implements: /api/version reports it, because
# clients gate features on it; Ember's own version goes beside it.
OLLAMA_API_VERSION = "0.24.0"
__all__ = [
    "LLM",
    "OLLAMA_API_VERSION",
    "EmberError",
    "ModelNotFoundError",
    "OptionsError",
    "__version__",
]


def __getattr__(name: str) -> object:
    # LLM pulls in torch; keep `import ember` light for the CLI's --version.
    if name == "LLM":
        from ember.llm import LLM

        return LLM
    raise AttributeError(name)
