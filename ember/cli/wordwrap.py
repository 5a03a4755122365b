"""Streamed text printed as Ollama's displayResponse prints it: with word wrap on, a line ends
at the terminal's width less 5, and a word that would cross it is erased (ANSI cursor-back and
clear-to-end) and written again at the start of the next line. Tokens come as fragments, so the
word is only known to be too long once it is partly printed."""

import os
import unicodedata
from typing import TextIO

DEFAULT_WIDTH = 80  # Go's term.GetSize failing leaves 0, which displayResponse takes as 80


class WordWrap:
    """One answer's display state (Ollama's displayResponseState): the length of the line so
    far and the word being written."""

    def __init__(self, out: TextIO, wrap: bool) -> None:
        self.out, self.wrap = out, wrap
        self.line_length = 0
        self.word = ""

    def write(self, text: str) -> None:
        width = terminal_width(self.out)
        if not self.wrap or width < 10:
            self.out.write(text)  # the word so far is on the screen already
            self.word = ""
            return
        for ch in text:
            if self.line_length + 1 > width - 5:
                self._break_line(ch, width)
            else:
                self._add(ch)

    def _break_line(self, ch: str, width: int) -> None:
        if text_width(self.word) > width - 10:
            # a word too long for any line is cut where it is (Ollama writes its printed part
            # a second time here, which reads as a repeated fragment: not copied)
            self.out.write(ch)
            self.word, self.line_length = "", 0
            return
        if self.word:
            self.out.write(f"\x1b[{text_width(self.word)}D")
        self.out.write(f"\x1b[K\n{self.word}{ch}")
        self.line_length = text_width(self.word) + char_width(ch)

    def _add(self, ch: str) -> None:
        self.out.write(ch)
        self.line_length += char_width(ch)
        if char_width(ch) >= 2 or ch in " \t":  # a wide character (CJK) may end a line too
            self.word = ""
        elif ch in "\n\r":
            self.word, self.line_length = "", 0
        else:
            self.word += ch


def terminal_width(out: TextIO) -> int:
    try:
        return os.get_terminal_size(out.fileno()).columns or DEFAULT_WIDTH
    except (AttributeError, OSError, ValueError):  # not a terminal, or no file at all
        return DEFAULT_WIDTH


def char_width(ch: str) -> int:
    """Columns a character takes, as go-runewidth counts them: 2 for East Asian wide and
    full-width characters, 0 for combining marks and control characters, else 1."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Cc", "Cf", "Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def text_width(text: str) -> int:
    return sum(char_width(ch) for ch in text)
