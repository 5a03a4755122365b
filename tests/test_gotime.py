"""Times written as Go's time.Time marshals them (RFC 3339 with trimmed nanoseconds)."""

from datetime import UTC, datetime, timedelta, timezone

from ember.gotime import rfc3339_nano, utc_now


def test_utc_is_z_and_the_fraction_is_trimmed() -> None:
    whole = datetime(2026, 1, 2, 3, 4, 5, 700000, tzinfo=UTC)
    assert rfc3339_nano(whole) == "2026-01-02T03:04:05.7Z"
    assert rfc3339_nano(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05Z"
    assert rfc3339_nano(datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)).endswith(".123456Z")


def test_another_zone_keeps_its_offset() -> None:
    west = timezone(timedelta(hours=-7, minutes=-30))
    assert rfc3339_nano(datetime(2026, 1, 2, 3, 4, 5, tzinfo=west)) == "2026-01-02T03:04:05-07:30"


def test_now_is_utc() -> None:
    text = utc_now()
    assert text.endswith("Z") and "+" not in text
    assert abs(datetime.fromisoformat(text).timestamp() - datetime.now(UTC).timestamp()) < 5
