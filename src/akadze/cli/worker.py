"""``akadze worker module:app``: run a worker until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
import threading
from typing import Any

import click

from ..errors import ConfigurationError
from ._render import log_to_stderr
from .options import database_url_option, resolve

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def load_app(reference: str) -> Any:
    """The Akadze app named by ``module:attribute`` (the current directory is importable)."""
    from ..app import Akadze

    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"expected the app as module:attribute (for example myproject.jobs:app), "
            f"got {reference!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attribute, None)
    if not isinstance(app, Akadze):
        raise ConfigurationError(
            f"{reference!r} is not an Akadze app (found {type(app).__name__})"
        )
    return app


@click.command("worker")
@click.argument("app_reference", metavar="MODULE:APP")
@click.option("--queue", "-q", "queues", multiple=True, metavar="NAME",
              help="A queue to work on (repeatable; default: the queues of the app's tasks).")
@click.option("--slots", "-s", type=click.IntRange(min=1), default=10, show_default=True,
              help="Jobs run at once, per queue.")
@click.option("--fair", is_flag=True, help="Fair claim order across limit_key groups.")
@click.option("--no-listen", "no_listen", is_flag=True,
              help="Poll only, no LISTEN/NOTIFY (PgBouncer in transaction pooling mode).")
@click.option("--poll-interval", type=click.FloatRange(min=0.001), default=1.0,
              show_default=True, help="Seconds between polls (jittered).")
@click.option("--lease", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds a heartbeat keeps this worker alive for the others.")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=10.0,
              show_default=True, help="Seconds running jobs get to finish on SIGINT/SIGTERM.")
@click.option("--worker-id", default=None, help="Name of this worker (default: host:pid:random).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@database_url_option
def command(
    app_reference: str, queues: tuple[str, ...], slots: int, fair: bool, no_listen: bool,
    poll_interval: float, lease: float, shutdown_timeout: float, worker_id: str | None,
    log_level: str, database_url: str | None,
) -> None:
    """Run a worker for the app MODULE:APP until SIGINT or SIGTERM.

    The first signal stops claiming and waits --shutdown-timeout seconds for running
    jobs, then gives the rest back; a second signal stops at once.
    """
    from ..worker import Worker

    app = load_app(app_reference)
    url = resolve(database_url) if database_url else None
    worker = Worker(
        app, queues=list(queues) or None, slots=slots, fair=fair, listen=not no_listen,
        poll_interval=poll_interval, lease=lease, shutdown_timeout=shutdown_timeout,
        worker_id=worker_id, database_url=url,
    )
    log_to_stderr(log_level.upper(), LOG_FORMAT)
    asyncio.run(worker.run(install_signal_handlers=True))
    stuck = [t for t in threading.enumerate() if t.name.startswith("akadze-task") and t.is_alive()]
    if stuck:
        # Plain task functions cannot be interrupted; their jobs were given back.
        logging.getLogger("akadze.worker").warning(
            "exiting with %d task thread%s still running (their jobs were given back)",
            len(stuck), "" if len(stuck) == 1 else "s")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
