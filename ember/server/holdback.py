"""Text held back in a stream: the part of a tag a piece may end with before the rest arrives."""


def partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag (0 if none)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def trailing_space(text: str) -> int:
    """Length of the whitespace text ends with."""
    return len(text) - len(text.rstrip())
