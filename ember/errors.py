"""Errors Ember raises for bad input: each carries a message a user can act on."""


class EmberError(Exception):
    """Base of every error Ember raises on purpose."""


class ModelNotFoundError(EmberError):
    """A model name or path that resolves to nothing usable."""


class OptionsError(EmberError, ValueError):
    """An unknown option name, a wrong type or an impossible value."""


class GenerationError(EmberError):
    """A generation that failed while it ran (the engine reports why)."""
