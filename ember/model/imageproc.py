"""Image bytes -> normalized pixel tensors, as HF's (PIL-based) image processors compute them:
decoded with Pillow (decompression-bomb guard as an error), converted to RGB, resized with
Pillow's filter, rescaled by 1/255 (in float64, then float32) and normalized."""

import io
import math
import warnings

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ember.errors import EmberError

MAX_IMAGE_BYTES = 100 << 20
MAX_ASPECT = 16  # resize_and_crop resizes a whole image up to this long side : short side


class ImageError(EmberError, ValueError):
    """Bytes that are not an image Pillow can decode safely."""


# what Ollama decodes (Go's image package with webp registered); Pillow's other plugins stay
# out: EPS hands the bytes to Ghostscript, and every plugin more is more untrusted-input parser
FORMATS = ("PNG", "JPEG", "GIF", "WEBP")


def decode_image(data: bytes) -> Image.Image:
    """A fully decoded image; a corrupt, unknown or oversized one is an ImageError."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError("the image is larger than 100 MB")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            image.load()
        except (Image.DecompressionBombWarning, Image.DecompressionBombError):
            raise ImageError("the image has too many pixels") from None
        except UnidentifiedImageError:
            raise ImageError("the image is not a PNG, JPEG, GIF or WebP image") from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise ImageError(f"the image cannot be decoded: {e}") from None
    return image


# Pillow's modes of 16-bit (and 32-bit integer) grays: a 16-bit grayscale PNG opens as one
_WIDE_GRAYS = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white (as transformers and Ollama do)."""
    if image.mode in _WIDE_GRAYS:
        # Pillow's own conversion clips every gray above 255 to white; Go's image decoder keeps
        # a 16-bit gray's high byte (Ollama's r >> 8)
        high = (np.asarray(image).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8)
        return Image.fromarray(high, "L").convert("RGB")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def to_pixels(
    image: Image.Image,
    size: tuple[int, int],
    *,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    resample: Image.Resampling = Image.Resampling.BILINEAR,
) -> torch.Tensor:
    """(3, height, width) float32 for `size` = (height, width)."""
    rgb = to_rgb(image)
    resized = rgb.resize((size[1], size[0]), resample=resample)
    scaled = (np.asarray(resized).astype(np.float64) * (1 / 255)).astype(np.float32)
    pixels = (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))


def resize_and_crop(
    image: Image.Image,
    size: int,
    resample: Image.Resampling = Image.Resampling.BICUBIC,
) -> Image.Image:
    """RGB, its shortest edge resized to `size` (the longer one truncated as HF computes it),
    then the centred size x size square: CLIPImageProcessor's resize and center crop."""
    rgb = to_rgb(image)
    width, height = rgb.size
    short, long = sorted((width, height))
    new_long = int(size * long / short)
    new = (size, new_long) if width <= height else (new_long, size)
    top, left = (new[1] - size) // 2, (new[0] - size) // 2
    if long <= MAX_ASPECT * short:
        return rgb.resize(new, resample=resample).crop((left, top, left + size, top + size))
    # a long thin image's whole resized copy would be gigabytes (1 x 400,000 pixels): resize the
    # square's source region alone (the same filter, scale and centres; Pillow may take the two
    # passes in the other order, so values can differ by a few levels)
    sx, sy = width / new[0], height / new[1]
    box = (left * sx, top * sy, (left + size) * sx, (top + size) * sy)
    return rgb.resize((size, size), resample=resample, box=box)


def fit_longest_edge(width: int, height: int, longest_edge: int, unit: int) -> tuple[int, int]:
    """(height, width) of PixtralImageProcessor's resize: scaled down (floor) to fit
    longest_edge keeping the aspect ratio, then each side rounded up to a multiple of unit."""
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    return (max(height - 1, 0) // unit + 1) * unit, (max(width - 1, 0) // unit + 1) * unit
