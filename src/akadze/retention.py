"""Retention: prune finished jobs in bounded batches (not built yet)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    from .app import Akadze


async def prune(
    conn: psycopg.AsyncConnection[tuple[object, ...]], app: Akadze, now: datetime
) -> int:
    """Delete finished jobs older than the app's retention; return how many. (stub)"""
    return 0
