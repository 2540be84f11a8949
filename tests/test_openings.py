"""When a claim loop wakes for a start-rate window's opening (pure, property-tested):
never at a due time already past (the wake-up would drop it as served, and the loop
would wait for the poll), never before the lead, and without a moment of the server's
clock to wait for, never before the opening itself."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from akadze.worker._openings import WINDOW_LEAD, next_wake

times = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
ahead = st.floats(min_value=-5.0, max_value=5.0, allow_nan=False)
AT = datetime(2026, 12, 7, tzinfo=UTC)


@given(times, ahead, st.booleans())
def test_the_loop_wakes_later_than_now_or_claims_now(
    now: float, until: float, on_server: bool
) -> None:
    when = now + until
    at = AT if on_server else None
    wake = next_wake(when, at, now)
    if wake is None:
        # claim now: the opening has come, or (waited for on the server) comes
        # within the lead
        assert when <= now + (WINDOW_LEAD if on_server else 0.0)
    else:
        assert wake > now
        assert wake == (when - WINDOW_LEAD if on_server else when)


def test_an_opening_closer_than_the_lead_is_claimed_at_once() -> None:
    # 2 ms away, the claim waits for it on the server: a due time 1 ms ago would
    # be dropped and the window met only at the next poll
    assert next_wake(100.002, AT, 100.0) is None
    assert next_wake(100.010, AT, 100.0) == 100.010 - WINDOW_LEAD
    # nothing to wait for on the server (an injected clock): the opening itself
    assert next_wake(100.002, None, 100.0) == 100.002
    assert next_wake(99.999, None, 100.0) is None
