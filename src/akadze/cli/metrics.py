"""``akadze metrics [--serve]``: Prometheus text, printed once or served over HTTP."""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import click

from ..database import describe, mask_password
from ..metrics import CONTENT_TYPE, DEFAULT_WINDOW, render_sync
from .options import database_url_option, resolve

logger = logging.getLogger("akadze.metrics")


def make_server(url: str, host: str, port: int, window: int) -> ThreadingHTTPServer:
    """An HTTP server answering GET /metrics (and /) with the exposition text; each
    scrape reads the database afresh."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                self._reply(404, "not found: try /metrics\n", "text/plain; charset=utf-8")
                return
            try:
                body = render_sync(url, window=window)
            except Exception as exc:  # any failure: one line, logged, a 503
                message = mask_password(" ".join(str(exc).split()))
                logger.error("metrics scrape failed: %s", message)
                self._reply(503, f"akadze: {message}\n", "text/plain; charset=utf-8")
                return
            self._reply(200, body, CONTENT_TYPE)

        def _reply(self, status: int, body: str, content_type: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug(format, *args)

    return ThreadingHTTPServer((host, port), Handler)


@click.command("metrics")
@click.option("--serve", is_flag=True, help="Serve /metrics over HTTP instead of printing.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on with --serve (0.0.0.0 exposes it to the network).")
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True,
              help="Port to listen on with --serve.")
@click.option("--window", type=click.IntRange(1, 86400), default=DEFAULT_WINDOW,
              show_default=True, help="Seconds of the 'finished recently' throughput gauge.")
@database_url_option
def command(serve: bool, host: str, port: int, window: int, database_url: str | None) -> None:
    """Cluster metrics in the Prometheus text format."""
    url = resolve(database_url)
    if not serve:
        click.echo(render_sync(url, window=window), nl=False)
        return
    try:
        server = make_server(url, host, port, window)
    except OSError as exc:
        raise click.UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_host, bound_port = server.server_address[:2]
    click.echo(f"serving metrics of {describe(url)} on http://{bound_host!s}:{bound_port}/metrics",
               err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
