"""Errors of the model store, the Modelfile parser and the registry client."""

from ember.errors import EmberError, ModelNotFoundError


class InvalidNameError(EmberError, ValueError):
    """A model name that is not `[host/][namespace/]model[:tag]` with allowed characters."""


class InvalidDigestError(EmberError, ValueError):
    """A digest that is not `sha256:` (or `sha256-`) followed by 64 lowercase hex digits."""


class StoreError(EmberError):
    """The store cannot do what was asked: a bad manifest, a missing blob, a path outside it."""


class BlobBusyError(StoreError):
    """Another writer holds the resumable partial file of this blob: a download of it is under
    way."""


class ManifestError(StoreError):
    """A manifest that is not valid JSON of the expected shape, or is too large."""


class BlobDigestError(StoreError):
    """Bytes whose sha256 is not the digest they were announced with."""


class BlobSizeError(StoreError):
    """A blob larger than its declared size or the store's quota, or shorter than declared."""


class ModelfileError(EmberError, ValueError):
    """A Modelfile that does not parse, or asks for something Ember does not support."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"(line {line}): {message}" if line else message)
        self.line = line


class CreateError(EmberError, ValueError):
    """A create request that cannot be carried out (bad files, unsupported quantization...)."""


class RegistryError(EmberError):
    """The registry refused a request, or answered with something that cannot be trusted."""


class RegistryNotFoundError(RegistryError, ModelNotFoundError):
    """The registry has no such model or layer (its 404): answered 404, as a missing local
    model, not as a server error."""
