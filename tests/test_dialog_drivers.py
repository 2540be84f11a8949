"""akadze.dialog: one dialog, two drivers. Every case runs through the sync and the async
driver and must give the same result."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from akadze import dialog
from akadze.dialog import Dialog
from akadze.errors import AsyncHookError, ConfigurationError

Run = Callable[[Dialog[Any]], Any]


@pytest.fixture(params=["sync", "async"])
async def run(request: pytest.FixtureRequest, database_url: str) -> Any:
    """Run a dialog on an autocommit connection with the driver of the parameter."""
    if request.param == "sync":
        with psycopg.connect(database_url, autocommit=True) as conn:
            yield lambda steps: dialog.run_sync(conn, steps)
        return
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:

        async def run_async(steps: Dialog[Any]) -> Any:
            return await dialog.run_async(aconn, steps)

        yield run_async


async def outcome(run: Any, steps: Dialog[Any]) -> Any:
    result = run(steps)
    return await result if hasattr(result, "__await__") else result


def _statements() -> Dialog[tuple[Any, ...]]:
    yield from dialog.execute("CREATE TEMP TABLE t (x int PRIMARY KEY)")
    count = yield from dialog.rowcount("INSERT INTO t VALUES (1), (2), (3)")
    first = yield from dialog.one("SELECT x FROM t ORDER BY x")
    none = yield from dialog.one("SELECT x FROM t WHERE x > 9")
    everything = yield from dialog.rows("SELECT x FROM t ORDER BY x DESC")
    named = yield from dialog.rows("SELECT x FROM t WHERE x < 3 ORDER BY x", row_factory=dict_row)
    return count, first, none, everything, named


async def test_statements(run: Any) -> None:
    assert await outcome(run, _statements()) == (
        3, (1,), None, [(3,), (2,), (1,)], [{"x": 1}, {"x": 2}])


def _errors_are_thrown_into_the_dialog() -> Dialog[list[str]]:
    seen: list[str] = []
    yield from dialog.execute("CREATE TEMP TABLE u (x int PRIMARY KEY)")
    yield from dialog.execute("INSERT INTO u VALUES (1)")

    def duplicate() -> Dialog[None]:
        yield from dialog.execute("INSERT INTO u VALUES (2)")
        yield from dialog.execute("INSERT INTO u VALUES (1)")

    try:
        yield from dialog.transaction(duplicate())
    except psycopg.errors.UniqueViolation:
        seen.append("unique violation")
    # The block was rolled back (2 is gone) and the connection is usable.
    seen.extend(str(row[0]) for row in (yield from dialog.rows("SELECT x FROM u")))
    seen.append(str((yield from dialog.usable())))
    return seen


async def test_a_failed_step_is_thrown_into_the_dialog(run: Any) -> None:
    assert await outcome(run, _errors_are_thrown_into_the_dialog()) == [
        "unique violation", "1", "True"]


def _uncaught() -> Dialog[None]:
    yield from dialog.execute("SELECT 1/0")


async def test_an_error_the_dialog_does_not_catch_comes_out(run: Any) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        await outcome(run, _uncaught())


def _pipeline_and_copy() -> Dialog[list[tuple[Any, ...]]]:
    yield from dialog.execute("CREATE TEMP TABLE v (x int, y text)")

    def body() -> Dialog[Any]:
        sent = yield from dialog.send("SELECT 40 + 2")
        yield from dialog.execute("INSERT INTO v VALUES (0, 'piped')")
        return (yield from dialog.fetch_one(sent))

    answer = yield from dialog.pipeline(body())
    yield from dialog.copy_in("COPY v (x, y) FROM STDIN", iter(["1\tone\n2\t", "two\n"]))
    return [answer, *(yield from dialog.rows("SELECT x, y FROM v ORDER BY x"))]


async def test_pipeline_and_copy(run: Any) -> None:
    assert await outcome(run, _pipeline_and_copy()) == [
        (42,), (0, "piped"), (1, "one"), (2, "two")]


def test_the_sync_driver_refuses_async_hooks_and_the_async_one_awaits_them(
    database_url: str,
) -> None:
    calls: list[str] = []

    def plain(conn: Any, label: str) -> None:
        calls.append(f"plain {label}")

    async def coroutine(conn: Any, label: str) -> None:
        calls.append(f"async {label}")

    def steps() -> Dialog[None]:
        yield from dialog.call_hooks([plain, coroutine], "x", kind="on_test", where="this test")

    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(AsyncHookError, match=r"on_test hook .*coroutine.* is async, but this"):
            dialog.run_sync(conn, steps())
        assert calls == []  # refused before any hook ran
    assert issubclass(AsyncHookError, ConfigurationError)

    async def run_async() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            await dialog.run_async(aconn, steps())

    asyncio.run(run_async())
    assert calls == ["plain x", "async x"]


def _checks_first(value: int) -> Dialog[int]:
    if value < 0:
        raise ValueError("checked before any connection")
    row = yield from dialog.one("SELECT %s::int", (value,))
    assert row is not None
    return int(row[0])


async def test_write_and_read_check_arguments_before_connecting(database_url: str) -> None:
    nowhere = "postgresql://u@127.0.0.1:1/none"
    for call in (dialog.write_sync, dialog.read_sync):
        with pytest.raises(ValueError, match="before any connection"):
            call(nowhere, _checks_first(-1))
        assert call(database_url, _checks_first(7)) == 7
    for acall in (dialog.write, dialog.read):
        with pytest.raises(ValueError, match="before any connection"):
            await acall(nowhere, _checks_first(-1))
        assert await acall(database_url, _checks_first(7)) == 7
