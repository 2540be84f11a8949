"""The default backoff and delay clamping (pure, property-tested)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akadze import backoff

attempts = st.integers(min_value=-5, max_value=2**31 - 1)
draws = st.floats(min_value=0.0, max_value=1.0)


@given(attempts, draws)
def test_default_delay_is_within_the_jitter_band(attempt: int, draw: float) -> None:
    base = min(2.0 ** (max(attempt, 1) - 1), 300.0) if attempt < 40 else 300.0
    delay = backoff.default_delay(attempt, draw)
    assert base * 0.5 - 1e-9 <= delay <= base + 1e-9


@given(st.integers(min_value=1, max_value=64), draws)
def test_default_delay_never_shrinks_as_attempts_grow(attempt: int, draw: float) -> None:
    assert backoff.default_delay(attempt, draw) <= backoff.default_delay(attempt + 1, draw)


def test_default_delay_examples() -> None:
    assert backoff.default_delay(1, 1.0) == 1.0
    assert backoff.default_delay(1, 0.0) == 0.5
    assert backoff.default_delay(4, 1.0) == 8.0
    assert backoff.default_delay(9, 1.0) == 256.0
    assert backoff.default_delay(10, 1.0) == 300.0
    assert backoff.default_delay(2**31 - 1, 0.0) == 150.0


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_clamp_stays_within_zero_and_a_year(seconds: float) -> None:
    clamped = backoff.clamp(seconds)
    assert 0.0 <= clamped <= backoff.MAX_DELAY_SECONDS
    if math.isfinite(seconds) and 0 <= seconds <= backoff.MAX_DELAY_SECONDS:
        assert clamped == seconds


def test_to_seconds_accepts_timedeltas_and_numbers() -> None:
    assert backoff.to_seconds(timedelta(minutes=2)) == 120.0
    assert backoff.to_seconds(3) == 3.0
    assert backoff.to_seconds(-1) == 0.0
    assert backoff.to_seconds(timedelta(days=400)) == backoff.MAX_DELAY_SECONDS
    with pytest.raises(TypeError):
        backoff.to_seconds("5")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        backoff.to_seconds(True)


@given(st.integers(min_value=-3, max_value=10_000), draws)
def test_reconnect_delay_is_bounded(failures: int, draw: float) -> None:
    delay = backoff.reconnect_delay(failures, draw)
    assert 0.0 < delay <= backoff.RECONNECT_CAP


@given(draws, st.floats(allow_nan=True))
def test_jitter_keeps_at_least_half(draw: float, other: float) -> None:
    assert 5.0 <= backoff.jittered(10.0, draw) <= 10.0
    assert 5.0 <= backoff.jittered(10.0, other) <= 10.0
