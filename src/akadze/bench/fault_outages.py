"""The fault scenarios in which the server, not a worker, goes away.

- :func:`crash`: ``pg_ctl stop -m immediate`` (no flush) and start, mid-run; claims
  commit asynchronously unless the scenario's workers use ``--durable-claims``, so a
  crash can undo a claim whose run has started: the fence (the claim token) and the
  workers' check after reconnecting must keep the superseded runs from finishing.
- :func:`failover`: the server turns read-only (``default_transaction_read_only``),
  as clients see it when a failover left their URL on a server that is now a
  standby, then writable again: once shorter than the lease, once longer.
- :func:`partition`: the connections of some workers stop answering without being
  closed (:class:`~akadze.bench.proxy.Proxy` paused for longer than the lease), the
  others rescue their jobs; then the network comes back: rescued jobs must not be
  finished by the partitioned workers.

These touch the whole server: crash and failover run only on a private server.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import queries
from .fault_context import Context
from .fault_harness import Workload, enqueue_workload, log_counts
from .proxy import Proxy

#: The bursts of the crash scenarios: jobs long enough not to finish before the crash.
BURST = Workload(jobs=0, ms=(300, 900), fail=0.05, tx=0.5, keyed=0.4)


def crash(ctx: Context) -> None:
    """Three crashes of the server under load (immediate stop: no checkpoint, no flush
    of the WAL that asynchronous commits left in memory), each followed by a start.

    A claim is undone only when the crash comes before the next durable commit (any
    outcome write or heartbeat flushes the WAL, claims included) and before the WAL
    writer's next flush (wal_writer_delay, 200 ms). So each crash comes just after a
    burst of new jobs reached idle workers: the earlier jobs are done, the burst is
    being claimed, and its jobs run long enough not to finish before the crash."""
    if ctx.server is None:
        raise ValueError("the crash scenarios need a private server")
    per = max(ctx.options.jobs // 4, 50)
    for _ in range(3):
        ctx.monitor.wait_finished(ctx.expected, 120)
        burst = Workload(**{**BURST.__dict__, "jobs": per})
        with ctx.connect() as conn:  # a new one each time: the last crash ended the old
            ctx.expected += enqueue_workload(conn, burst, ctx.rng, first=ctx.expected)
        time.sleep(ctx.rng.uniform(0.03, 0.15))  # the claims are under way
        down = ctx.server.restart("immediate", down=ctx.rng.uniform(0.3, 1.0))
        ctx.fault()
        ctx.notes.append(f"{per} new jobs, then pg_ctl stop -m immediate and start: "
                         f"{down:.1f} s without a server")


def failover(ctx: Context) -> None:
    """The server turns read-only twice (as a primary that became a standby looks to a
    client whose URL still leads there), for less than the lease and then for twice the
    lease; each time it becomes writable again."""
    if ctx.server is None:
        raise ValueError("the failover scenario needs a private server")
    lease = ctx.options.lease
    with ctx.connect() as conn:
        # This session stays writable whatever the server's default becomes.
        conn.execute(queries.get("fault_session_writable"))
        try:
            for hold in (lease * 0.6, lease * 2.0):
                time.sleep(ctx.rng.uniform(1.5, 2.5))
                conn.execute(queries.get("fault_read_only_on"))
                conn.execute(queries.get("fault_reload"))
                ctx.fault()
                time.sleep(hold)  # the outage itself (fault injection)
                conn.execute(queries.get("fault_read_only_off"))
                conn.execute(queries.get("fault_reload"))
                ctx.fault()
                ctx.notes.append(f"server read-only for {hold:.1f} s (lease {lease:g} s), "
                                 "then writable again")
        finally:
            conn.execute(queries.get("fault_read_only_off"))
            conn.execute(queries.get("fault_reload"))


def start_proxy(url: str) -> tuple[Proxy, str]:
    """A proxy to the server of ``url`` (TCP), and ``url`` through it."""
    params = conninfo_to_dict(url)
    host = str(params.get("host") or "127.0.0.1")
    if host.startswith("/"):
        raise ValueError("the partition scenario needs a TCP URL, not a unix socket")
    proxy = Proxy(host, int(str(params.get("port") or 5432))).start()
    return proxy, make_conninfo(url, host="127.0.0.1", port=str(proxy.port))


def partitioned(index: int) -> bool:
    """Which workers reach the server through the proxy: every second one."""
    return index % 2 == 0


def partition(ctx: Context) -> None:
    """Twice: the proxy stops forwarding (nothing closed) until the partitioned workers'
    running jobs were rescued by the others and some claimed again (at least one and a
    half leases), then forwards again."""
    proxy = ctx.proxy
    if proxy is None:
        raise ValueError("the partition scenario runs its workers through a proxy")
    lease = ctx.options.lease
    behind = [w for w in ctx.cluster.procs.values() if partitioned(w.index)]
    with ctx.connect() as conn:
        for _ in range(2):
            time.sleep(ctx.rng.uniform(1.5, 2.5))
            runs = [(int(r[0]), r[1]) for w in behind for r in conn.execute(
                queries.get("fault_worker_jobs"), {"worker_id": w.worker_id}).fetchall()]
            proxy.pause()
            ctx.fault()
            began = time.monotonic()
            moved = taken = 0
            ids, tokens = [i for i, _ in runs], [t for _, t in runs]
            while time.monotonic() - began < max(60.0, lease * 10):
                row = conn.execute(queries.get("fault_jobs_moved_on"), {
                    "ids": ids, "tokens": tokens, "worker_id": ""}).fetchone()
                assert row is not None
                moved, taken = int(row[0]), int(row[1])
                held = time.monotonic() - began
                if held >= lease * 1.5 and moved == len(ids) and (taken > 0 or not ids):
                    break
                time.sleep(0.05)
            held = time.monotonic() - began
            proxy.resume()
            ctx.fault()
            ctx.notes.append(
                f"proxy paused {held:.1f} s (lease {lease:g} s) for "
                f"{', '.join(w.worker_id for w in behind)} holding {len(ids)} running jobs: "
                f"{moved} rescued, {taken} claimed again by the other workers; then resumed")
            time.sleep(lease)  # let the late writes arrive before the next pause
    found = log_counts("\n".join(
        w.log.read_text(errors="replace") for w in behind if w.log.exists()))
    ctx.notes.append(
        f"partitioned workers after the network came back: {found['self-fenced']} "
        f"self-fenced, {found['lost after reconnect']} runs found lost after reconnecting, "
        f"{found['outcome discarded']} outcome writes refused by the fence, "
        f"{found['run lost its job']} complete_tx refused (JobLost), "
        f"{found['registered again']} re-registrations")


def starts_twice(logdir: Path) -> tuple[int, int]:
    """From the start logs of the tasks (``AKADZE_FAULT_STARTS``): how many runs were
    started with a (job, run_count) another run had started with too (a claim undone
    by a crash, then made again), and the starts in total."""
    seen: Counter[tuple[str, str]] = Counter()
    starts = 0
    for path in logdir.glob("starts-*.txt"):
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split()
            if len(fields) >= 3:
                seen[(fields[0], fields[1])] += 1
                starts += 1
    return sum(n - 1 for n in seen.values() if n > 1), starts
