"""Image manifests (Docker/OCI schema 2, as Ollama writes them) and the layer media types.

Parsing is strict because manifests come from registries: every digest is validated before any
path is built from it, sizes are non-negative integers, and the JSON is bounded in size.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ember.gofuncs import go_json_text
from ember.store.errors import InvalidDigestError, ManifestError
from ember.store.names import Digest

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"

MEDIA_PREFIX = "application/vnd.ollama.image."
MEDIA_MODEL = MEDIA_PREFIX + "model"
MEDIA_ADAPTER = MEDIA_PREFIX + "adapter"
MEDIA_PROJECTOR = MEDIA_PREFIX + "projector"
MEDIA_TEMPLATE = MEDIA_PREFIX + "template"
MEDIA_PROMPT = MEDIA_PREFIX + "prompt"  # the template's media type before Ollama 0.1.x renamed it
MEDIA_SYSTEM = MEDIA_PREFIX + "system"
MEDIA_PARAMS = MEDIA_PREFIX + "params"
MEDIA_LICENSE = MEDIA_PREFIX + "license"
MEDIA_MESSAGES = MEDIA_PREFIX + "messages"

MAX_MANIFEST_BYTES = 4 << 20
MAX_LAYERS = 4096
MAX_BLOB_SIZE = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Layer:
    """One content-addressed blob of a model and what it holds."""

    media_type: str
    digest: Digest
    size: int
    source: str = ""  # Ollama's `from`: the model or file this layer was taken from

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": str(self.digest)}
        out["size"] = self.size
        if self.source:
            out["from"] = self.source
        return out

    @classmethod
    def from_json(cls, value: Any, where: str) -> "Layer":
        if not isinstance(value, dict):
            raise ManifestError(f"manifest {where} must be an object")
        media_type = value.get("mediaType")
        size = value.get("size")
        source = value.get("from", "")
        if not isinstance(media_type, str) or not media_type:
            raise ManifestError(f"manifest {where} has no mediaType")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_BLOB_SIZE:
            raise ManifestError(f"manifest {where} size must be a non-negative integer")
        if not isinstance(source, str):
            raise ManifestError(f"manifest {where} 'from' must be a string")
        try:
            digest = Digest.parse(value.get("digest"))  # type: ignore[arg-type]
        except InvalidDigestError as e:
            raise ManifestError(f"manifest {where}: {e}") from None
        return cls(media_type, digest, size, source)


@dataclass(frozen=True, slots=True)
class Manifest:
    """A model: its config blob (JSON metadata) and its layers, in order."""

    config: Layer
    layers: tuple[Layer, ...]

    @property
    def size(self) -> int:
        """Bytes of all blobs, config included (what /api/tags reports)."""
        return self.config.size + sum(layer.size for layer in self.layers)

    def blobs(self) -> Iterator[Layer]:
        """The layers then the config: every blob the model needs."""
        yield from self.layers
        yield self.config

    def digests(self) -> set[Digest]:
        return {layer.digest for layer in self.blobs()}

    def first(self, media_type: str) -> Layer | None:
        return next((layer for layer in self.layers if layer.media_type == media_type), None)

    def to_bytes(self) -> bytes:
        """Compact JSON with a newline, in the field order of Ollama's Go encoder."""
        body = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": self.config.to_json(),
            "layers": [layer.to_json() for layer in self.layers],
        }
        return go_json(body)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        """Parses and validates a manifest; raises ManifestError."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"manifest is larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            body = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise ManifestError(f"manifest is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ManifestError("manifest must be a JSON object")
        if body.get("schemaVersion", 2) != 2:
            raise ManifestError(f"manifest schemaVersion {body.get('schemaVersion')!r} is not 2")
        layers = body.get("layers")
        if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
            raise ManifestError(f"manifest layers must be a list of at most {MAX_LAYERS}")
        config = Layer.from_json(body.get("config"), "config")
        return cls(config, tuple(Layer.from_json(v, f"layer {i}") for i, v in enumerate(layers)))


def go_json(value: Any) -> bytes:
    """JSON as Go's json.Encoder writes it: compact, HTML characters escaped, newline ended.

    Kept so that blobs we write hash the same as Ollama's for the same content.
    """
    return (go_json_text(value) + "\n").encode()
