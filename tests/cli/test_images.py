"""Images by file path in a prompt (Ollama's extractFileData): which words are paths, what is sent
for a model with vision, and `ember run` against the fake server with a model that has it and one
that has not."""

import base64
import io
from pathlib import Path

import pytest
from cli_support import Ember, one_line_error
from fake_server import FakeServer
from PIL import Image

from ember.cli.client import CLIError
from ember.cli.images import attach_images, find_image_paths, starts_with_image_path


def write_image(path: Path, kind: str = "PNG", size: tuple[int, int] = (4, 3)) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, "red").save(path, kind)
    return path.read_bytes()


def paths(text: str) -> list[str]:
    return [found.path for found in find_image_paths(text)]


# ---------------------------------------------------------------- which words are paths


def test_a_plain_path_and_its_span() -> None:
    [found] = find_image_paths("what is in /tmp/x.png")
    assert (found.path, found.start, found.end) == ("/tmp/x.png", 11, 21)


def test_quoted_escaped_relative_and_home_paths() -> None:
    text = (
        "compare '/my pics/one.PNG' with \"./two words/two.jpeg\" and /my\\ cat/three.webp, "
        "~/four.jpg and ../five.JPG?"
    )
    assert paths(text) == [
        "/my pics/one.PNG",
        "./two words/two.jpeg",
        "/my cat/three.webp",
        "~/four.jpg",
        "../five.JPG",
    ]


def test_words_that_are_not_image_paths() -> None:
    assert paths("no images here") == []
    assert paths("a/b.png is relative without ./, /tmp/x.gif is no image") == []
    assert paths("/tmp/x.png.bak /tmp/notes.pngx") == []
    assert paths("") == []


def test_a_line_that_starts_with_a_path_is_not_a_command() -> None:
    assert starts_with_image_path("/tmp/cat.png what is this?")
    assert not starts_with_image_path("/set parameter seed 1")
    assert not starts_with_image_path("/show info /tmp/cat.png")


# ---------------------------------------------------------------- what is sent


def test_images_leave_the_text_in_order(tmp_path: Path) -> None:
    first = write_image(tmp_path / "a b" / "one.png")
    second = write_image(tmp_path / "two.jpg", "JPEG")
    err = io.StringIO()
    text, images = attach_images(f"compare '{tmp_path}/a b/one.png' and {tmp_path}/two.jpg.", err)
    assert text == "compare and ."
    assert [base64.b64decode(i) for i in images] == [first, second]
    assert err.getvalue().splitlines() == [
        f"Added image '{tmp_path}/a b/one.png'",
        f"Added image '{tmp_path}/two.jpg'",
    ]


def test_a_path_to_no_file_stays_text(tmp_path: Path) -> None:
    prompt = f"what is in {tmp_path}/missing.png"
    assert attach_images(prompt, io.StringIO()) == (prompt, [])


def test_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    data = write_image(tmp_path / "pic.webp", "WEBP")
    text, images = attach_images("~/pic.webp describe it", io.StringIO())
    assert text == "describe it" and base64.b64decode(images[0]) == data


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not an image at all", "is not a JPEG, PNG or WebP image"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "is not a JPEG, PNG or WebP image"),  # broken
        (None, "is a GIF image: only JPEG, PNG and WebP images can be sent"),
    ],
)
def test_a_file_that_cannot_be_sent(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "x.png"
    if content is None:
        write_image(path, "GIF")
    else:
        path.write_bytes(content)
    with pytest.raises(CLIError, match=message):
        attach_images(f"look at {path}", io.StringIO())


def test_an_image_of_too_many_pixels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_image(tmp_path / "big.png", size=(20, 20))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # 400 pixels: only Pillow's warning
    with pytest.raises(CLIError, match="more than the 300 pixels"):
        attach_images(f"{tmp_path}/big.png", io.StringIO())


def test_a_file_too_big(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_image(tmp_path / "x.png")
    monkeypatch.setattr("ember.cli.images.MAX_IMAGE_BYTES", 10)
    with pytest.raises(CLIError, match="larger than the 100 MB"):
        attach_images(f"{tmp_path}/x.png", io.StringIO())


# ---------------------------------------------------------------- `ember run` with the fake server


def test_run_sends_the_image_of_a_vision_model(
    ember: Ember, fake: FakeServer, tmp_path: Path
) -> None:
    fake.vision.add("vismodel")
    data = write_image(tmp_path / "x.png")
    result = ember("run", "vismodel", f"what is in {tmp_path}/x.png")
    assert result.returncode == 0, result.stderr
    assert f"Added image '{tmp_path}/x.png'" in result.stderr
    assert "You said: what is in (temperature None, 1 images)" in result.stdout
    body = fake.bodies("/api/generate")[-1]
    assert body["prompt"] == "what is in"
    assert [base64.b64decode(i) for i in body["images"]] == [data]


def test_run_with_only_an_image_from_a_pipe(ember: Ember, fake: FakeServer, tmp_path: Path) -> None:
    fake.vision.add("vismodel")
    write_image(tmp_path / "x.png")
    result = ember("run", "vismodel", stdin=f"{tmp_path}/x.png\n")
    assert result.returncode == 0, result.stderr
    body = fake.bodies("/api/generate")[-1]
    assert body["prompt"] == "" and len(body["images"]) == 1


def test_run_sends_paths_as_text_without_vision_or_file(
    ember: Ember, fake: FakeServer, tmp_path: Path
) -> None:
    write_image(tmp_path / "x.png")
    plain = ember("run", "tiny", f"what is in {tmp_path}/x.png")
    assert plain.returncode == 0, plain.stderr
    assert "Added image" not in plain.stderr
    body = fake.bodies("/api/generate")[-1]
    assert body["prompt"] == f"what is in {tmp_path}/x.png" and "images" not in body

    fake.vision.add("vismodel")
    missing = ember("run", "vismodel", f"what is in {tmp_path}/missing.png")
    assert missing.returncode == 0, missing.stderr
    body = fake.bodies("/api/generate")[-1]
    assert body["prompt"] == f"what is in {tmp_path}/missing.png" and "images" not in body


def test_run_refuses_a_file_that_is_not_an_image(
    ember: Ember, fake: FakeServer, tmp_path: Path
) -> None:
    fake.vision.add("vismodel")
    assert ember("pull", "vismodel").returncode == 0  # so that run prints nothing but the error
    (tmp_path / "fake.png").write_text("just text")
    result = ember("run", "vismodel", f"what is in {tmp_path}/fake.png")
    assert result.returncode == 1 and one_line_error(result.stderr)
    assert f"Error: '{tmp_path}/fake.png' is not a JPEG, PNG or WebP image" in result.stderr
    assert fake.bodies("/api/generate") == []  # nothing was asked
