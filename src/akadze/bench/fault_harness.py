"""What every fault scenario shares: the workload, the watcher, the audit.

- :func:`prepare` migrates a scratch database, sets the limits and installs the
  test-only watch (:func:`install`: ``watch_install`` in ``bench/sql/watch.sql``,
  shared with the claim bench and the tests, and the effects table of
  ``fault_install``).
- :func:`enqueue_workload` enqueues a seeded mix of jobs through the public API.
- :class:`Monitor` samples the database from a thread of its own (reconnecting
  through restarts): running jobs per limited key against max_running, progress,
  throughput per interval.
- :func:`audit` checks every promise once the run is over.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg

from ..limits import set_limit_sync
from ..migrate import migrate_connection
from . import queries
from .fault_tasks import work

Conn = psycopg.Connection[Any]

#: (key, max_running, max_starts, window seconds): tight concurrency limits, start
#: rates, and a key with both.
LIMITS: tuple[tuple[str, int | None, int | None, float | None], ...] = (
    ("run2a", 2, None, None),
    ("run2b", 2, None, None),
    ("run3", 3, None, None),
    ("rate20", None, 20, 1.0),
    ("rate15", None, 15, 1.0),
    ("both", 3, 25, 1.0),
)


@dataclass(frozen=True)
class Workload:
    """A seeded job mix: ``keyed`` of the jobs carry one of the limit keys."""

    jobs: int = 3000
    ms: tuple[int, int] = (20, 120)
    fail: float = 0.05
    tx: float = 0.5
    keyed: float = 0.4
    pad: int = 0


def prepare(conn: Conn) -> None:
    migrate_connection(conn)
    for key, max_running, max_starts, window in LIMITS:
        set_limit_sync(conn, key, max_running=max_running, max_starts=max_starts,
                       window=None if window is None else timedelta(seconds=window))
    install(conn)


def install(conn: Conn) -> None:
    """The watch (every start recorded at its commit, max_running checked) and the
    table of the tasks' effects."""
    conn.execute(queries.get("watch_install"))
    conn.execute(queries.get("fault_install"))


def job_items(workload: Workload, rng: random.Random, first: int = 0) -> dict[str | None,
                                                                             list[dict[str, Any]]]:
    """The workload's jobs grouped by limit key (None: no key)."""
    keys = [key for key, *_ in LIMITS]
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for n in range(first, first + workload.jobs):
        key = rng.choice(keys) if rng.random() < workload.keyed else None
        item: dict[str, Any] = {"n": n, "ms": rng.randint(*workload.ms),
                                "fail": rng.random() < workload.fail,
                                "tx": rng.random() < workload.tx}
        if workload.pad:
            item["pad"] = "x" * workload.pad
        groups.setdefault(key, []).append(item)
    return groups


def enqueue_workload(conn: Conn, workload: Workload, rng: random.Random, first: int = 0) -> int:
    """Enqueue the workload in one transaction (enqueue_many per key); return the count."""
    count = 0
    with conn.transaction():
        for key, items in job_items(workload, rng, first).items():
            count += len(work.using(session=conn, limit_key=key).enqueue_many_sync(items))
    return count


# -- monitor ----------------------------------------------------------------------------


@dataclass
class Interval:
    at: float  # seconds since the monitor started, end of the interval
    finished: int  # jobs finished in the interval
    queued: int
    running: int


@dataclass
class Monitor:
    """Samples the database until stopped; survives a server restart."""

    url: str
    period: float = 0.05
    bucket: float = 1.0
    samples: int = 0
    over_samples: int = 0
    max_running: dict[str, tuple[int, int]] = field(default_factory=dict)  # key: (max, limit)
    intervals: list[Interval] = field(default_factory=list)
    finished: int = 0
    queued: int = 0
    running: int = 0
    total: int = 0
    reconnects: int = 0
    started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> Monitor:
        self._thread = threading.Thread(target=self._run, name="fault-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        conn: Conn | None = None
        last_bucket = time.monotonic()
        previous = 0
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=3,
                                           application_name="akadze-fault-monitor")
                self._sample(conn)
            except psycopg.Error:
                self.reconnects += 1
                if conn is not None:
                    conn.close()
                conn = None
                self._stop.wait(0.2)
                continue
            now = time.monotonic()
            if now - last_bucket >= self.bucket:
                self.intervals.append(Interval(round(now - self.started, 1),
                                               self.finished - previous, self.queued,
                                               self.running))
                previous, last_bucket = self.finished, now
            self._stop.wait(self.period)
        if conn is not None:
            conn.close()

    def _sample(self, conn: Conn) -> None:
        with conn.transaction():  # one snapshot for both reads
            over = conn.execute(queries.get("fault_sample_running")).fetchall()
            row = conn.execute(queries.get("fault_progress")).fetchone()
        self.samples += 1
        bad = False
        for key, running, limit in over:
            best = self.max_running.get(key, (0, int(limit)))[0]
            self.max_running[key] = (max(best, int(running)), int(limit))
            bad = bad or int(running) > int(limit)
        self.over_samples += bad
        assert row is not None
        with self._changed:
            self.finished, self.queued, self.running, self.total = (int(v) for v in row)
            self._changed.notify_all()

    def wait_finished(self, expected: int, timeout: float) -> float | None:
        """Block until ``expected`` jobs are finished; the monotonic time it happened,
        or None at the timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.finished < expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(min(left, 0.5))
        return time.monotonic()

    def wait_progress(self, finished: int, timeout: float) -> bool:
        return self.wait_finished(finished, timeout) is not None


# -- audit ----------------------------------------------------------------------------


@dataclass
class Audit:
    states: dict[str, int]
    tx_wrong_effects: int  # succeeded tx jobs without exactly one effect row
    effects_of_unfinished: int  # effect rows of tx jobs that did not succeed
    stale_effects: int  # effect rows written by a run that did not finish the job
    stale_results: int  # plain jobs whose result names another run than the last
    runs: int  # claims in total (sum of run_count)
    retried: int  # attempts spent beyond the first
    given_back: int  # runs handed back without spending an attempt
    rescued: int  # runs taken back from a worker whose lease expired
    injected: int  # injected first-attempt failures
    other_errors: int  # attempts spent on other errors (connection lost in complete_tx...)
    unexplained: int  # jobs whose spent attempts lack a recorded cause
    rerun_jobs: int  # jobs run more than once beyond their injected failure
    violations: int
    max_over: int
    rate_violations: int  # windows over max_starts by the claims' clock (started_at)
    rate_max_over: int
    commit_rate_violations: int  # the same by commit time
    error_kinds: list[tuple[str, str, int]]
    details: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> int:
        return self.states.get("succeeded", 0)

    @property
    def unfinished(self) -> int:
        return (self.states.get("queued", 0) + self.states.get("reserved", 0)
                + self.states.get("running", 0))


def audit(conn: Conn) -> Audit:
    states = {str(s): int(n) for s, n in conn.execute(queries.get("fault_states"))}
    row = conn.execute(queries.get("fault_audit")).fetchone()
    assert row is not None
    v = conn.execute(queries.get("watch_violations")).fetchone()
    r = conn.execute(queries.get("fault_start_violations")).fetchone()
    assert v is not None and r is not None
    kinds = [(str(a), str(b), int(c)) for a, b, c in conn.execute(
        queries.get("fault_error_kinds"))]
    details = [f"over max_running: key {k} running {n} > {m} (job {j}) at {at}"
               for k, n, m, j, at in conn.execute(queries.get("watch_violation_details"))]
    if int(r[0]):
        worst = conn.execute(queries.get("fault_start_violation_details")).fetchall()
        details.append(
            f"worst start-rate window: key {worst[0][0]}, {worst[0][4]} starts; commit lag "
            "of each (committed_at - started_at): "
            + ", ".join(f"{lag.total_seconds() * 1000:.0f} ms" for _, _, lag, _, _ in worst))
    n = [int(x) for x in row]
    return Audit(states, n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], n[9], n[10],
                 n[11], int(v[0]), int(v[2]), int(r[0]), int(r[1]), int(r[2]), kinds, details)


def log_counts(text: str) -> Counter[str]:
    """What the worker logs say happened (first lines of each streak only)."""
    marks = {
        "statement timeout": "canceling statement due to statement timeout",
        "lock timeout": "canceling statement due to lock timeout",
        "outcome discarded": "outcome ",
        "run lost its job": "this run lost the job",
        "lost after reconnect": "the database no longer has it claimed by this run",
        "self-fenced": "could not renew its lease",
        "registered again": "presumed dead; registered again",
        "reply lost, given back": "claimed by a claim whose reply was lost",
        "tracebacks": "Traceback (most recent call last)",
        "crashed": "crashed",
    }
    found: Counter[str] = Counter()
    for line in text.splitlines():
        for name, mark in marks.items():
            if mark in line and (name != "outcome discarded" or "discarded" in line) \
                    and (name != "crashed" or "server conn crashed" not in line):
                # (PgBouncer's own "server conn crashed?", relayed in a psycopg warning
                # after a terminated server connection, is not a worker loop crashing.)
                found[name] += 1
    return found
