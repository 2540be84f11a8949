"""``akadze metrics [--serve]``: Prometheus text, printed once or served over HTTP.

The server is one asyncio loop in one thread, whatever the number of connections:

- a connection has ``header_timeout`` seconds to send its request head (at most
  ``HEAD_MAX`` bytes) and ``write_timeout`` seconds to take the answer, then it is
  closed: a half-sent request holds a socket for a while, never a thread;
- at most ``max_connections`` are open at once; when one more arrives, the oldest
  that is still sending its request is closed for it (a scrape sends its request at
  once, so idle connections cannot keep scrapes out);
- every scrape gets the text of one :class:`akadze.metrics.CachedExposition`: one
  database connection, read at most once a second;
- a failure to read the database is answered 503 with a fixed line; what went wrong
  is logged (masked), never sent to whoever asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict

import click

from ..clock import SYSTEM_CLOCK, Clock
from ..database import describe
from ..errors import AkadzeError
from ..metrics import CONTENT_TYPE, DEFAULT_MAX_AGE, DEFAULT_WINDOW, CachedExposition, render_sync
from ._render import log_to_stderr
from .dashboard import listen
from .options import database_url_option, resolve
from .worker import LOG_FORMAT

logger = logging.getLogger("akadze.metrics")

HEAD_MAX = 8 * 1024
MAX_CONNECTIONS = 64
HEADER_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0
SCRAPE_TIMEOUT = 15.0  # a scrape waiting for a read of the database (connect + statements)
UNAVAILABLE = "akadze: the metrics could not be read from the database (see the server's log)\n"
TEXT = "text/plain; charset=utf-8"


class MetricsServer:
    """GET /metrics (and /) with the exposition text; one request per connection.

    Bound at construction (``server_address``); :meth:`serve_forever` runs the loop in
    the calling thread until :meth:`shutdown` (from any thread).
    """

    def __init__(self, url: str, host: str, port: int, window: int = DEFAULT_WINDOW, *,
                 max_connections: int = MAX_CONNECTIONS, header_timeout: float = HEADER_TIMEOUT,
                 write_timeout: float = WRITE_TIMEOUT, max_age: float = DEFAULT_MAX_AGE,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.socket = listen(host, port)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self.exposition = CachedExposition(url, window=window, max_age=max_age, clock=clock)
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.write_timeout = write_timeout
        self.served = 0  # answers given (any status)
        self._writers: set[asyncio.StreamWriter] = set()
        self._reading: OrderedDict[asyncio.StreamWriter, None] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopped = threading.Event()

    @property
    def open_connections(self) -> int:
        """Connections open right now (admitted, not closed yet)."""
        return len(self._writers)

    def serve_forever(self) -> None:
        asyncio.run(self.serve())

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            server = await asyncio.start_server(self._connection, sock=self.socket,
                                                limit=HEAD_MAX)
            async with server:
                await self._stop.wait()
                for writer in list(self._writers):  # wait_closed waits for them
                    writer.transport.abort()
        finally:
            await self.exposition.close()
            self._stopped.set()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop :meth:`serve_forever` and wait for it to return."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not self._stopped.is_set():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(stop.set)
            self._stopped.wait(timeout)

    def server_close(self) -> None:
        self.socket.close()

    # -- one connection -------------------------------------------------------------

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        if len(self._writers) >= self.max_connections:
            if not self._reading:
                return False  # every slot is sending an answer: this one is refused
            oldest, _ = self._reading.popitem(last=False)
            oldest.transport.abort()  # its handler ends (and frees the slot) on its own
            self._writers.discard(oldest)
        self._writers.add(writer)
        self._reading[writer] = None
        return True

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.transport.abort()
            return
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                              self.header_timeout)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ConnectionError):
                return  # too slow, too long, or gone: closed without an answer
            self._reading.pop(writer, None)
            status, body, content_type, method = await self._answer(head)
            data = body.encode("utf-8")
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode("ascii")
                + (b"" if method == "HEAD" else data)
            )
            await asyncio.wait_for(writer.drain(), self.write_timeout)
            self.served += 1
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._reading.pop(writer, None)
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, head: bytes) -> tuple[str, str, str, str]:
        """(status, body, content type, method) for a request head."""
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        method = parts[0].decode("ascii", "replace")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return "400 Bad Request", "bad request\n", TEXT, method
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "GET /metrics\n", TEXT, method
        if parts[1].split(b"?", 1)[0] not in (b"/", b"/metrics"):
            return "404 Not Found", "not found: try /metrics\n", TEXT, method
        reads = self.exposition.reads
        try:
            text = await asyncio.wait_for(self.exposition.text(), SCRAPE_TIMEOUT)
        except (AkadzeError, TimeoutError) as exc:
            if self.exposition.reads != reads or isinstance(exc, TimeoutError):
                # once per read that failed, not per scrape answered from the cache
                reason = str(exc) if isinstance(exc, AkadzeError) else "no answer in time"
                logger.error("metrics scrape failed: %s", reason)  # masked already
            return "503 Service Unavailable", UNAVAILABLE, TEXT, method
        return "200 OK", text, CONTENT_TYPE, method


def make_server(url: str, host: str, port: int, window: int = DEFAULT_WINDOW) -> MetricsServer:
    """A :class:`MetricsServer` with the default limits."""
    return MetricsServer(url, host, port, window)


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
    log_to_stderr(logging.INFO, LOG_FORMAT)
    server = MetricsServer(url, host, port, window)  # a taken port: one line, exit 2
    bound_host, bound_port = server.server_address
    click.echo(f"serving metrics of {describe(url)} on http://{bound_host!s}:{bound_port}/metrics",
               err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
