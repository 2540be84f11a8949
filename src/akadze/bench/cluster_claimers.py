"""The claimer processes of ``akadze bench cluster`` and the sampler beside them.

A pool of claimer processes is started once (spawn) and reused for every cell: for a
cell, the first N of them connect to the queue through the proxy, report their
server backend's pid, and at an agreed start time (``time.monotonic`` is one clock
for every process on Linux) claim in a loop until the cell's end: claim up to
``slots``, complete what came back on the same connection with a fenced UPDATE (one
round trip outside the queue's turn), again. A claim that comes back empty means the
queue ran dry: that claimer stops and the cell's window ends there.

The modes: ``plain`` is the uncoordinated floor, one ``FOR UPDATE SKIP LOCKED``
statement with no limits and no turn (``cluster_plain_claim``); ``fifo`` is the public
``claim`` in queue order; ``fair`` is ``claim(fair=True)`` on a queue with limits.

Beside them the bench's own process samples, over a direct connection, how many of
the claimers' backends wait for the queue's turn (the advisory lock of
``claim_start``), and the CPU the backends and the proxy have used (``/proc``).
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..claim import claim
from . import queries
from .proxy import process_cpu_seconds

Conn = psycopg.Connection[Any]

MODES = ("plain", "fifo", "fair")


@dataclass
class ClaimerResult:
    """What one claimer did in one cell (times are ``time.monotonic``)."""

    claims: list[tuple[float, int, float]] = field(default_factory=list)  # (end, jobs, s)
    dry_at: float | None = None
    errors: list[str] = field(default_factory=list)


def _claimer(number: int, commands: Any, replies: Any) -> None:
    """One claimer process: serve cells until told to stop."""
    while True:
        command = commands.get()
        if command[0] == "stop":
            return
        _, url, mode, queue, slots = command
        try:
            conn: Conn = psycopg.connect(url, autocommit=True)
            # As a worker commits its claims (durable_claims off), session-level here:
            # the bench's connections go to the server through the proxy, no pooler.
            conn.execute("SET synchronous_commit = off")
            row = conn.execute(queries.get("cluster_backend_pid")).fetchone()
        except psycopg.Error as exc:
            replies.put(("ready", number, 0, f"{type(exc).__name__}: {exc}"))
            commands.get()
            replies.put(("done", number, ClaimerResult(errors=[str(exc)])))
            continue
        replies.put(("ready", number, int(row[0]) if row else 0, ""))
        go = commands.get()
        result = ClaimerResult()
        if go[0] == "run":
            _run(conn, mode, queue, slots, number, go[1], go[2], result)
        conn.close()
        replies.put(("done", number, result))


def _run(conn: Conn, mode: str, queue: str, slots: int, number: int, start_at: float,
         end_at: float, result: ClaimerResult) -> None:
    wait = start_at - time.monotonic()
    if wait > 0:
        time.sleep(wait)  # the agreed start of the cell, not a synchronisation
    complete = queries.get("bench_load_complete")
    plain = queries.get("cluster_plain_claim")
    worker_id = f"cluster-{number}"
    while (began := time.monotonic()) < end_at:
        try:
            if mode == "plain":
                rows = conn.execute(plain, {"queue": queue, "slots": slots,
                                            "worker_id": worker_id}).fetchall()
                ids = [int(r[0]) for r in rows]
                run_counts = [int(r[1]) for r in rows]
            else:
                got = claim(conn, queue=queue, slots=slots, fair=mode == "fair",
                            worker_id=worker_id)
                ids = [j.id for j in got]
                run_counts = [j.run_count for j in got]
            ended = time.monotonic()
            if not ids:
                result.dry_at = ended
                return
            result.claims.append((ended, len(ids), ended - began))
            conn.execute(complete, {"ids": ids, "run_counts": run_counts})
        except psycopg.Error as exc:
            result.errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
            if conn.broken:
                return


class ClaimerPool:
    """``size`` claimer processes, started once and lent to cell after cell."""

    def __init__(self, size: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._replies: Any = ctx.Queue()
        self._commands: list[Any] = [ctx.Queue() for _ in range(size)]
        self._procs = [ctx.Process(target=_claimer, args=(i, self._commands[i], self._replies),
                                   daemon=True) for i in range(size)]
        for proc in self._procs:
            proc.start()

    def _collect(self, kind: str, count: int) -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []
        while len(got) < count:
            try:
                reply = self._replies.get(timeout=120)
            except queue_module.Empty:
                raise RuntimeError(f"claimer processes did not answer ({kind})") from None
            if reply[0] == kind:
                got.append(reply)
        return got

    def connect(self, count: int, url: str, mode: str, queue: str, slots: int) -> list[int]:
        """Connect the first ``count`` claimers; their backends' pids."""
        for commands in self._commands[:count]:
            commands.put(("cell", url, mode, queue, slots))
        ready = self._collect("ready", count)
        failed = [r[3] for r in ready if r[3]]
        if failed:
            for commands in self._commands[:count]:
                commands.put(("skip",))
            self._collect("done", count)
            raise RuntimeError(f"a claimer could not connect: {failed[0]}")
        return [int(r[2]) for r in ready]

    def run(self, count: int, start_at: float, end_at: float) -> list[ClaimerResult]:
        for commands in self._commands[:count]:
            commands.put(("run", start_at, end_at))
        return [r[2] for r in self._collect("done", count)]

    def close(self) -> None:
        for commands in self._commands:
            commands.put(("stop",))
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


@dataclass
class Samples:
    """The sampler's look at one cell: turn waits, and CPU as (time, server s, proxy s)."""

    looks: int = 0
    waiting: int = 0
    cpu: list[tuple[float, float, float]] = field(default_factory=list)

    def cpu_between(self, start: float, end: float) -> tuple[float, float, float]:
        """(seconds, server CPU s, proxy CPU s) between the samples nearest the window."""
        # A look after the claimers disconnected finds their backends gone (NaN).
        inside = [s for s in self.cpu if start - 0.05 <= s[0] <= end + 0.05 and s[1] == s[1]]
        if len(inside) < 2:
            return 0.0, float("nan"), float("nan")
        first, last = inside[0], inside[-1]
        return last[0] - first[0], last[1] - first[1], last[2] - first[2]


def server_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds of the server's backends ``pids`` (NaN when they are not local)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "postgres":
                    return float("nan")
        except OSError:
            return float("nan")
        total += process_cpu_seconds(pid)
    return total


class Sampler:
    """Samples the claimers' backends from another thread until stopped."""

    def __init__(self, url: str, pids: list[int], proxy_pid: int, interval: float) -> None:
        self._url = url
        self._pids = pids
        self._proxy_pid = proxy_pid
        self._interval = interval
        self._stop = threading.Event()
        self.samples = Samples()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        sql = queries.get("cluster_turn_waits")
        with psycopg.connect(self._url, autocommit=True) as conn:
            while True:
                self.samples.cpu.append((time.monotonic(), server_cpu_seconds(self._pids),
                                         process_cpu_seconds(self._proxy_pid)))
                if self._stop.is_set():
                    return
                row = conn.execute(sql, {"pids": self._pids}).fetchone()
                if row is not None:
                    self.samples.looks += 1
                    self.samples.waiting += int(row[0])
                self._stop.wait(self._interval)
