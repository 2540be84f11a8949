"""A private PostgreSQL 16 server for the fault scenarios (akadze's embedded launcher).

Restart scenarios must never touch a server that others use: this one lives in a
fresh home under /tmp (mode 0755, so that ``nobody`` can reach it when we run as
root), is restarted with its own ``pg_ctl`` (``-m fast`` or ``-m immediate``), and
is stopped and removed at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..embedded import EmbeddedServer
from ..embedded.binaries import find_binaries, server_binaries
from ..errors import EmbeddedServerError


class PrivateServer:
    """An embedded server in a home of its own (see :func:`private_server`)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.server = EmbeddedServer(home)
        self.server.start()
        self.restarts: list[tuple[str, float]] = []  # (mode, seconds down)

    def admin_url(self) -> str:
        return self.server.url("postgres")

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        srv = self.server
        bin_dir = find_binaries()
        extra: dict[str, object] = {}
        if srv.uid != os.geteuid():
            bin_dir = server_binaries(bin_dir, srv.uid, {srv.gid})
            extra = {"user": srv.uid, "group": srv.gid, "extra_groups": []}
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            [str(bin_dir / "pg_ctl"), *args, "-D", str(srv.data_dir)],
            env={"PATH": os.defpath, "LC_ALL": "C", "LANG": "C"}, cwd="/", text=True,
            stdin=subprocess.DEVNULL, capture_output=True, check=False, **extra,
        )

    def restart(self, mode: str, down: float = 1.0) -> float:
        """Stop with ``pg_ctl stop -m mode``, stay down ``down`` seconds (the outage
        the workers see), start again; return the seconds without a server."""
        if mode not in ("fast", "immediate", "smart"):
            raise ValueError(f"unknown shutdown mode {mode!r}")
        began = time.monotonic()
        result = self._pg_ctl("stop", "-m", mode, "-w", "-t", "60")
        if result.returncode != 0:
            raise EmbeddedServerError(f"pg_ctl stop -m {mode} failed: {result.stderr.strip()}")
        time.sleep(down)  # the outage itself (fault injection, not synchronisation)
        self.server.start()
        seconds = time.monotonic() - began
        self.restarts.append((mode, seconds))
        return seconds

    def stop(self) -> None:
        self.server.stop()


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    base = Path(tempfile.mkdtemp(prefix="akadze-faults-", dir="/tmp"))
    base.chmod(0o755)
    server: PrivateServer | None = None
    try:
        server = PrivateServer(base / "home")
        yield server
    finally:
        if server is not None:
            server.stop()
        else:
            EmbeddedServer(base / "home").stop()
        data = EmbeddedServer(base / "home").server_dir
        shutil.rmtree(base, ignore_errors=True)
        if data != base / "home":
            shutil.rmtree(data, ignore_errors=True)
