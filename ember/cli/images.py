"""Images named by path in a prompt, for a model with the vision capability (Ollama's
extractFileData): a path to a .jpg, .jpeg, .png or .webp file is read, checked with Pillow, sent
base64 beside the text and taken out of it; a path to no file stays text."""

import base64
import io
import re
import struct
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from PIL import Image

from ember.cli.client import CLIError

MAX_IMAGE_BYTES = 100 * 1024 * 1024  # Ollama's limit
FORMATS = ("JPEG", "PNG", "WEBP")
HELP = "Use /path/to/file to include .jpg, .png, or .webp images.\n"

_EXTENSION = r"\.(?:jpe?g|png|webp)"
_START = r"(?:~[^\s/'\"]*|\.{1,2})?/"  # /abs, ./rel, ../rel, ~/in/home, ~user/in/home
_IMAGE_PATH = re.compile(
    rf"""
    (?<!\S)                                               # a path starts a word
    (?: '(?P<single>{_START}[^']*?{_EXTENSION})'            # 'quoted, spaces and all'
      | "(?P<double>{_START}[^"]*?{_EXTENSION})"            # "quoted, spaces and all"
      | (?P<bare>{_START}(?:\\.|[^\s\\])*?{_EXTENSION})     # escaped\ spaces
    )
    (?=[^\w\s/\\]*(?:\s|$))                               # ends the word, bar punctuation: x.png?
    """,
    re.IGNORECASE | re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True)
class ImagePath:
    """A path as the prompt names it (quotes and escapes removed) and where it was written."""

    path: str
    start: int
    end: int


def find_image_paths(text: str) -> list[ImagePath]:
    """The image-file paths `text` names, whether or not their files exist."""
    found = []
    for match in _IMAGE_PATH.finditer(text):
        quoted = match["single"] or match["double"]
        path = quoted if quoted else _ESCAPE.sub(r"\1", match["bare"])
        found.append(ImagePath(path, match.start(), match.end()))
    return found


def starts_with_image_path(text: str) -> bool:
    """Whether a REPL line that starts with "/" is a message naming an image, not a command."""
    found = find_image_paths(text.lstrip())
    return bool(found) and found[0].start == 0


def has_vision(shown: dict[str, Any]) -> bool:
    """Whether a model's /api/show answer says it reads images."""
    return "vision" in (shown.get("capabilities") or [])


def attach_images(text: str, err: TextIO = sys.stderr) -> tuple[str, list[str]]:
    """`text` without the paths of the image files it names, and those images in base64, in
    order. A path to no file stays text; a file that is not an image is a CLIError."""
    images: list[str] = []
    kept: list[str] = []
    position = 0
    for found in find_image_paths(text):
        file = Path(found.path).expanduser()
        if not file.exists():
            continue  # a path-like word that names nothing: the user meant it as text
        images.append(base64.b64encode(read_image(file, found.path)).decode("ascii"))
        err.write(f"Added image '{found.path}'\n")
        kept.append(text[position : found.start])
        position = found.end
        while text[position : position + 1] in (" ", "\t"):  # no double space where it was
            position += 1
    kept.append(text[position:])
    return "".join(kept).strip(), images


def read_image(file: Path, shown: str) -> bytes:
    """The bytes of a JPEG, PNG or WebP file; a CLIError naming `shown` for anything else, a
    file past 100 MB or an image of more pixels than Pillow decodes safely."""
    try:
        if file.stat().st_size > MAX_IMAGE_BYTES:
            raise CLIError(f"'{shown}' is larger than the 100 MB an image may be")
        data = file.read_bytes()
    except OSError as e:
        raise CLIError(f"cannot read '{shown}': {e.strerror or e}") from None
    kind = _image_format(data, shown)
    if kind not in FORMATS:
        raise CLIError(f"'{shown}' is a {kind} image: only JPEG, PNG and WebP images can be sent")
    return data


def _image_format(data: bytes, shown: str) -> str:
    with warnings.catch_warnings():
        # Pillow only warns up to twice its pixel limit: past the limit is already too big
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.verify()
                return str(image.format)
        except (Image.DecompressionBombWarning, Image.DecompressionBombError):
            limit = Image.MAX_IMAGE_PIXELS
            message = f"'{shown}' has more than the {limit} pixels an image may have"
            raise CLIError(message) from None
        except (OSError, SyntaxError, ValueError, EOFError, struct.error):
            # what Pillow raises for a file it cannot identify or a broken one
            raise CLIError(f"'{shown}' is not a JPEG, PNG or WebP image") from None
