"""A latency-injecting TCP proxy on 127.0.0.1, for benchmarks and fault scenarios.

This machine's kernel has no netem, so the network between akadze and PostgreSQL is
made here: :class:`Proxy` starts a relay in a process of its own (no shared GIL with
the bench, and its CPU is its own: :meth:`Proxy.cpu_seconds`), listening on a free
port of 127.0.0.1 and forwarding every connection to one target.

- Every chunk read from one side is written to the other ``delay`` seconds after it
  was read, in order, in each direction: the injected round trip is ``2 x delay``.
- :meth:`Proxy.pause` stops forwarding in both directions without closing anything
  (a partition: clients' writes still succeed, nothing arrives, connections made
  meanwhile are accepted and wait); :meth:`Proxy.resume` heals it and what was held
  is delivered, as TCP would after a short partition. :meth:`Proxy.cut` closes every
  connection at once (a reset).

The relay is an asyncio loop over ``select()``, whose timeout has microsecond
resolution (epoll's and poll's are milliseconds: a 0.1 ms delay would become 1 ms),
with the process's timer slack lowered to 1 ns on Linux. The control channel is the
child's stdin and stdout, one line per command and one reply per line; the relay ends
when its stdin closes, so it never outlives the process that started it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import selectors
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Proxy", "ProxyError", "proxied_url"]


class ProxyError(RuntimeError):
    """The relay process failed or answered a command with an error."""


# -- the relay (runs in the child process) -------------------------------------------


@dataclass
class _Relay:
    target_host: str
    target_port: int
    delay: float
    forwarding: asyncio.Event = field(default_factory=asyncio.Event)
    links: set[_Link] = field(default_factory=set)
    accepted: int = 0
    forwarded: int = 0  # bytes, both directions

    async def serve(self, host: str, port: int) -> asyncio.Server:
        self.forwarding.set()
        return await asyncio.start_server(self._accept, host, port)

    async def _accept(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(self, client_w)
        self.links.add(link)
        try:
            # Paused: the connection is accepted and waits, as a SYN would be retried.
            await self.forwarding.wait()
            try:
                server_r, server_w = await asyncio.open_connection(
                    self.target_host, self.target_port)
            except OSError:
                return
            link.writers.append(server_w)
            await asyncio.gather(self._pump(client_r, server_w, link),
                                 self._pump(server_r, client_w, link))
        finally:
            link.close()
            self.links.discard(link)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: _Link) -> None:
        """One direction: read as it comes, write each chunk ``delay`` after its read."""
        loop = asyncio.get_running_loop()
        held: deque[tuple[float, bytes]] = deque()
        arrived = asyncio.Event()
        done = False

        async def read() -> None:
            nonlocal done
            try:
                while data := await reader.read(65536):
                    held.append((loop.time() + self.delay, data))
                    arrived.set()
            except OSError:
                pass
            finally:
                done = True
                arrived.set()

        reading = asyncio.create_task(read())
        try:
            while True:
                if not held:
                    if done:
                        break
                    arrived.clear()
                    await arrived.wait()
                    continue
                due, data = held[0]
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.forwarding.wait()
                held.popleft()
                writer.write(data)
                self.forwarded += len(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            reading.cancel()
            link.close()

    def cut(self) -> int:
        links = list(self.links)
        for link in links:
            link.close()
        self.links.clear()
        return len(links)


class _Link:
    """The two sockets of one proxied connection."""

    def __init__(self, relay: _Relay, client_w: asyncio.StreamWriter) -> None:
        self.relay = relay
        self.writers: list[asyncio.StreamWriter] = [client_w]
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in self.writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()


def _lower_timer_slack() -> None:
    """1 ns timer slack (Linux): sleeps of 0.1 ms end within a few microseconds."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_timerslack = 29
        ctypes.CDLL(None).prctl(pr_set_timerslack, 1, 0, 0, 0)


async def _control(relay: _Relay, server: asyncio.Server) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    port = server.sockets[0].getsockname()[1]
    _reply(f"port {port}")
    while line := await reader.readline():
        words = line.decode().split()
        if not words:
            continue
        command, args = words[0], words[1:]
        if command == "pause":
            relay.forwarding.clear()
            _reply("ok")
        elif command == "resume":
            relay.forwarding.set()
            _reply("ok")
        elif command == "cut":
            _reply(f"ok {relay.cut()}")
        elif command == "delay" and len(args) == 1:
            try:
                seconds = float(args[0])
            except ValueError:
                seconds = -1.0
            if not 0 <= seconds <= 60:
                _reply(f"error delay must be 0 to 60 seconds, not {args[0]!r}")
                continue
            relay.delay = seconds
            _reply("ok")
        elif command == "stats":
            _reply(f"ok {relay.accepted} {len(relay.links)} {relay.forwarded}")
        else:
            _reply(f"error unknown command {command!r}")
    server.close()
    relay.cut()


def _reply(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def _relay_main(target_host: str, target_port: int, delay: float) -> None:
    relay = _Relay(target_host, target_port, delay)
    server = await relay.serve("127.0.0.1", 0)
    await _control(relay, server)
    # The parent is gone or done: end every connection's tasks before the loop closes.
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m akadze.bench.proxy")
    parser.add_argument("--target-host", default="127.0.0.1")
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds added in each direction (round trip: twice this)")
    args = parser.parse_args(argv)
    _lower_timer_slack()
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        loop.run_until_complete(_relay_main(args.target_host, args.target_port, args.delay))
    finally:
        loop.close()


# -- the handle (in the bench's process) ---------------------------------------------


class Proxy:
    """A relay process to ``target_host:target_port`` with ``delay`` seconds per
    direction; a context manager. ``port`` is where it listens on 127.0.0.1."""

    def __init__(self, target_host: str = "127.0.0.1", target_port: int = 5432,
                 delay: float = 0.0) -> None:
        if not 0 <= delay <= 60:
            raise ValueError(f"delay must be 0 to 60 seconds, not {delay!r}")
        self.target_host = target_host
        self.target_port = target_port
        self._delay = delay
        self._process: subprocess.Popen[str] | None = None
        self.port = 0

    @classmethod
    def for_url(cls, url: str, delay: float = 0.0) -> Proxy:
        """A proxy in front of the server of a ``postgresql://`` URL (host and port)."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432, delay)

    def start(self) -> Proxy:
        if self._process is not None:
            return self
        env = dict(os.environ)
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "akadze.bench.proxy", "--target-host", self.target_host,
             "--target-port", str(self.target_port), "--delay", repr(self._delay)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        first = self._read_line()
        if not first.startswith("port "):
            self.close()
            raise ProxyError(f"the proxy did not start: {first!r}")
        self.port = int(first.split()[1])
        return self

    def _read_line(self) -> str:
        assert self._process is not None and self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            code = self._process.poll()
            raise ProxyError(f"the proxy process ended (exit code {code})")
        return line.strip()

    def _command(self, line: str) -> str:
        process = self._process
        if process is None or process.stdin is None:
            raise ProxyError("the proxy is not running")
        try:
            process.stdin.write(line + "\n")
            process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ProxyError(f"the proxy process is gone: {exc}") from None
        reply = self._read_line()
        if not reply.startswith("ok"):
            raise ProxyError(reply.removeprefix("error "))
        return reply[2:].strip()

    @property
    def delay(self) -> float:
        return self._delay

    def set_delay(self, seconds: float) -> None:
        """Seconds added per direction from now on (chunks already held keep theirs)."""
        self._command(f"delay {seconds!r}")
        self._delay = seconds

    def pause(self) -> None:
        """Stop forwarding, both directions, keeping every connection open."""
        self._command("pause")

    def resume(self) -> None:
        """Forward again, delivering what was held meanwhile."""
        self._command("resume")

    def cut(self) -> int:
        """Close every proxied connection now; return how many there were."""
        return int(self._command("cut"))

    def stats(self) -> tuple[int, int, int]:
        """(connections accepted, open now, bytes forwarded)."""
        accepted, open_now, forwarded = self._command("stats").split()
        return int(accepted), int(open_now), int(forwarded)

    @property
    def pid(self) -> int:
        if self._process is None:
            raise ProxyError("the proxy is not running")
        return self._process.pid

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) the relay process has used so far."""
        return process_cpu_seconds(self.pid)

    def url(self, url: str) -> str:
        """``url`` (a ``postgresql://`` URL or a ``key=value`` conninfo) with its host
        and port replaced by this proxy's."""
        if not self.port:
            raise ProxyError("the proxy is not running")
        return proxied_url(url, self.port)

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(Exception):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def proxied_url(url: str, port: int, host: str = "127.0.0.1") -> str:
    """``url`` (a ``postgresql://`` URL or a ``key=value`` conninfo) pointed at
    ``host:port``, user, password, database and options kept."""
    if "://" not in url:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo  # not in the relay

        params = {k: v for k, v in conninfo_to_dict(url).items() if k != "hostaddr"}
        params.update(host=host, port=str(port))
        return make_conninfo("", **params)
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from ``/proc/PID/stat`` (0.0 where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat.rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


if __name__ == "__main__":
    main()
