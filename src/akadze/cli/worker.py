"""``akadze worker module:app``: run a worker until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import click

from ..database import connect, describe
from ..errors import WorkerError
from ..migrate import available, pending_connection
from ._render import log_to_stderr
from .apps import load_app
from .options import database_url_option, resolve

__all__ = ["LOG_FORMAT", "command", "load_app"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@click.command("worker")
@click.argument("app_reference", metavar="MODULE:APP|PATH.py:APP")
@click.option("--queue", "-q", "queues", multiple=True, metavar="NAME",
              help="A queue to work on (repeatable; default: the queues of the app's tasks).")
@click.option("--slots", "-s", type=click.IntRange(min=1), default=10, show_default=True,
              help="Jobs run at once, per queue.")
@click.option("--fair", is_flag=True, help="Fair claim order across limit_key groups.")
@click.option("--no-listen", "no_listen", is_flag=True,
              help="Poll only, no LISTEN/NOTIFY.")
@click.option("--transaction-pooling", is_flag=True,
              help="The database URL is a pooler's in transaction mode (PgBouncer): no "
              "server-side prepared statements; LISTEN only on --listen-url, else poll.")
@click.option("--listen-url", default=None, metavar="URL",
              help="A direct URL of the same database for LISTEN (default: the database URL).")
@click.option("--connections", type=click.IntRange(min=1), default=None,
              help="The most server connections this worker opens [default: 3, plus 1 per "
              "10 slots over all its queues].")
@click.option("--poll-interval", type=click.FloatRange(min=0.001), default=1.0,
              show_default=True, help="Seconds between polls (jittered).")
@click.option("--lease", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds a heartbeat keeps this worker alive for the others.")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=10.0,
              show_default=True, help="Seconds running jobs get to finish on SIGINT/SIGTERM.")
@click.option("--no-hand-off", "no_hand_off", is_flag=True,
              help="A run of a key with max_running that ends leaves its slot to the next "
                   "claim instead of starting the key's next job itself.")
@click.option("--durable-claims", is_flag=True,
              help="Claims wait for their WAL flush (default: asynchronous commit).")
@click.option("--worker-id", default=None, help="Name of this worker (default: host:pid:random).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@database_url_option
def command(
    app_reference: str, queues: tuple[str, ...], slots: int, fair: bool, no_listen: bool,
    transaction_pooling: bool, listen_url: str | None, connections: int | None,
    poll_interval: float, lease: float, shutdown_timeout: float, no_hand_off: bool,
    durable_claims: bool, worker_id: str | None, log_level: str, database_url: str | None,
) -> None:
    """Run a worker for the app MODULE:APP (or PATH.py:APP) until SIGINT or SIGTERM.

    The first signal stops claiming and waits --shutdown-timeout seconds for running
    jobs, then gives the rest back; a second signal stops at once.
    """
    from ..worker import Worker

    app = load_app(app_reference)
    url = resolve(database_url) if database_url else None
    check_database(url or app.database_url)
    listen = resolve(listen_url) if listen_url else None
    worker = Worker(
        app, queues=list(queues) or None, slots=slots, fair=fair, listen=not no_listen,
        poll_interval=poll_interval, lease=lease, shutdown_timeout=shutdown_timeout,
        worker_id=worker_id, database_url=url, connections=connections,
        listen_url=listen, transaction_pooling=transaction_pooling,
        durable_claims=durable_claims, hand_off=not no_hand_off,
    )
    log_to_stderr(log_level.upper(), LOG_FORMAT)
    # The pool's own warnings repeat at every reconnect attempt, over two lines; the
    # worker reports each database problem once when it starts and once when it ends.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    asyncio.run(worker.run(install_signal_handlers=True))
    stuck = worker.threads_running
    if stuck:
        # Plain task functions cannot be interrupted; their jobs were given back.
        logging.getLogger("akadze.worker").warning(
            "exiting with %d task thread%s still running (%s given back)",
            stuck, "" if stuck == 1 else "s", "its job was" if stuck == 1 else "their jobs were")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def check_database(url: str) -> None:
    """One line (exit 1) before the worker starts when the database cannot be reached,
    refuses the login, or lacks the schema. Once running, a worker rides out outages."""
    with connect(url) as conn:
        pending = pending_connection(conn)
    if len(pending) == len(available()):
        raise WorkerError(f"the database {describe(url)} has no akadze schema: run akadze migrate")
    if pending:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in pending)
        raise WorkerError(
            f"the database {describe(url)} lacks the migrations {names}: run akadze migrate"
        )
