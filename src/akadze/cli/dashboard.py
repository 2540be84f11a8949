"""``akadze dashboard [MODULE:APP]``: serve the web dashboard with uvicorn."""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import click

from ..database import describe
from ..errors import ConfigurationError
from ._render import log_to_stderr
from .options import database_url_option, resolve
from .worker import LOG_FORMAT, load_app

if TYPE_CHECKING:
    from ..dashboard import Credentials

logger = logging.getLogger("akadze.dashboard")


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, bound here so that a taken port is one clear line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise click.UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise click.UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def exposure_warning(host: str, credentials: Credentials | None, allow_actions: bool) -> str | None:
    """What to warn about when the dashboard listens beyond this machine without auth."""
    from ..dashboard import is_loopback

    if is_loopback(host) or credentials is not None:
        return None
    return (f"the dashboard listens on {host} without authentication: anyone who reaches "
            f"it sees the queues and jobs{' and can act on them' if allow_actions else ''}; "
            "set AKADZE_DASHBOARD_USER and AKADZE_DASHBOARD_PASSWORD")


@click.command("dashboard")
@click.argument("app_reference", metavar="[MODULE:APP]", required=False)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (another than loopback exposes it: set "
                   "AKADZE_DASHBOARD_USER and AKADZE_DASHBOARD_PASSWORD).")
@click.option("--port", type=click.IntRange(0, 65535), default=8484, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--allow-actions", is_flag=True,
              help="Allow requeue, retry, cancel, bulk requeue, pause and resume.")
@click.option("--refresh", type=click.FloatRange(0.5, 3600), default=5.0, show_default=True,
              help="Seconds between the pages' refreshes.")
@database_url_option
def command(app_reference: str | None, host: str, port: int, allow_actions: bool,
            refresh: float, database_url: str | None) -> None:
    """The web dashboard: queues, limits, fair shares, jobs and schedules, live.

    With MODULE:APP the schedules appear with their next fire, and actions run the
    app's transition hooks.
    """
    try:
        import uvicorn

        from .. import dashboard
    except ImportError as exc:
        raise ConfigurationError(
            f"the dashboard needs the dashboard extra (pip install 'akadze[dashboard]'): {exc}"
        ) from None
    app = load_app(app_reference) if app_reference else None
    url = resolve(database_url) if database_url or app is None else app.database_url
    credentials = dashboard.credentials_from_env()
    log_to_stderr(logging.INFO, LOG_FORMAT)
    local = dashboard.is_loopback(host)
    warning = exposure_warning(host, credentials, allow_actions)
    if warning:
        logger.warning(warning)
    asgi = dashboard.create_app(
        url, allow_actions, app=app, basic_auth=credentials, refresh_seconds=refresh,
        # A local dashboard answers for local names only: a page of another site that
        # rebinds its name to 127.0.0.1 gets no answer (DNS rebinding).
        allowed_hosts=["127.0.0.1", "localhost", "::1", "[::1]"] if local else None,
    )
    sock = listen(host, port)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
    click.echo(
        f"akadze dashboard of {describe(url)} on http://{shown}:{bound[1]}/ "
        f"({'actions on' if allow_actions else 'read-only'}"
        f"{', basic auth' if credentials else ''})", err=True)
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="on"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
