"""Stop strings: never emitted, matched across pieces, partial matches held back."""

from ember.runner.stop import StopMatcher


def test_stop_split_across_pieces_is_not_emitted():
    m = StopMatcher(("<|im_end|>",))
    out = [m.push(p) for p in ["Hello ", "wor", "ld <|im", "_e", "nd|> more"]]
    assert out == ["Hello ", "wor", "ld ", "", ""] and m.is_stopped


def test_stop_may_end_mid_token():
    m = StopMatcher(("END",))
    assert m.push("abcENDxyz") == "abc" and m.is_stopped and m.flush() == ""


def test_partial_match_is_released_when_it_diverges():
    m = StopMatcher(("STOP",))
    assert m.push("a ST") == "a "
    assert m.push("ORM") == "STORM"
    assert m.push("x ST") == "x "
    assert m.flush() == "ST" and not m.is_stopped


def test_no_stops_passes_everything():
    m = StopMatcher(())
    assert m.push("abc") == "abc" and m.flush() == ""


def test_the_stop_string_that_ended_the_text_is_kept():
    m = StopMatcher(("END", "STOP"))
    assert m.push("a STO") == "a " and m.matched == ""
    assert m.push("P b END") == "" and m.matched == "STOP"
    first = StopMatcher(("b", "a"))
    assert first.push("xab") == "x" and first.matched == "a"
