"""A private PgBouncer in transaction pooling mode, for the tests and the benches.

:class:`PgBouncer` writes a configuration into a temporary directory and runs
Debian's ``pgbouncer`` (``PATH`` or ``/usr/sbin``) in the foreground on a free port of
127.0.0.1, in front of one PostgreSQL server: ``pool_mode = transaction``, the stock
``ignore_startup_parameters = extra_float_digits`` (so that nothing akadze does may
rely on more), ``auth_type = trust`` towards its clients (it listens on 127.0.0.1
only, for a harness), and the user and password of the given URL towards the server.
It never touches the system's PgBouncer service. PgBouncer refuses to run as root;
as root it is started with ``-u nobody``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from psycopg.conninfo import conninfo_to_dict

from .proxy import proxied_url

__all__ = ["PgBouncer", "PgBouncerMissing", "find_pgbouncer"]


class PgBouncerMissing(RuntimeError):
    """No ``pgbouncer`` binary on this machine."""


def find_pgbouncer() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quote(value: str) -> str:
    """A value in a libpq connection string of pgbouncer.ini."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class PgBouncer:
    """PgBouncer in ``pool_mode`` in front of the server of ``server_url``; a context
    manager. ``url(database_url)`` points a URL of that server at it."""

    def __init__(self, server_url: str, *, pool_mode: str = "transaction",
                 pool_size: int = 20, max_client_conn: int = 1000) -> None:
        if pool_mode not in ("session", "transaction", "statement"):
            raise ValueError(f"unknown pool_mode {pool_mode!r}")
        self._binary = find_pgbouncer()
        if self._binary is None:
            raise PgBouncerMissing("pgbouncer is not installed (apt-get install pgbouncer)")
        # A URL or a conninfo; the host may be a unix socket's directory (?host=/...).
        params = conninfo_to_dict(server_url)
        self._host = str(params.get("host") or "127.0.0.1")
        self._port = int(params.get("port") or 5432)
        self._user = str(params.get("user") or "postgres")
        password = params.get("password")
        self._password = str(password) if password else None
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.port = 0
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def _config(self, directory: Path) -> Path:
        server = f"host={self._host} port={self._port} user={self._user}"
        if self._password is not None:
            server += f" password={_quote(self._password)}"
        users = directory / "users.txt"
        users.write_text(f'"{self._user}" ""\n', encoding="utf-8")
        ini = directory / "pgbouncer.ini"
        ini.write_text("\n".join([
            "[databases]",
            f"* = {server}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {users}",
            f"pool_mode = {self.pool_mode}",
            f"max_client_conn = {self.max_client_conn}",
            f"default_pool_size = {self.pool_size}",
            "ignore_startup_parameters = extra_float_digits",
            f"logfile = {directory / 'pgbouncer.log'}",
            "",
        ]), encoding="utf-8")
        for path in (users, ini):
            path.chmod(0o644)
        return ini

    def start(self) -> PgBouncer:
        if self._process is not None:
            return self
        assert self._binary is not None
        self._dir = Path(tempfile.mkdtemp(prefix="akadze-pgbouncer-"))
        self._dir.chmod(0o777)  # nobody writes its log here
        command = [self._binary]
        if os.geteuid() == 0:
            command += ["-u", "nobody"]
        for _ in range(5):  # a free port can be taken by someone else meanwhile
            self.port = _free_port()
            ini = self._config(self._dir)
            self._process = subprocess.Popen([*command, str(ini)], stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)
            if self._wait_listening(10.0):
                return self
            self._stop_process()
        log = self.log()
        self.close()
        raise RuntimeError(f"pgbouncer did not start: {log.strip().splitlines()[-1:] or '?'}")

    def _wait_listening(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.5):
                return True
            time.sleep(0.02)  # polling the port with a deadline
        return False

    def log(self) -> str:
        """PgBouncer's log so far."""
        if self._dir is None:
            return ""
        try:
            return (self._dir / "pgbouncer.log").read_text(errors="replace")
        except OSError:
            return ""

    def url(self, database_url: str) -> str:
        """``database_url`` (a URL of the same server) through this PgBouncer."""
        if not self.port:
            raise RuntimeError("pgbouncer is not running")
        return proxied_url(database_url, self.port)

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("pgbouncer is not running")
        return self._process.pid

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def close(self) -> None:
        self._stop_process()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.port = 0

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
