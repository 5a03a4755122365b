"""A prompt with images as the runner's inputs (Ollama's NewSequence + PostTokenize): the text is
split at its [img-N] tags, special tokens go only on the first piece, each image is encoded once
and replaced by the model's span of placeholder tokens, which must share one batch."""

import base64
import binascii
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ember.errors import EmberError
from ember.model.base import ImageSpan
from ember.tokenizer import Tokenizer

_TAG = re.compile(r"\[img-(\d+)\]")


@runtime_checkable
class ImageModel(Protocol):
    def encode_multimodal(self, data: bytes) -> Any:
        """An image's encoding (embeddings); raises an EmberError for a bad image."""

    def image_span(self, encoded: Any) -> ImageSpan:
        """The span of an encoded image; its length may depend on the image's size."""


@dataclass
class PromptInputs:
    tokens: list[int] = field(default_factory=list)
    same_batch: dict[int, int] = field(default_factory=dict)
    multimodal: dict[int, object] = field(default_factory=dict)
    image_hashes: dict[int, int] = field(default_factory=dict)  # span start -> image hash


def image_bytes(images: Sequence[Any]) -> dict[int, bytes]:
    """Ollama's ImageData list ({"data": base64, "id": N}) as id -> bytes."""
    out = {}
    for item in images:
        if not isinstance(item, dict) or not isinstance(item.get("id"), int):
            raise EmberError("each image needs an integer id and base64 data")
        try:
            out[item["id"]] = base64.b64decode(str(item.get("data", "")), validate=True)
        except (binascii.Error, ValueError):
            raise EmberError(f"image {item['id']} is not valid base64") from None
    return out


def prompt_inputs(
    prompt: str, images: dict[int, bytes], tokenizer: Tokenizer, model: ImageModel
) -> PromptInputs:
    out = PromptInputs()
    pieces = _TAG.split(prompt)  # text, id, text, id, ..., text
    limit, count = getattr(model, "max_images", None), len(pieces) // 2  # mllama: 1, as Ollama
    if limit is not None and count > limit:
        if limit == 1:  # Ollama's words for mllama
            raise EmberError(
                "this model only supports one image while more than one image requested"
            )
        raise EmberError(f"this model only supports {limit} images while {count} were requested")
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            out.tokens += tokenizer.encode(piece, add_special=i == 0) if piece or i == 0 else []
            continue
        image_id = int(piece)
        if image_id not in images:
            raise EmberError(f"invalid image index: {image_id}")
        span = model.image_span(model.encode_multimodal(images[image_id]))
        start = len(out.tokens)
        out.same_batch[start] = len(span.tokens) - 1
        digest = hashlib.sha256(images[image_id]).digest()
        out.image_hashes[start] = int.from_bytes(digest[:8], "little")
        out.multimodal.update({start + offset: piece for offset, piece in span.pieces.items()})
        out.tokens += span.tokens
    return out
