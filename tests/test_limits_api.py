"""akadze.limits: set_limit / clear_limit / list_limits against a real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akadze import LimitError, LimitSummary
from akadze.app import Akadze
from akadze.limits import (
    KEEP,
    MAX_KEY_BYTES,
    LimitPolicy,
    clear_limit,
    clear_limit_sync,
    list_limits,
    list_limits_sync,
    merge_policy,
    set_limit,
    set_limit_sync,
)

Conn = psycopg.Connection[tuple[Any, ...]]
AConn = psycopg.AsyncConnection[tuple[Any, ...]]


def _rows(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        'SELECT key, max_running, max_starts, "window" FROM akadze.limits ORDER BY key'
    ).fetchall()


def _job(conn: Conn, *, key: str | None, state: str = "queued", queue: str = "q") -> int:
    row = conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, state) VALUES (%s, 't', %s, %s)"
        " RETURNING id",
        (queue, key, state),
    ).fetchone()
    assert row is not None
    return int(row[0])


# -- set_limit -------------------------------------------------------------------------


async def test_set_limit_creates_and_returns_the_summary(aconn: AConn, conn: Conn) -> None:
    summary = await set_limit(aconn, "acme", max_running=3)
    assert summary == LimitSummary("acme", 3, None, None, 0, 0)
    assert _rows(conn) == [("acme", 3, None, None)]


async def test_omitted_fields_keep_their_values_and_none_clears(aconn: AConn, conn: Conn) -> None:
    await set_limit(aconn, "acme", max_running=3, max_starts=10, window=timedelta(minutes=1))
    await set_limit(aconn, "acme", max_running=5)
    assert _rows(conn) == [("acme", 5, 10, timedelta(minutes=1))]
    await set_limit(aconn, "acme", window=30)  # seconds
    assert _rows(conn) == [("acme", 5, 10, timedelta(seconds=30))]
    await set_limit(aconn, "acme", max_running=None)
    assert _rows(conn) == [("acme", None, 10, timedelta(seconds=30))]
    await set_limit(aconn, "acme", max_running=0, max_starts=None, window=None)
    assert _rows(conn) == [("acme", 0, None, None)]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_running": -1}, "max_running"),
        ({"max_running": True}, "max_running"),
        ({"max_running": 2**31}, "max_running"),
        ({"max_running": "3"}, "max_running"),
        ({"max_starts": 0, "window": 10}, "max_starts"),
        ({"max_starts": 5}, "window"),
        ({"window": 10}, "max_starts"),
        ({"max_starts": 5, "window": 0}, "window"),
        ({"max_starts": 5, "window": timedelta(seconds=-1)}, "window"),
        ({"max_starts": 5, "window": float("nan")}, "window"),
        ({"max_starts": 5, "window": "10s"}, "window"),
        # past MAX_WINDOW, counting starts reaches before PostgreSQL's first year
        ({"max_starts": 5, "window": 212662991090}, "window must be at most 3660 days"),
        ({"max_starts": 5, "window": timedelta(days=3_661)}, "window"),
        ({}, "max_running"),
        ({"max_running": None}, "max_running"),
    ],
)
async def test_bad_settings_raise_and_write_nothing(
    aconn: AConn, conn: Conn, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(LimitError, match=field):
        await set_limit(aconn, "acme", **kwargs)
    assert _rows(conn) == []


async def test_the_longest_window_is_kept_and_listed(aconn: AConn, conn: Conn) -> None:
    await set_limit(aconn, "acme", max_starts=1, window=timedelta(days=3_660))
    assert _rows(conn) == [("acme", None, 1, timedelta(days=3_660))]
    assert [s.window for s in await list_limits(aconn)] == [timedelta(days=3_660)]


@pytest.mark.parametrize(
    "key", ["", "a\x00b", "k" * (MAX_KEY_BYTES + 1), "é" * (MAX_KEY_BYTES // 2 + 1),
            "\ud800", 7, None]
)
async def test_bad_keys_are_refused(aconn: AConn, conn: Conn, key: Any) -> None:
    with pytest.raises(LimitError, match="key"):
        await set_limit(aconn, key, max_running=1)
    with pytest.raises(LimitError, match="key"):
        await clear_limit(aconn, key)
    assert _rows(conn) == []


async def test_a_change_that_breaks_a_rule_keeps_the_old_row(aconn: AConn, conn: Conn) -> None:
    await set_limit(aconn, "acme", max_starts=10, window=60)
    with pytest.raises(LimitError, match="window"):
        await set_limit(aconn, "acme", max_starts=None)  # the window would be left alone
    with pytest.raises(LimitError, match="clear_limit"):
        await set_limit(aconn, "acme", max_starts=None, window=None)  # no policy left
    assert _rows(conn) == [("acme", None, 10, timedelta(minutes=1))]


async def test_set_limit_joins_the_callers_transaction(database_url: str, conn: Conn) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as tx:  # not autocommit
        await set_limit(tx, "acme", max_running=2)
        seen = await (await tx.execute("SELECT count(*) FROM akadze.limits")).fetchone()
        assert seen == (1,)
        assert _rows(conn) == []  # not committed yet
        await tx.rollback()
    assert _rows(conn) == []


async def test_a_refusal_leaves_the_callers_transaction_usable(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as tx:
        await set_limit(tx, "a", max_running=1)
        with pytest.raises(LimitError):
            await set_limit(tx, "b", max_starts=3)
        await set_limit(tx, "c", max_running=2)
        await tx.commit()
    assert [s.key for s in await list_limits(database_url)] == ["a", "c"]


async def test_any_key_a_job_can_carry_can_be_limited(aconn: AConn) -> None:
    keys = [" ", "tenant:acme/éü", "k" * MAX_KEY_BYTES]
    for key in keys:
        await set_limit(aconn, key, max_running=1)
    assert sorted(s.key for s in await list_limits(aconn)) == sorted(keys)


def test_sync_twins(conn: Conn) -> None:
    assert set_limit_sync(conn, "acme", max_starts=2, window=timedelta(seconds=5)) == (
        LimitSummary("acme", None, 2, timedelta(seconds=5))
    )
    set_limit_sync(conn, "acme", max_running=1)
    with pytest.raises(LimitError, match="max_starts"):
        set_limit_sync(conn, "other", max_starts=-4, window=1)
    assert [(s.key, s.max_running, s.max_starts) for s in list_limits_sync(conn)] == [
        ("acme", 1, 2)
    ]
    assert clear_limit_sync(conn, "acme") is True
    assert clear_limit_sync(conn, "acme") is False
    assert list_limits_sync(conn) == []


# -- clear_limit -----------------------------------------------------------------------


async def test_clear_limit_removes_the_row_and_its_start_marks(aconn: AConn, conn: Conn) -> None:
    await set_limit(aconn, "acme", max_starts=5, window=60)
    await set_limit(aconn, "other", max_starts=5, window=60)
    conn.execute(
        "INSERT INTO akadze.start_marks (key, started_at, job_id)"
        " VALUES ('acme', now(), 1), ('acme', now(), 2), ('other', now(), 3)"
    )
    assert await clear_limit(aconn, "acme") is True
    assert await clear_limit(aconn, "acme") is False
    assert _rows(conn) == [("other", None, 5, timedelta(minutes=1))]
    assert conn.execute("SELECT key, job_id FROM akadze.start_marks").fetchall() == [
        ("other", 3)
    ]


# -- list_limits -----------------------------------------------------------------------


async def test_list_limits_counts_running_jobs_in_every_queue(aconn: AConn, conn: Conn) -> None:
    await set_limit(aconn, "b", max_running=4)
    await set_limit(aconn, "a", max_running=2, max_starts=3, window=60)
    _job(conn, key="a", state="running", queue="q1")
    _job(conn, key="a", state="running", queue="q2")
    _job(conn, key="a", state="queued")
    _job(conn, key="a", state="succeeded")
    _job(conn, key="b", state="queued")
    _job(conn, key=None, state="running")
    listed = await list_limits(aconn)
    assert [(s.key, s.running) for s in listed] == [("a", 2), ("b", 0)]


async def test_starts_in_window_is_a_sliding_window_on_the_given_clock(
    aconn: AConn, conn: Conn
) -> None:
    await set_limit(aconn, "a", max_starts=10, window=timedelta(seconds=60))
    await set_limit(aconn, "b", max_running=1)
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    for seconds in (0, 30, 59):
        conn.execute(
            "INSERT INTO akadze.start_marks (key, started_at, job_id) VALUES ('a', %s, 1)",
            (t0 + timedelta(seconds=seconds),),
        )

    async def starts(at: datetime) -> dict[str, int]:
        return {s.key: s.starts_in_window for s in await list_limits(aconn, now=at)}

    assert await starts(t0 + timedelta(seconds=59)) == {"a": 3, "b": 0}
    # a mark exactly one window old has left the window
    assert await starts(t0 + timedelta(seconds=60)) == {"a": 2, "b": 0}
    assert await starts(t0 + timedelta(seconds=119)) == {"a": 0, "b": 0}


async def test_list_limits_accepts_every_reading_source(database_url: str, conn: Conn) -> None:
    set_limit_sync(conn, "acme", max_running=1)
    expected = [LimitSummary("acme", 1, None, None)]
    assert await list_limits(database_url) == expected
    assert await list_limits(Akadze(database_url=database_url)) == expected
    assert list_limits_sync(database_url) == expected
    assert list_limits_sync(Akadze(database_url=database_url)) == expected


# -- the pure merge --------------------------------------------------------------------

counts = st.one_of(st.just(KEEP), st.none(), st.integers(-2, 2**31))
windows = st.one_of(
    st.just(KEEP),
    st.none(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.timedeltas(min_value=timedelta(days=-1), max_value=timedelta(days=3650)),
)
policies = st.one_of(
    st.none(),
    st.builds(
        LimitPolicy,
        max_running=st.one_of(st.none(), st.integers(0, 100)),
        max_starts=st.just(None),
        window=st.just(None),
    ).filter(lambda p: p.max_running is not None),
    st.builds(
        LimitPolicy,
        max_running=st.one_of(st.none(), st.integers(0, 100)),
        max_starts=st.integers(1, 100),
        window=st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=9)),
    ),
)


@given(current=policies, max_running=counts, max_starts=counts, window=windows)
@settings(max_examples=400, deadline=None)
def test_merge_obeys_the_table_rules(
    current: LimitPolicy | None, max_running: Any, max_starts: Any, window: Any
) -> None:
    try:
        merged = merge_policy(
            current, max_running=max_running, max_starts=max_starts, window=window
        )
    except LimitError:
        return
    assert (merged.max_starts is None) == (merged.window is None)
    assert merged.max_running is not None or merged.max_starts is not None
    assert merged.max_running is None or 0 <= merged.max_running < 2**31
    assert merged.max_starts is None or 1 <= merged.max_starts < 2**31
    assert merged.window is None or merged.window > timedelta(0)
    base = current or LimitPolicy(None, None, None)
    if max_running is KEEP:
        assert merged.max_running == base.max_running
    else:
        assert merged.max_running == max_running
    if max_starts is KEEP:
        assert merged.max_starts == base.max_starts


def test_sqlalchemy_session_joins_its_transaction(database_url: str, conn: Conn) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from akadze.database import sqlalchemy_url

    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with Session(engine) as session:
            set_limit_sync(session, "acme", max_running=2)
            session.rollback()
            assert _rows(conn) == []
            set_limit_sync(session, "acme", max_running=3)
            session.commit()
        assert _rows(conn) == [("acme", 3, None, None)]
        assert list_limits_sync(engine) == [LimitSummary("acme", 3, None, None)]
    finally:
        engine.dispose()
