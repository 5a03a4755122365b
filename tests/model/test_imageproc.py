"""Image bytes are untrusted input: only Ollama's four formats are decoded, and no image makes
the preprocessing allocate far more than the image it returns."""

import io
import resource

import numpy as np
import pytest
from PIL import Image

from ember.model.imageproc import ImageError, decode_image, resize_and_crop, to_rgb


def encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_ollamas_formats_decode(fmt: str) -> None:
    image = Image.new("RGB", (5, 3), (200, 10, 10))
    assert decode_image(encoded(image, fmt)).size == (5, 3)


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "ICO", "PPM", "EPS"])
def test_other_formats_are_refused_by_name(fmt: str) -> None:
    image = Image.new("RGB", (16, 16), (200, 10, 10))
    data = (
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n%%EOF\n"
        if fmt == "EPS"  # Pillow would hand it to Ghostscript
        else encoded(image, fmt)
    )
    with pytest.raises(ImageError, match=r"^the image is not a PNG, JPEG, GIF or WebP image$"):
        decode_image(data)


def test_a_16_bit_gray_keeps_its_high_byte_as_gos_decoder() -> None:
    # Pillow's conversion would make both white; Ollama's pixels are r >> 8
    for value, expected in ((10000, 39), (60000, 234), (255, 0)):
        image = decode_image(encoded(Image.new("I;16", (4, 3), value), "PNG"))
        assert to_rgb(image).getpixel((1, 1)) == (expected,) * 3


def test_bytes_that_are_no_image_say_so_without_internals() -> None:
    with pytest.raises(ImageError) as err:
        decode_image(b"not an image at all")
    assert "BytesIO" not in str(err.value) and "0x" not in str(err.value)


def rgb_noise(width: int, height: int, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def whole_resize_then_crop(image: Image.Image, size: int) -> np.ndarray:
    """CLIPImageProcessor's steps as HF takes them: the whole image resized, then cropped."""
    width, height = image.size
    short, long = sorted((width, height))
    new_long = int(size * long / short)
    new = (size, new_long) if width <= height else (new_long, size)
    top, left = (new[1] - size) // 2, (new[0] - size) // 2
    resized = image.resize(new, resample=Image.Resampling.BICUBIC)
    return np.asarray(resized.crop((left, top, left + size, top + size)), dtype=np.int16)


@pytest.mark.parametrize(("width", "height"), [(640, 480), (480, 640), (31, 33), (160, 10)])
def test_resize_and_crop_is_hfs_exactly_for_usual_shapes(width: int, height: int) -> None:
    image = rgb_noise(width, height)
    ours = np.asarray(resize_and_crop(image, 32), dtype=np.int16)
    assert np.array_equal(ours, whole_resize_then_crop(image, 32))


@pytest.mark.parametrize(("width", "height"), [(2000, 17), (9, 1000), (1, 300)])
def test_a_long_thin_image_resizes_its_square_alone_nearly_as_hf(width: int, height: int) -> None:
    """Pillow may take the two passes in the other order (each rounds to bytes): noise, the
    worst case for bicubic's overshoot, then differs by a level on average."""
    image = rgb_noise(width, height)
    ours = np.asarray(resize_and_crop(image, 32), dtype=np.int16)
    assert ours.shape == (32, 32, 3)
    difference = np.abs(ours - whole_resize_then_crop(image, 32))
    assert difference.mean() < 1 and difference.max() <= 32


def test_a_one_pixel_high_image_does_not_balloon() -> None:
    """A 628-byte PNG of 1 x 400,000 pixels: resized whole to a 336-pixel short side it would be
    336 x 134,400,000 pixels (135 GB); the square alone is 336 x 336."""
    data = encoded(Image.new("L", (400_000, 1), 128), "PNG")
    assert len(data) < 4096
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    square = resize_and_crop(decode_image(data), 336)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert square.size == (336, 336)
    assert np.asarray(square).min() == np.asarray(square).max() == 128
    assert grown_mib < 64
