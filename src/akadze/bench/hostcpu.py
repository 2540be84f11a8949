"""CPU time spent on this host, for the benches that ask whether a run is bound by
the host's cores rather than by waiting: the PostgreSQL server's (every process of
it) and the bench's own processes'.

The server's is read from ``/proc`` (Linux): the postmaster is the parent of the
connection's backend, and the server's time is the postmaster's own, its live
children's, and what its children that ended left to it (``cutime``, ``cstime``),
so backends that exit during the run still count. None when the server is not a
process of this host (a remote server, another container): the backend's pid then
names nothing here, or something that is not PostgreSQL.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

import psycopg

_PROC = Path("/proc")


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (state first)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def postmaster_of(conn: psycopg.Connection[Any]) -> int | None:
    """The pid of the postmaster serving ``conn``, if it runs on this host."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    if row is None:
        return None
    backend = int(row[0])
    try:
        if not (_PROC / str(backend) / "comm").read_text().startswith("postgres"):
            return None
    except OSError:
        return None
    fields = _stat(backend)
    return int(fields[1]) if fields else None


def server_seconds(postmaster: int, settle: float = 0.0) -> float | None:
    """CPU seconds the server has used so far: the postmaster, its live children
    and the children it reaped. None when the postmaster is gone.

    A backend that is ending shows its time neither as its own nor yet as the
    postmaster's, for a moment, until the postmaster has reaped it: a read then
    misses it. ``settle``: read again for that many seconds and keep the most
    (the time only grows), after connections have closed."""
    most = _server_seconds(postmaster)
    end = time.monotonic() + settle
    while most is not None and time.monotonic() < end:
        time.sleep(0.005)
        again = _server_seconds(postmaster)
        most = max(most, again) if again is not None else most
    return most


def _server_seconds(postmaster: int) -> float | None:
    own = _stat(postmaster)
    if own is None:
        return None
    # utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 after the name
    total = sum(int(v) for v in own[11:15])
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None and fields[1] == str(postmaster):
            total += int(fields[11]) + int(fields[12])
    return total / _ticks()


def at_most(seconds_a_job: float) -> tuple[int, float]:
    """This host's cores, and how many jobs a second they could run if each job
    cost ``seconds_a_job`` of CPU and they did nothing else."""
    cores = os.cpu_count() or 1
    return cores, cores / seconds_a_job


def own_seconds() -> float:
    """CPU seconds this process has used so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
