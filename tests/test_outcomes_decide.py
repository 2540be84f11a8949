"""How a run's end becomes a row change (pure: outcomes.decide)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akadze import Cancel, Fail, Retry, Snooze
from akadze.jobs import ClaimedJob, JobState
from akadze.outcomes import (
    CANCELLED,
    FAILED,
    RETRIED,
    SNOOZED,
    SUCCEEDED,
    decide,
    given_back,
    invalid_args,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def job(attempt: int = 1, max_attempts: int = 3) -> ClaimedJob:
    return ClaimedJob(
        id=7, queue="default", task="t", args={}, priority=0, run_at=AT, limit_key=None,
        run_count=attempt, attempt=attempt, max_attempts=max_attempts,
    )


def test_success_stores_the_json_result() -> None:
    finish, warning = decide(job(), None, {"a": [1, 2]}, at=AT, draw=0.5)
    assert (finish.kind, finish.state, warning) == (SUCCEEDED, JobState.SUCCEEDED, None)
    assert json.loads(finish.result or "") == {"a": [1, 2]}
    assert finish.error is None and finish.delay is None


def test_none_result_is_sql_null() -> None:
    finish, _ = decide(job(), None, None, at=AT, draw=0.5)
    assert finish.kind == SUCCEEDED and finish.result is None


@pytest.mark.parametrize("bad", [object(), {"x": math.nan}, {1, 2}, float("inf")])
def test_a_non_json_result_is_an_error_that_spends_an_attempt(bad: object) -> None:
    finish, _ = decide(job(attempt=1), None, bad, at=AT, draw=1.0)
    assert (finish.kind, finish.state, finish.delay) == (RETRIED, JobState.QUEUED, 1.0)
    assert "not JSON" in json.loads(finish.error or "")["message"]


def test_retry_spends_an_attempt_with_the_given_delay() -> None:
    finish, _ = decide(job(attempt=1), Retry(delay=timedelta(seconds=42)), None, at=AT, draw=0)
    assert (finish.kind, finish.attempt_delta, finish.delay) == (RETRIED, 0, 42.0)


def test_retry_without_delay_uses_the_backoff() -> None:
    finish, _ = decide(job(attempt=3, max_attempts=5), Retry(), None, at=AT, draw=1.0)
    assert finish.delay == 4.0


def test_retry_on_the_last_attempt_fails() -> None:
    finish, _ = decide(job(attempt=3, max_attempts=3), Retry(), None, at=AT, draw=0.5)
    assert (finish.kind, finish.state) == (FAILED, JobState.FAILED)


def test_snooze_refunds_the_attempt_even_on_the_last_one() -> None:
    finish, _ = decide(job(attempt=3, max_attempts=3), Snooze(5), None, at=AT, draw=0.5)
    assert (finish.kind, finish.state, finish.attempt_delta, finish.delay) == (
        SNOOZED, JobState.QUEUED, -1, 5.0)
    assert finish.error is None


def test_fail_and_cancel_end_the_job_with_their_reason() -> None:
    failed, _ = decide(job(attempt=1), Fail("bad input"), None, at=AT, draw=0.5)
    assert (failed.kind, failed.state) == (FAILED, JobState.FAILED)
    assert json.loads(failed.error or "")["message"] == "bad input"
    cancelled, _ = decide(job(), Cancel("not needed"), None, at=AT, draw=0.5)
    assert (cancelled.kind, cancelled.state) == (CANCELLED, JobState.CANCELLED)


def test_an_exception_is_recorded_with_class_message_and_masked_secrets() -> None:
    try:
        raise ConnectionError("cannot reach postgresql://bob:hunter2@db/x")
    except ConnectionError as exc:
        finish, _ = decide(job(attempt=2), exc, None, at=AT, draw=1.0)
    entry = json.loads(finish.error or "")
    assert entry["error"] == "ConnectionError"
    assert entry["attempt"] == 2 and entry["at"] == AT.isoformat()
    assert "hunter2" not in finish.error and "***" in entry["message"]
    assert "ConnectionError" in entry["traceback"]
    assert finish.kind == RETRIED and finish.delay == 2.0


def test_a_timeout_spends_an_attempt() -> None:
    finish, _ = decide(job(attempt=1), None, None, at=AT, draw=1.0, timeout=2.5)
    entry = json.loads(finish.error or "")
    assert entry["error"] == "TimeoutError" and "2.5 s" in entry["message"]
    assert finish.kind == RETRIED


def test_the_tasks_backoff_is_used_and_clamped() -> None:
    finish, warning = decide(job(attempt=2), RuntimeError(), None, at=AT, draw=0.5,
                             custom_backoff=lambda n: timedelta(days=1000 * n))
    assert finish.delay == 365 * 24 * 3600.0 and warning is None


def test_a_broken_backoff_falls_back_to_the_default_with_a_warning() -> None:
    finish, warning = decide(job(attempt=1), RuntimeError(), None, at=AT, draw=1.0,
                             custom_backoff=lambda n: "soon")  # type: ignore[arg-type,return-value]
    assert finish.delay == 1.0 and warning and "default" in warning


def test_invalid_arguments_fail_at_once_and_give_back_keeps_the_place() -> None:
    failed = invalid_args(job(attempt=1), AT, "stored arguments are invalid: x")
    assert failed.state == JobState.FAILED
    back = given_back(job())
    assert (back.state, back.attempt_delta, back.delay) == (JobState.QUEUED, -1, None)


@given(st.integers(min_value=1, max_value=10**6), st.integers(min_value=1, max_value=10**6),
       st.floats(min_value=0, max_value=1))
def test_an_error_fails_exactly_when_attempts_are_used_up(
    attempt: int, max_attempts: int, draw: float
) -> None:
    finish, _ = decide(job(attempt, max_attempts), ValueError("x"), None, at=AT, draw=draw)
    assert (finish.state == JobState.FAILED) == (attempt >= max_attempts)
    if finish.state == JobState.QUEUED:
        assert finish.delay is not None and 0.5 <= finish.delay <= 300


def test_outcome_arguments_are_checked_when_raised() -> None:
    with pytest.raises(TypeError):
        Snooze("later")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Retry(delay="1s")  # type: ignore[arg-type]


_ENDINGS = st.one_of(
    st.tuples(st.just("returned"), st.one_of(
        st.none(), st.integers(), st.text(), st.lists(st.integers(), max_size=3),
        st.just(object()), st.just(math.nan))),
    st.tuples(st.just("raised"), st.one_of(
        st.builds(Retry, st.one_of(st.none(), st.floats(min_value=-1e9, max_value=1e12)),
                  st.text(max_size=20)),
        st.builds(Snooze, st.floats(min_value=-1e9, max_value=1e12)),
        st.builds(Fail, st.text(max_size=20)),
        st.builds(Cancel, st.text(max_size=20)),
        st.builds(ValueError, st.text(max_size=20)),
    )),
    st.tuples(st.just("timed out"), st.floats(min_value=0.001, max_value=1e6)),
)

YEAR = 365 * 24 * 3600.0


@given(_ENDINGS, st.integers(min_value=1, max_value=50), st.integers(min_value=1, max_value=50),
       st.floats(min_value=0, max_value=1))
def test_every_decision_is_a_consistent_row_change(
    ending: tuple[str, object], attempt: int, max_attempts: int, draw: float
) -> None:
    how, value = ending
    exc = value if how == "raised" else None
    result = value if how == "returned" else None
    timeout = value if how == "timed out" else None
    assert exc is None or isinstance(exc, BaseException)
    assert timeout is None or isinstance(timeout, float)
    finish, _ = decide(job(attempt, max_attempts), exc, result, at=AT, draw=draw,
                       timeout=timeout)
    # Only a snooze refunds the attempt; only a run that goes on has a delay.
    assert (finish.attempt_delta == -1) == (finish.kind == SNOOZED)
    assert (finish.state == JobState.QUEUED) == (finish.delay is not None)
    if finish.delay is not None:
        assert 0 <= finish.delay <= YEAR
    # A retry-like end fails exactly when the attempts are used up.
    if finish.kind in (RETRIED, FAILED) and not isinstance(exc, Fail):
        assert (finish.kind == FAILED) == (attempt >= max_attempts)
    if isinstance(exc, Cancel):
        assert finish.kind == CANCELLED
    # An error entry records the attempt; only successes and snoozes have none.
    if finish.kind in (SUCCEEDED, SNOOZED):
        assert finish.error is None
    else:
        assert json.loads(finish.error or "")["attempt"] == attempt
    if finish.kind == SUCCEEDED:
        assert finish.result is None or json.loads(finish.result) == result
