"""Word wrap of a streamed answer, as Ollama's displayResponse: what a terminal shows once the
cursor-back and clear-to-end codes are applied, for text that comes in fragments."""

import io
import re

import pytest

from ember.cli import wordwrap
from ember.cli.chat import Session, _print_stream
from ember.cli.wordwrap import WordWrap

CODE = re.compile(r"\x1b\[(\d*)([DK])")


def rendered(written: str) -> list[str]:
    """The lines a terminal shows for written text (only the codes WordWrap writes)."""
    lines, column = [""], 0
    for text, count, code in _pieces(written):
        for ch in text:
            if ch == "\n":
                lines.append("")
                column = 0
            else:
                lines[-1] = lines[-1][:column] + ch + lines[-1][column + 1 :]
                column += 1
        if code == "D":
            column -= int(count)
        elif code == "K":
            lines[-1] = lines[-1][:column]
    return [line.rstrip() for line in lines]


def _pieces(written: str) -> list[tuple[str, str, str]]:
    pieces, at = [], 0
    for match in CODE.finditer(written):
        pieces.append((written[at : match.start()], match.group(1), match.group(2)))
        at = match.end()
    return [*pieces, (written[at:], "", "")]


@pytest.fixture
def width_20(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wordwrap, "terminal_width", lambda out: 20)


STORY = ["The quick bro", "wn fox jumps over the la", "zy dog.\nA new ", "line here."]


def test_a_word_that_would_pass_the_width_moves_to_the_next_line(width_20: None) -> None:
    out = io.StringIO()
    display = WordWrap(out, wrap=True)
    for piece in STORY:  # fragments, as tokens come
        display.write(piece)
    # a line reaches the width less 5 (15) only inside a word, which then moves on whole
    # (Ollama's check comes before each character: "brown" ending at 15 moves too)
    assert rendered(out.getvalue()) == [
        "The quick",
        "brown fox",
        "jumps over the",
        "lazy dog.",
        "A new line",
        "here.",
    ]


def test_without_wrap_the_text_is_written_as_it_comes(width_20: None) -> None:
    out = io.StringIO()
    display = WordWrap(out, wrap=False)
    for piece in STORY:
        display.write(piece)
    assert out.getvalue() == "".join(STORY)


def test_wide_characters_count_two_columns(width_20: None) -> None:
    out = io.StringIO()
    WordWrap(out, wrap=True).write("日本語の文章はどこでも折り返せる")
    # no word to move: the line breaks where its count (14 + 2) passed 15
    assert rendered(out.getvalue()) == ["日本語の文章はど", "こでも折り返せる"]


def test_a_word_longer_than_a_line_is_not_repeated(width_20: None) -> None:
    out = io.StringIO()
    WordWrap(out, wrap=True).write("see supercalifragilisticexpialidocious now")
    # past width - 10 the word stays where it is and the terminal wraps it; Ollama wrote its
    # first 11 letters a second time there
    assert out.getvalue() == "see supercalifragilisticexpialidocious now"


def test_a_streamed_answer_and_its_thinking_wrap(width_20: None) -> None:
    """As Ollama's chat: thinking wraps, and the answer starts its own count of the line."""

    class Streamed:
        def stream(self, path: str, body: object) -> list[dict[str, object]]:
            return [
                {"thinking": "I think that the answer is"},
                {"response": "The answer is forty two, "},
                {"response": "for sure.", "done": True},
            ]

    out = io.StringIO()
    session = Session("tiny", word_wrap=True)
    _print_stream(Streamed(), "/api/generate", {}, session, out)  # type: ignore[arg-type]
    assert rendered(out.getvalue()) == [
        "Thinking...",
        "I think that",
        "the answer is",
        "...done thinking.",
        "",
        "The answer is",
        "forty two, for",
        "sure.",
        "",
        "",
    ]
