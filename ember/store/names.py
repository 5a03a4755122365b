"""Model names `[scheme://][host/][namespace/]model[:tag]` and sha256 digests, parsed as Ollama.

Rules follow Ollama's types/model/name.go: every part starts with a letter, digit or `_`; then
letters, digits, `_`, `-`, `.` (not in the namespace) and `:` (host only). A valid part can
therefore never be `.`, `..`, empty, or contain a slash: a name maps to a path inside the store.
"""

import re
from dataclasses import dataclass

from ember.store.errors import InvalidDigestError, InvalidNameError

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
DEFAULT_SCHEME = "https"

MAX_HOST_LEN = 350
MAX_PART_LEN = 80  # namespace, model and tag

_FIRST = re.compile(r"[A-Za-z0-9_]")
_ALLOWED = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*"),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"),
}
_SCHEMES = ("http", "https")


@dataclass(frozen=True, slots=True)
class ModelName:
    """A fully qualified model name; build one with `ModelName.parse`."""

    host: str
    namespace: str
    model: str
    tag: str
    scheme: str = DEFAULT_SCHEME  # given as `http://host/...`; never part of the stored name

    @classmethod
    def parse(cls, text: str) -> "ModelName":
        """Parses `text`, fills the defaults (registry.ollama.ai, library, latest) and validates.

        Raises InvalidNameError with the offending part.
        """
        if not isinstance(text, str) or not text:
            raise InvalidNameError("invalid model name: the name is empty")
        scheme, host, namespace, model, tag = _split(text)
        name = cls(
            host=host or DEFAULT_HOST,
            namespace=namespace or DEFAULT_NAMESPACE,
            model=model,
            tag=tag or DEFAULT_TAG,
            scheme=scheme or DEFAULT_SCHEME,
        )
        name._validate(text)
        return name

    def _validate(self, text: str) -> None:
        if self.scheme not in _SCHEMES:
            raise InvalidNameError(f"invalid model name {text!r}: scheme must be http or https")
        for kind, part in (
            ("host", self.host),
            ("namespace", self.namespace),
            ("model", self.model),
            ("tag", self.tag),
        ):
            problem = part_problem(kind, part)
            if problem:
                raise InvalidNameError(f"invalid model name {text!r}: the {kind} {problem}")

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def parts(self) -> tuple[str, str, str, str]:
        """(host, namespace, model, tag): the manifest's path under `manifests/`."""
        return (self.host, self.namespace, self.model, self.tag)

    @property
    def repository(self) -> str:
        """`namespace/model`, the repository in registry URLs."""
        return f"{self.namespace}/{self.model}"

    def display_shortest(self) -> str:
        """The name as Ollama lists it: `model:tag`, `ns/model:tag` or `host/ns/model:tag`."""
        if self.host.lower() != DEFAULT_HOST:
            return str(self)
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    def equal_fold(self, other: "ModelName") -> bool:
        """Same model ignoring case (Ollama treats `Mistral` and `mistral` as one name)."""
        return all(a.lower() == b.lower() for a, b in zip(self.parts, other.parts, strict=True))


def _split(text: str) -> tuple[str, str, str, str, str]:
    """(scheme, host, namespace, model, tag) as Ollama's ParseNameBare cuts them; "" if absent."""
    s, tag = text, ""
    if s.rfind(":") > s.rfind("/"):
        s, _, tag = s.rpartition(":")
        tag = tag or "\0"  # "model:" has a tag that is present but empty: invalid, not default
    if "/" not in s:
        return "", "", "", s, tag
    s, _, model = s.rpartition("/")
    if "/" not in s:
        return "", "", s or "\0", model, tag
    s, _, namespace = s.rpartition("/")
    scheme, sep, host = s.partition("://")
    if not sep:
        scheme, host = "", s
    return scheme, host or "\0", namespace or "\0", model, tag


def part_problem(kind: str, part: str) -> str | None:
    """Why `part` is not a valid `kind` (host, namespace, model, tag) part; None when it is."""
    limit = MAX_HOST_LEN if kind == "host" else MAX_PART_LEN
    if not part or part == "\0":
        return "is empty"
    if len(part) > limit:
        return f"is longer than {limit} characters"
    if not _FIRST.fullmatch(part[0]):
        return f"{part!r} must start with a letter, a digit or '_'"
    if not _ALLOWED[kind].fullmatch(part):
        allowed = "letters, digits, '_', '-'" + {"host": ", '.', ':'", "namespace": ""}.get(
            kind, ", '.'"
        )
        return f"{part!r} may only contain {allowed}"
    return None


def is_valid_part(kind: str, part: str) -> bool:
    return part_problem(kind, part) is None


# ---------------------------------------------------------------- digests

_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


@dataclass(frozen=True, slots=True)
class Digest:
    """A sha256 content digest; `str()` gives `sha256:<hex>`, `filename` the blob's file name."""

    hex: str

    @classmethod
    def parse(cls, text: str) -> "Digest":
        """Accepts `sha256:<hex>` and the file form `sha256-<hex>` (as Ollama's BlobsPath).

        Only lowercase hex: a sha256 we compute is lowercase, and an uppercase spelling would
        name a second file for the same content.
        """
        match = _DIGEST.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            shown = text[:80] if isinstance(text, str) else type(text).__name__
            raise InvalidDigestError(
                f"invalid digest {shown!r}: expected sha256:<64 lowercase hex digits>"
            )
        return cls(match.group(1))

    def __str__(self) -> str:
        return f"sha256:{self.hex}"

    @property
    def filename(self) -> str:
        return f"sha256-{self.hex}"

    @property
    def short(self) -> str:
        """The 12 hex digits Ollama's progress lines show (`pulling 3f2a9b1c0d4e`)."""
        return self.hex[:12]
