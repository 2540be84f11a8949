"""Processes and files of a PostgreSQL server seen from outside: its pid file, whether
its postmaster lives, free ports, and the lock that serialises launchers."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import EmbeddedServerError

LOCK_TIMEOUT = 120.0


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is dead: when the postmaster was
    killed its parent may be an init that never reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def is_postgres(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return True  # cannot tell (no /proc): trust the pid file
    return b"postgres" in argv0


def port_free(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:``port`` (with SO_REUSEADDR, as
    PostgreSQL does, so that connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def locked(path: Path, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EmbeddedServerError(
                        f"another process holds {path} for more than {timeout:.0f} s"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@dataclasses.dataclass(frozen=True)
class PidFile:
    """The first lines of PGDATA/postmaster.pid."""

    pid: int
    port: int | None
    socket_dir: str | None
    status: str

    @classmethod
    def read(cls, data_dir: Path) -> PidFile | None:
        try:
            lines = (data_dir / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None
        port = int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None
        socket_dir = lines[4].strip() if len(lines) > 4 and lines[4].strip() else None
        status = lines[7].strip() if len(lines) > 7 else "starting"
        return cls(pid, port, socket_dir, status)


def read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return ""
        raise


def tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) or "(no output)"
