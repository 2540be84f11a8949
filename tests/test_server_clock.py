"""The server's clock as a claim loop sees it (pure, property-tested): a moment of
the server's clock turned into loop time is never early, and late by no more than
the quickest kept reply's travel."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akadze.worker._serverclock import KEEP, ServerClock

offsets = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
# (seconds since the last reply, the reply's travel from the server's clock read
# to its arrival here)
replies = st.lists(st.tuples(st.floats(min_value=0.0, max_value=3.0),
                             st.floats(min_value=0.0, max_value=0.05)),
                   min_size=1, max_size=40)


@given(offsets, replies, st.floats(min_value=0.0, max_value=5.0))
def test_a_moment_of_the_server_is_never_early_and_late_by_the_quickest_reply(
    offset: float, trips: list[tuple[float, float]], ahead: float
) -> None:
    clock = ServerClock()
    received = 0.0
    kept: list[tuple[float, float]] = []
    for gap, travel in trips:
        received += gap
        server = received - travel - offset  # the server read its clock `travel` earlier
        clock.observed(received, server)
        kept = [(at, t) for at, t in [*kept, (received, travel)] if at >= received - KEEP]
    moment = received - offset + ahead  # a moment of the server's clock, ahead of now
    truth = moment + offset  # the loop time at which it really comes
    woke = clock.to_loop(moment)
    slack = 1e-6 * max(1.0, abs(offset), received)  # float rounding only
    assert woke >= truth - slack
    assert woke <= truth + min(t for _, t in kept[-16:]) + slack


def test_bounds_older_than_keep_are_forgotten() -> None:
    clock = ServerClock()
    clock.observed(0.0, 0.0)  # a quick reply: offset bound 0
    clock.observed(KEEP + 1.0, KEEP + 0.99)  # a slow one, much later: bound 0.01
    assert clock.to_loop(100.0) == pytest.approx(100.01)


def test_without_a_reply_there_is_no_estimate() -> None:
    clock = ServerClock()
    with pytest.raises(LookupError):
        clock.to_loop(1.0)
