"""``akadze bench idle``: what many idle workers cost the server, and a busy worker.

``--workers`` idle workers (default 100: :class:`~akadze.worker.Worker` objects with
one slot and default settings, listening, spread over ``--processes`` processes) serve
a queue with nothing ready; one busy worker (``--busy-slots`` slots, in this process)
drains a backlog of ``--busy-jobs`` no-op jobs on another queue of the same database.
Each idle group runs twice side by side in the same run: with the idle easing on (the
look before an idle claim and the spread of wake-ups, the default) and off
(``akadze.worker.IDLE_EASING``, flipped in the idle workers' processes only).

Reported:

- the server CPU of the idle workers' backends (``/proc/<pid>/stat`` of every backend
  of the scratch database but the bench's own), in % of one core, over ``--window``
  seconds with nothing else running;
- the busy worker's jobs/s alone and beside the idle workers (on, off); the three
  alternate, in a rotating order, ``--rounds`` times, and medians are reported;
- the storm: a producer enqueues single jobs into the idle workers' own queue, each in
  a transaction of its own, at each of ``--storm-rates`` per second for ``--storm-seconds``:
  claims (turn acquisitions, counted by the idle workers' processes) and looks per
  job, pick-up latency (from just before the enqueue's commit was sent to the task's
  first line, one clock: CLOCK_MONOTONIC is the host's), and server CPU.

Each idle worker holds up to 3 server connections (the default budget of a listening
worker of one slot: LISTEN, which its heartbeats borrow, claims 1 and general pool 1):
100 of them need 300 of the server's ``max_connections``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import threading
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg.types.json import Jsonb

from ..app import Akadze
from ..cli.options import database_url_option, print_table, resolve
from ..database import connect, describe
from ..worker import IDLE_EASING, Worker, WorkerEvent
from .claims import host_details, scratch_database
from .proxy import process_cpu_seconds

Conn = psycopg.Connection[Any]

IDLE_QUEUE = "idle"
BUSY_QUEUE = "busy"
TASK = "bench.idle.noop"
#: Seconds the idle workers settle after they all started, before anything is timed.
SETTLE = 3.0
#: The storm's first jobs, left out of its percentiles (reported in its max).
WARM_UP = 5


def _app(url: str) -> Akadze:
    app = Akadze(url)

    @app.task(TASK)
    async def noop(sent: float | None = None) -> float | None:
        # The storm's jobs carry the producer's clock reading: the pick-up latency.
        return None if sent is None else time.monotonic() - sent

    return app


# -- the idle workers' processes -----------------------------------------------------------


def _idle_process(url: str, count: int, easing: bool, maintenance: bool, commands: Any,
                  replies: Any) -> None:
    IDLE_EASING.look_first = IDLE_EASING.spread = easing
    asyncio.run(_serve(url, count, maintenance, commands, replies))


async def _serve(url: str, count: int, maintenance: bool, commands: Any, replies: Any) -> None:
    app = _app(url)
    ready = [asyncio.Event() for _ in range(count)]

    def on_event(number: int) -> Any:
        listening = False

        def seen(event: WorkerEvent) -> None:
            nonlocal listening
            if event.kind == "listening":
                listening = True
            elif event.kind == "idle" and listening:
                ready[number].set()
        return seen

    async with AsyncExitStack() as stack:
        workers = [Worker(app, queues=[IDLE_QUEUE], slots=1, maintenance=maintenance,
                          on_event=on_event(n))
                   for n in range(count)]
        await asyncio.gather(*(stack.enter_async_context(w) for w in workers))
        await asyncio.gather(*(event.wait() for event in ready))
        replies.put(("ready",))
        while True:
            command = await asyncio.to_thread(commands.get)
            if command == "counts":
                replies.put(("counts", IDLE_EASING.claims, IDLE_EASING.looks,
                             IDLE_EASING.skipped))
            else:
                break
    replies.put(("stopped",))


@dataclass
class Counts:
    claims: int = 0
    looks: int = 0
    skipped: int = 0

    def per_second(self, seconds: float) -> tuple[float, float]:
        """(claims/s, looks/s) over ``seconds`` (about: the counts are read around it)."""
        return self.claims / seconds, self.looks / seconds

    def __sub__(self, other: Counts) -> Counts:
        return Counts(self.claims - other.claims, self.looks - other.looks,
                      self.skipped - other.skipped)


class IdleGroup:
    """``workers`` idle workers over ``processes`` processes, easing on or off."""

    def __init__(self, url: str, workers: int, processes: int, easing: bool,
                 maintenance: bool = True) -> None:
        ctx = multiprocessing.get_context("spawn")
        sizes = [workers // processes + (1 if n < workers % processes else 0)
                 for n in range(processes)]
        self._commands = [ctx.Queue() for _ in sizes]
        self._replies = ctx.Queue()
        self._procs = [ctx.Process(target=_idle_process, daemon=True,
                                   args=(url, size, easing, maintenance, commands,
                                         self._replies))
                       for size, commands in zip(sizes, self._commands, strict=True) if size]
        self._commands = self._commands[:len(self._procs)]

    def __enter__(self) -> IdleGroup:
        for proc in self._procs:
            proc.start()
        self._collect("ready", 180)
        return self

    def __exit__(self, *exc: object) -> None:
        for commands in self._commands:
            commands.put("stop")
        try:
            self._collect("stopped", 60)
        finally:
            for proc in self._procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()

    def counts(self) -> Counts:
        for commands in self._commands:
            commands.put("counts")
        total = Counts()
        for reply in self._collect("counts", 30):
            total = Counts(total.claims + reply[1], total.looks + reply[2],
                           total.skipped + reply[3])
        return total

    def _collect(self, kind: str, within: float) -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + within
        while len(got) < len(self._procs):
            left = deadline - time.monotonic()
            if left <= 0 or (not all(p.is_alive() for p in self._procs) and kind != "stopped"):
                raise click.ClickException(f"idle workers: no {kind!r} from every process")
            try:
                reply = self._replies.get(timeout=min(left, 1.0))
            except Exception:
                continue
            if reply[0] == kind:
                got.append(reply)
        return got


# -- measurements ------------------------------------------------------------------------


def backend_pids(conn: Conn) -> list[int]:
    """The backends of this database but this connection's own."""
    return [int(r[0]) for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")]


def _cpu(pids: Sequence[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
        except OSError:
            continue
        found[pid] = process_cpu_seconds(pid)
    return found


def server_cpu_percent(conn: Conn, seconds: float) -> float:
    """% of one core the database's other backends used over ``seconds`` (those
    present at both ends; NaN when the server's processes are not local)."""
    before = _cpu(backend_pids(conn))
    began = time.monotonic()
    time.sleep(seconds)
    after = _cpu(backend_pids(conn))
    took = time.monotonic() - began
    shared = before.keys() & after.keys()
    if not shared:
        return float("nan")
    return 100 * sum(after[p] - before[p] for p in shared) / took


async def _drain(url: str, jobs: int, slots: int) -> float:
    """jobs/s of one worker of ``slots`` slots draining ``jobs`` no-op jobs of BUSY_QUEUE."""
    app = Akadze(url)
    done = 0
    finished = asyncio.Event()

    @app.task(TASK)
    async def noop(sent: float | None = None) -> None:
        nonlocal done
        done += 1
        if done == jobs:
            finished.set()

    with connect(url) as conn:
        conn.execute("DELETE FROM akadze.jobs WHERE queue = %s", (BUSY_QUEUE,))
        conn.execute("INSERT INTO akadze.jobs (queue, task) "
                     "SELECT %s, %s FROM generate_series(1, %s)", (BUSY_QUEUE, TASK, jobs))
        conn.execute("VACUUM ANALYZE akadze.jobs")
        began = time.perf_counter()
        async with Worker(app, queues=[BUSY_QUEUE], slots=slots) as worker:
            async with asyncio.timeout(max(120, jobs / 50)):
                await finished.wait()
            await worker.wait_idle()
            seconds = time.perf_counter() - began
        row = conn.execute("SELECT count(*) FROM akadze.jobs WHERE queue = %s "
                           "AND state = 'succeeded'", (BUSY_QUEUE,)).fetchone()
        conn.execute("DELETE FROM akadze.jobs WHERE queue = %s", (BUSY_QUEUE,))
    if not row or int(str(row[0])) != jobs:
        raise click.ClickException(f"expected {jobs} succeeded jobs, found {row}")
    return jobs / seconds


@dataclass
class Storm:
    easing: bool
    rate: float
    jobs: int = 0
    seconds: float = 0.0
    counts: Counts = field(default_factory=Counts)
    latencies: list[float] = field(default_factory=list)  # seconds, in enqueue order
    cpu: float = float("nan")  # % of one core, the idle workers' backends

    def pct(self, share: float) -> float:
        """Of the jobs after the first WARM_UP (they meet the idle workers' first claims,
        whose statements are planned for the first time on their connections)."""
        ordered = sorted(self.latencies[WARM_UP:])
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(len(ordered) * share))] * 1000


def _produce(url: str, rate: float, seconds: float) -> int:
    """Single enqueues into IDLE_QUEUE, each committed on its own, at ``rate``/s."""
    count = int(rate * seconds)
    with psycopg.connect(url, autocommit=True) as conn:
        began = time.monotonic()
        for number in range(count):
            pause = began + number / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            conn.execute("INSERT INTO akadze.jobs (queue, task, args) VALUES (%s, %s, %s)",
                         (IDLE_QUEUE, TASK, Jsonb({"sent": time.monotonic()})))
    return count


def measure_storm(conn: Conn, url: str, group: IdleGroup, easing: bool, rate: float,
                  seconds: float) -> Storm:
    storm = Storm(easing, rate)
    conn.execute("DELETE FROM akadze.jobs WHERE queue = %s", (IDLE_QUEUE,))
    before = group.counts()
    pids = backend_pids(conn)
    cpu_before = _cpu(pids)
    began = time.monotonic()
    produced: list[int] = []
    producer = threading.Thread(target=lambda: produced.append(_produce(url, rate, seconds)))
    producer.start()
    producer.join()
    deadline = time.monotonic() + 60
    while True:
        row = conn.execute("SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*) "
                           "FROM akadze.jobs WHERE queue = %s", (IDLE_QUEUE,)).fetchone()
        assert row is not None
        if row[0] == row[1] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    storm.seconds = time.monotonic() - began
    cpu_after = _cpu(pids)
    shared = cpu_before.keys() & cpu_after.keys()
    storm.cpu = 100 * sum(cpu_after[p] - cpu_before[p] for p in shared) / storm.seconds
    storm.counts = group.counts() - before
    storm.jobs = produced[0]
    storm.latencies = [float(str(r[0])) for r in conn.execute(
        "SELECT (result #>> '{}')::float8 FROM akadze.jobs "
        "WHERE queue = %s AND state = 'succeeded' ORDER BY id", (IDLE_QUEUE,))]
    conn.execute("DELETE FROM akadze.jobs WHERE queue = %s", (IDLE_QUEUE,))
    return storm


@dataclass
class Results:
    alone: list[float] = field(default_factory=list)  # busy jobs/s
    beside: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    cpu: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    #: (claims/s, looks/s) of the idle workers over each CPU window
    rates: dict[bool, list[tuple[float, float]]] = field(
        default_factory=lambda: {True: [], False: []})
    storms: list[Storm] = field(default_factory=list)


def _med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _label(easing: bool) -> str:
    return "on" if easing else "off"


def rows(results: Results) -> list[tuple[str, ...]]:
    alone = _med(results.alone)
    out: list[tuple[str, ...]] = [("busy worker alone", "", "", "", f"{alone:,.0f}", "1.00")]
    for easing in (True, False):
        beside = _med(results.beside[easing])
        rates = results.rates[easing]
        out.append((f"beside the idle workers, easing {_label(easing)}",
                     f"{_med(results.cpu[easing]):.2f}",
                     f"{_med([r[0] for r in rates]):.1f}", f"{_med([r[1] for r in rates]):.1f}",
                     f"{beside:,.0f}", f"{beside / alone:.2f}"))
    return out


def storm_rows(results: Results) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for storm in sorted(results.storms, key=lambda s: (s.rate, not s.easing)):
        jobs = max(storm.jobs, 1)
        out.append((f"{storm.rate:g}", _label(storm.easing), str(storm.jobs),
                    f"{storm.counts.claims / jobs:.2f}",
                    f"{storm.counts.looks / jobs:.2f}", f"{storm.pct(0.5):.2f}",
                    f"{storm.pct(0.99):.2f}",
                    f"{max(storm.latencies, default=float('nan')) * 1000:.2f}",
                    f"{storm.cpu:.1f}"))
    return out


COLUMNS = ["run", "idle server CPU, % of a core", "idle claims/s", "idle looks/s",
           "busy jobs/s", "ratio to alone"]
STORM_COLUMNS = ["enqueues/s", "easing", "jobs", "claims/job", "looks/job", "pick-up p50 ms",
                 "pick-up p99 ms", "max ms (all)", "server CPU %"]


def write_report(path: Path, host: dict[str, str], options: dict[str, Any],
                 results: Results) -> None:
    def table(columns: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
        return ["| " + " | ".join(columns) + " |",
                "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|",
                *("| " + " | ".join(r) + " |" for r in body)]

    def each(values: Sequence[float], fmt: str) -> str:
        return ", ".join(format(v, fmt) for v in values)

    lines = [
        "# Idle bench: many idle workers beside a busy one",
        "",
        "Measured with `akadze bench idle` (`src/akadze/bench/idle.py`).",
        "",
        "Host: " + "; ".join(f"{k} {v}" for k, v in host.items()) + ".",
        "",
        f"Setup: {options['workers']} idle workers (`Worker` objects, 1 slot, default "
        f"settings: poll_interval 1 s, listening, maintenance "
        f"{'on' if options['maintenance'] else 'off'}) over "
        f"{options['processes']} processes on queue `{IDLE_QUEUE}`, where nothing is "
        f"ready; one busy worker ({options['busy_slots']} slots, this process) draining "
        f"{options['busy_jobs']:,} no-op jobs on queue `{BUSY_QUEUE}` of the same "
        f"database. *Easing on*: the idle claim loops look (`worker_queue_ready`) before "
        f"they claim and spread their wake-ups over their peers (the default); *off*: "
        f"neither (`akadze.worker.IDLE_EASING`, flipped in the idle workers' processes). "
        f"Alone, beside (on) and beside (off) alternate in a rotating order, "
        f"{options['rounds']} rounds; medians.",
        "",
        "## Idle workers: server CPU and the busy worker's throughput",
        "",
        f"*Idle server CPU*: user + system CPU of the idle workers' backends "
        f"(`/proc/<pid>/stat`), over {options['window']:g} s with nothing else running "
        f"(after {SETTLE:g} s of settling), in % of one core.",
        "",
        *table(COLUMNS, rows(results)),
        "",
        f"Runs: alone {each(results.alone, ',.0f')} jobs/s; beside (on) "
        f"{each(results.beside[True], ',.0f')}; beside (off) "
        f"{each(results.beside[False], ',.0f')}. Idle CPU (on) "
        f"{each(results.cpu[True], '.2f')} %; (off) {each(results.cpu[False], '.2f')} %.",
    ]
    if results.storms:
        lines += [
            "",
            "## Notification storm",
            "",
            f"A producer enqueues single jobs into the idle workers' own queue, each in a "
            f"transaction of its own, at each rate for {options['storm_seconds']:g} s; "
            "every enqueue notifies every idle worker. "
            "*claims/job*: claims made by the idle workers (each takes the queue's turn) "
            "per job enqueued; *looks/job*: ready checks (no lock); *pick-up*: from just "
            "before the enqueue's commit was sent to the task's first line, percentiles "
            f"of the jobs after the first {WARM_UP} (those meet the idle workers' first "
            "claims, whose statements are then planned for the first time on each "
            "connection: with the look, an idle worker has not claimed before), *max* of "
            "all; *server CPU*: the idle workers' backends over the storm, % of one core.",
            "",
            *table(STORM_COLUMNS, storm_rows(results)),
        ]
    lines += [
        "",
        f"Reproduce: `flock -x /work/wt/notes/machine.lock akadze bench idle {options['argv']} "
        f"--report {path}`.",
    ]
    path.write_text("\n".join(lines) + "\n")


@click.command("idle")
@click.option("--workers", type=click.IntRange(1, 120), default=100, show_default=True,
              help="Idle workers (up to 3 server connections each).")
@click.option("--processes", type=click.IntRange(1, 32), default=4, show_default=True,
              help="Processes the idle workers are spread over.")
@click.option("--busy-jobs", type=click.IntRange(100), default=20_000, show_default=True,
              help="Backlog of each busy drain.")
@click.option("--busy-slots", type=click.IntRange(1), default=20, show_default=True)
@click.option("--window", type=click.FloatRange(1, 120), default=10.0, show_default=True,
              help="Seconds over which the idle workers' server CPU is measured.")
@click.option("--rounds", type=click.IntRange(1, 10), default=3, show_default=True)
@click.option("--storm-rates", "storm_rates_text", default="10,100", show_default=True,
              help="Single enqueues per second into the idle queue, comma-separated "
              "(0 skips the storm).")
@click.option("--storm-seconds", type=click.FloatRange(1, 120), default=10.0,
              show_default=True)
@click.option("--maintenance/--no-maintenance", default=True, show_default=True,
              help="Whether the idle workers take part in cluster maintenance.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown report here.")
@database_url_option
def command(workers: int, processes: int, busy_jobs: int, busy_slots: int, window: float,
            rounds: int, storm_rates_text: str, storm_seconds: float, maintenance: bool,
            report: Path | None, database_url: str | None) -> None:
    """Server CPU of many idle workers, and the throughput of a busy one beside them."""
    try:
        storm_rates = [float(r) for r in storm_rates_text.split(",") if r.strip()]
    except ValueError:
        raise click.BadParameter(f"not numbers: {storm_rates_text!r}",
                                 param_hint="--storm-rates") from None
    storm_rates = [r for r in storm_rates if r > 0]
    url = resolve(database_url)
    click.echo(f"benching on {describe(url)}")
    results = Results()
    order: list[bool | None] = [None, True, False]  # alone, beside (on), beside (off)
    with scratch_database(url, False) as scratch, connect(scratch) as conn:
        host = host_details(conn)
        for number in range(rounds):
            turn = order[number % 3:] + order[:number % 3]
            for easing in turn:
                if easing is None:
                    results.alone.append(asyncio.run(_drain(scratch, busy_jobs, busy_slots)))
                    click.echo(f"round {number + 1}: alone {results.alone[-1]:,.0f} jobs/s",
                               err=True)
                    continue
                with IdleGroup(scratch, workers, processes, easing, maintenance) as group:
                    time.sleep(SETTLE)
                    before = group.counts()
                    results.cpu[easing].append(server_cpu_percent(conn, window))
                    results.rates[easing].append((group.counts() - before).per_second(window))
                    results.beside[easing].append(
                        asyncio.run(_drain(scratch, busy_jobs, busy_slots)))
                    for rate in storm_rates if number == rounds - 1 else []:
                        results.storms.append(measure_storm(conn, scratch, group, easing,
                                                            rate, storm_seconds))
                click.echo(f"round {number + 1}: easing {_label(easing)}: idle CPU "
                           f"{results.cpu[easing][-1]:.2f} %, beside "
                           f"{results.beside[easing][-1]:,.0f} jobs/s", err=True)
    print_table("busy worker beside idle workers (medians)", COLUMNS, rows(results))
    if results.storms:
        print_table("notification storm", STORM_COLUMNS, storm_rows(results))
    if report is not None:
        argv = (f"--workers {workers} --processes {processes} --busy-jobs {busy_jobs} "
                f"--busy-slots {busy_slots} --window {window:g} --rounds {rounds} "
                f"--storm-rates {storm_rates_text} --storm-seconds {storm_seconds:g}"
                + ("" if maintenance else " --no-maintenance"))
        write_report(report, host, {"workers": workers, "processes": processes,
                                    "busy_jobs": busy_jobs, "busy_slots": busy_slots,
                                    "window": window, "rounds": rounds, "argv": argv,
                                    "maintenance": maintenance,
                                    "storm_seconds": storm_seconds}, results)
        click.echo(f"report written to {report}")
