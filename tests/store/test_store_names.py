"""Model names and digests: the rules of Ollama's types/model/name.go, and no path traversal."""

import pytest

from ember.store import Digest, InvalidDigestError, InvalidNameError, ModelName

PART80 = "8" * 80
PART350 = "3" * 350
HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        (
            "registry.ollama.ai/library/dolphin-mistral:7b-v2.6-dpo-laser-q6_K",
            ("registry.ollama.ai", "library", "dolphin-mistral", "7b-v2.6-dpo-laser-q6_K"),
        ),
        ("host/namespace/model:tag", ("host", "namespace", "model", "tag")),
        ("host:port/namespace/model:tag", ("host:port", "namespace", "model", "tag")),
        ("host/namespace/model", ("host", "namespace", "model", "latest")),
        ("host:port/namespace/model", ("host:port", "namespace", "model", "latest")),
        ("namespace/model", ("registry.ollama.ai", "namespace", "model", "latest")),
        ("model", ("registry.ollama.ai", "library", "model", "latest")),
        ("smollm2:135m", ("registry.ollama.ai", "library", "smollm2", "135m")),
        ("qwen2.5-coder:0.5b", ("registry.ollama.ai", "library", "qwen2.5-coder", "0.5b")),
        ("h/nn/mm:t", ("h", "nn", "mm", "t")),
        ("_why/_the/_lucky:_stiff", ("_why", "_the", "_lucky", "_stiff")),
        ("host:https/namespace/model:tag", ("host:https", "namespace", "model", "tag")),
        (f"{PART80}/{PART80}/{PART80}:{PART80}", (PART80, PART80, PART80, PART80)),
        (f"{PART350}/{PART80}/{PART80}:{PART80}", (PART350, PART80, PART80, PART80)),
        ("https://host/ns/m:t", ("host", "ns", "m", "t")),
    ],
)
def test_parse_fills_defaults_like_ollama(text: str, parts: tuple[str, ...]) -> None:
    assert ModelName.parse(text).parts == parts


@pytest.mark.parametrize(
    "text",
    [
        "",
        "^",
        "mm:",
        "n/m:",
        "/nn/mm",
        "//",
        "//mm",
        "hh//",
        "//mm:@",
        "00@",
        "@",
        "m@d",
        "-hh/nn/mm:tt",
        "hh/-nn/mm:tt",
        "hh/nn/-mm:tt",
        "hh/nn/mm:-tt",
        "host/name:space/model:tag",
        "a/b/c/d:t",  # four parts: the host would hold a slash
        "host/na.me/model:tag",  # no dot in a namespace
        "9" * 81,
        "h/n/m:" + "t" * 81,
        "h" * 351 + "/n/m:t",
        "modèle",  # ASCII only
        "ftp://host/ns/model:tag",
        "model name",
    ],
)
def test_invalid_names_are_refused(text: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid model name"):
        ModelName.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "..",
        "../x",
        "../../etc/passwd",
        "x/../../y",
        "host/../model",
        "./model",
        "model:..",
        "model:../x",
        "..:latest",
        ".hidden",
        "h/n/.:t",
        "a\\..\\b",
        "model:tag/..",
        "model\0",
        "/abs/path:tag",
    ],
)
def test_traversal_attempts_are_invalid(text: str) -> None:
    with pytest.raises(InvalidNameError):
        ModelName.parse(text)


def test_no_valid_name_has_a_dot_part_or_a_separator() -> None:
    # as Ollama's FuzzName: a valid part is never "." or "..", never holds a slash
    for text in ["h/a_b/c..d:e..f", "x.y:1.2", "h.:1/n/m:t"]:
        for part in ModelName.parse(text).parts:
            assert part not in (".", "..") and "/" not in part and "\\" not in part


def test_display_shortest_drops_default_parts() -> None:
    cases = {
        "registry.ollama.ai/library/model:latest": "model:latest",
        "registry.ollama.ai/library/model:tag": "model:tag",
        "registry.ollama.ai/namespace/model:tag": "namespace/model:tag",
        "host/namespace/model:tag": "host/namespace/model:tag",
        "host/library/model:tag": "host/library/model:tag",
    }
    for text, short in cases.items():
        assert ModelName.parse(text).display_shortest() == short


def test_string_is_fully_qualified_and_scheme_is_kept_aside() -> None:
    name = ModelName.parse("http://127.0.0.1:5000/ns/m")
    assert str(name) == "127.0.0.1:5000/ns/m:latest"
    assert name.scheme == "http"
    assert name.repository == "ns/m"


def test_equal_fold_ignores_case() -> None:
    assert ModelName.parse("Mistral:Latest").equal_fold(ModelName.parse("mistral"))
    assert not ModelName.parse("mistral:7b").equal_fold(ModelName.parse("mistral"))


@pytest.mark.parametrize("text", [f"sha256:{HEX}", f"sha256-{HEX}"])
def test_digest_accepts_both_forms(text: str) -> None:
    digest = Digest.parse(text)
    assert str(digest) == f"sha256:{HEX}"
    assert digest.filename == f"sha256-{HEX}"
    assert digest.short == HEX[:12]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sha256:",
        f"sha256:{HEX[:-1]}",
        f"sha256:{HEX}0",
        f"sha256:{HEX.upper()}",
        f"sha512:{HEX}",
        f"sha256_{HEX}",
        HEX,
        "../../x",
        "sha256:../../x",
        f"sha256:{HEX[:-2]}/.",
        f"sha256-{HEX}/../../x",
        f"sha256:{HEX}\n",
        f" sha256:{HEX}",
    ],
)
def test_bad_digests_are_refused(text: str) -> None:
    with pytest.raises(InvalidDigestError):
        Digest.parse(text)


def test_digest_of_wrong_type_is_refused() -> None:
    with pytest.raises(InvalidDigestError):
        Digest.parse(None)  # type: ignore[arg-type]
