"""Progress streams drawn in the order they come: a blob's bar before the status lines after it."""

import io

import pytest
from rich.console import Console

from ember.cli.progress import show_progress

PULL = [
    {"status": "pulling manifest"},
    {"status": "pulling b179c9523d0e", "digest": "sha256:b179", "total": 1000, "completed": 0},
    {"status": "pulling b179c9523d0e", "digest": "sha256:b179", "total": 1000, "completed": 1000},
    {"status": "verifying sha256 digest"},
    {"status": "writing manifest"},
    {"status": "success"},
]


@pytest.mark.parametrize("terminal", [False, True])
def test_bar_comes_between_the_statuses_around_it(terminal: bool) -> None:
    out = io.StringIO()
    show_progress(PULL, Console(file=out, force_terminal=terminal, width=100))
    text = out.getvalue()
    order = ["pulling manifest", "pulling b179c9523d0e", "verifying sha256 digest", "success"]
    # a live terminal redraws the bar: its first drawing is what must come in place
    places = [text.find(line) for line in order]
    assert -1 not in places and places == sorted(places), text


def test_bars_after_a_status_start_a_new_display() -> None:
    out = io.StringIO()
    records = [*PULL[:3], {"status": "pushing manifest"}, *PULL[1:3], {"status": "success"}]
    show_progress(records, Console(file=out, force_terminal=False, width=100))
    lines = [line.split()[0:2] for line in out.getvalue().splitlines()]
    assert lines == [
        ["pulling", "manifest"],
        ["pulling", "b179c9523d0e"],
        ["pushing", "manifest"],
        ["pulling", "b179c9523d0e"],
        ["success"],
    ]


def test_a_long_status_is_one_line() -> None:
    out = io.StringIO()
    status = "creating new layer sha256:" + "6" * 64
    show_progress([{"status": status}], Console(file=out, force_terminal=False, width=80))
    assert out.getvalue() == status + "\n"
