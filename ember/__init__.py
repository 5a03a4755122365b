"""Ember: a local LLM engine and server in Python, compatible with Ollama."""

from ember.errors import EmberError, ModelNotFoundError, OptionsError

__version__ = "0.1.0"
__all__ = ["LLM", "EmberError", "ModelNotFoundError", "OptionsError", "__version__"]


def __getattr__(name: str) -> object:
    # LLM pulls in torch; keep `import ember` light for the CLI's --version.
    if name == "LLM":
        from ember.llm import LLM

        return LLM
    raise AttributeError(name)
