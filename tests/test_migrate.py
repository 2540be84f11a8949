from __future__ import annotations

import concurrent.futures

import psycopg

from akadze import migrate as migrate_async
from akadze.migrate import available, migrate_sync, pending_sync


def test_migrate_from_empty_then_rerun_is_idempotent(empty_database_url: str) -> None:
    applied = migrate_sync(empty_database_url)
    assert [x.version for x in applied] == [x.version for x in available()]
    assert migrate_sync(empty_database_url) == []
    assert pending_sync(empty_database_url) == []
    with psycopg.connect(empty_database_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM akadze.migrations ORDER BY 1")]
    assert versions == [x.version for x in available()]


def test_pending_lists_everything_on_a_fresh_database(empty_database_url: str) -> None:
    assert [x.version for x in pending_sync(empty_database_url)] == [
        x.version for x in available()
    ]


def test_concurrent_migrate_applies_each_migration_once(empty_database_url: str) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: migrate_sync(empty_database_url), range(4)))
    applied = [len(r) for r in results]
    assert sorted(applied) == [0, 0, 0, len(available())]


async def test_async_migrate(empty_database_url: str) -> None:
    applied = await migrate_async(empty_database_url)
    assert len(applied) == len(available())
    assert await migrate_async(empty_database_url) == []
