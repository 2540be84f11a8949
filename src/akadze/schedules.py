"""Periodic schedules (not built yet)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    from .app import Akadze


async def enqueue_due(
    conn: psycopg.AsyncConnection[tuple[object, ...]], app: Akadze, now: datetime
) -> list[int]:
    """Enqueue every due fire of the app's schedules exactly once; return new job ids. (stub)"""
    return []
