"""Windows dominated by the keys they leave out (akadze.claim._windows,
DOMINATED_RATIO): when the free part's reads are mostly the entries of keys left out
(a key holding most of the queue, hopeless in fair order), the claim lists the queue's
groups with a wide skip scan and reads per group from there; the next claims read per
group from the start. A queue whose windows are not dominated keeps its windows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from claim_support import claim_as_reference, watch_steps

from akadze.claim import memory

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
Conn = psycopg.Connection[tuple[Any, ...]]


def _queue(conn: Conn, head_key: str, head: int, head_block: int, keys: int,
           per_key: int) -> None:
    """Queue q, in queue order: ``head`` jobs of keys ``head_key``0.. taking turns in
    runs of ``head_block``, then ``keys`` keys k0.. taking turns, ``per_key`` each."""
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, run_at) "
        "SELECT 'q', 't', %(hk)s || ((i - 1) / %(block)s %% %(hkeys)s), "
        "       %(now)s - make_interval(secs => 100000 - i) "
        "FROM generate_series(1, %(head)s) i "
        "UNION ALL "
        "SELECT 'q', 't', 'k' || (i %% %(keys)s), %(now)s - make_interval(secs => 50000 - i) "
        "FROM generate_series(1, %(tail)s) i",
        {"hk": head_key, "block": head_block, "hkeys": max(1, head // head_block),
         "head": head, "now": NOW, "keys": keys, "tail": keys * per_key})


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The names of the statements each claim sent."""
    claims: list[list[str]] = []
    watch_steps(monkeypatch, on_claim=lambda: claims.append([]),
                on_step=lambda step, names: claims[-1].extend(names))
    return claims


def test_a_key_holding_the_queue_makes_the_claim_read_per_group(
        conn: Conn, sent: list[list[str]]) -> None:
    # 6 000 jobs of one key, then 100 keys (more than the ordinary skip scan lists)
    _queue(conn, "deep", 6000, 6000, 100, 2)
    for number in range(4):
        assert len(claim_as_reference(conn, queue="q", slots=20, fair=True, now=NOW)) == 20
        if number == 0:
            # the first claim found its windows dominated, and only remembers it
            assert memory.get(conn, "q").dominated and memory.get(conn, "q").groups is None
    windowed = sent  # (the reference claim is not windowed)
    assert "claim_free_read" in windowed[0] and windowed[0].count("claim_groups") <= 1
    # the second found them dominated again and listed the groups (a wide skip scan)
    second = windowed[1]
    assert "claim_free_read" in second and "claim_groups" in second
    assert second.index("claim_groups") > second.index("claim_free_read")
    hints = memory.get(conn, "q")
    assert hints.groups is not None and len(hints.groups) == 101 and hints.wide > 0
    # the next claims read every group's head in their first round trip
    for names in windowed[2:]:
        assert names == ["claim_start", "claim_sweep", "claim_group_heads", "claim_take"]


def test_windows_that_find_other_keys_soon_stay_windows(
        conn: Conn, sent: list[list[str]]) -> None:
    # ten keys of ten jobs each at the head, then 200 keys taking turns: the windows
    # after the head's keys are left out read other keys at once
    _queue(conn, "h", 100, 10, 200, 20)
    for _ in range(2):
        assert len(claim_as_reference(conn, queue="q", slots=20, fair=True, now=NOW)) == 20
    assert memory.get(conn, "q").groups is None
    assert all(names.count("claim_groups") <= 1 for names in sent)
