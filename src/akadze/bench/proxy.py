"""A TCP proxy for the bench: added latency, and a partition that closes nothing.

``Proxy(host, port).start()`` listens on a free port of 127.0.0.1 (returned) and
forwards every connection to ``host:port``, in a thread of its own (an asyncio loop),
so that synchronous harness code can drive it:

- :meth:`Proxy.set_delay`: each chunk waits this long before it is passed on, in both
  directions (a slow network);
- :meth:`Proxy.pause`: nothing is passed on any more, in either direction, and new
  connections are accepted but not connected: the peers see a network that stopped
  answering (no FIN, no RST), the hardest case for leases; their sends fill the
  buffers and then block;
- :meth:`Proxy.resume`: everything held is passed on, in order, as if the network
  came back.

Only for benchmarks and fault scenarios: it listens on loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from typing import Any

CHUNK = 65536


class Proxy:
    """Forwards 127.0.0.1:<port> to ``host:port`` (see the module's docstring)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.target_port = port
        self.port = 0
        self._delay = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        #: Connections accepted so far.
        self.connections = 0

    # -- control (any thread) --------------------------------------------------------

    def start(self) -> int:
        """Listen and forward in a background thread; the port listened on."""
        ready: Future[int] = Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True,
                                        name=f"proxy->{self.host}:{self.target_port}")
        self._thread.start()
        self.port = ready.result(timeout=10)
        return self.port

    def set_delay(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before passing it on (0: no delay)."""
        if seconds < 0:
            raise ValueError(f"a delay cannot be negative: {seconds}")
        self._delay = seconds

    @property
    def paused(self) -> bool:
        return self._flowing is not None and not self._flowing.is_set()

    def pause(self) -> None:
        """Stop passing anything on, closing nothing."""
        self._call(lambda flowing: flowing.clear())

    def resume(self) -> None:
        """Pass on again what was held, and what comes."""
        self._call(lambda flowing: flowing.set())

    def stop(self) -> None:
        """Close every connection and stop listening."""
        loop = self._loop
        if loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> Proxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, change: Any) -> None:
        loop, flowing = self._loop, self._flowing
        if loop is None or flowing is None:
            raise RuntimeError("the proxy is not running")
        done: Future[None] = Future()

        def apply() -> None:
            change(flowing)
            done.set_result(None)

        loop.call_soon_threadsafe(apply)
        done.result(timeout=10)

    # -- the loop (its own thread) -----------------------------------------------------

    def _run(self, ready: Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._listen(ready))
            loop.run_forever()
        finally:
            loop.close()

    async def _listen(self, ready: Future[int]) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        try:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        except OSError as exc:
            ready.set_exception(exc)
            return
        ready.set_result(int(self._server.sockets[0].getsockname()[1]))

    async def _accept(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self.connections += 1
        self._writers.add(client_w)
        server_w: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()  # paused: accepted, not connected
            try:
                server_r, server_w = await asyncio.open_connection(self.host, self.target_port)
            except OSError:
                return
            self._writers.add(server_w)
            await asyncio.gather(self._pipe(client_r, server_w),
                                 self._pipe(server_r, client_w), return_exceptions=True)
        finally:
            self._discard(client_w)
            if server_w is not None:
                self._discard(server_w)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                if self._delay:
                    await asyncio.sleep(self._delay)
                await self._flowing.wait()  # paused while it was read: held until resumed
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._discard(writer)

    def _discard(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        with contextlib.suppress(Exception):
            writer.close()

    async def _close(self) -> None:
        if self._flowing is not None:
            self._flowing.set()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            self._discard(writer)
