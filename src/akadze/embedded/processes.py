"""A PostgreSQL server's processes seen from outside: its pid file, whether its
postmaster lives and is the server of a given data directory, a handle that signals
only that process, free ports, and the lock that serialises launchers."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import EmbeddedServerError
from ._trust import user_name

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


def _status_fields(pid: int) -> dict[str, list[str]]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {key: value.split() for key, _, value in (ln.partition(":") for ln in text.splitlines())}


def _runs_postgres_in(pid: int, directory: os.stat_result) -> str | None:
    """Why ``pid`` is not a ``postgres`` program running in ``directory``, or None."""
    exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    if os.path.basename(exe) != "postgres":
        return f"its program is {exe!r}, not postgres"
    cwd = os.stat(f"/proc/{pid}/cwd")
    if (cwd.st_dev, cwd.st_ino) != (directory.st_dev, directory.st_ino):
        return f"it runs in {os.readlink(f'/proc/{pid}/cwd')!r}, not in the data directory"
    return None


def server_problem(pid: int, uid: int, data_dir: Path) -> str | None:
    """Why the live process ``pid`` is not the postmaster of ``data_dir`` run by ``uid``,
    or None when it is.

    From /proc: all its uids (real, effective, saved, filesystem) are ``uid``, its
    program is a ``postgres``, it runs in the data directory (the postmaster changes
    to it), and its parent is not such a process (a backend's parent is the
    postmaster). Only the uid matters for safety: the server's user may signal its own
    processes anyway. Without /proc nothing can be read: a caller that is the server's
    user itself is let through (the system lets it signal only its own processes),
    root is not."""
    if not os.path.isdir("/proc/self"):
        return None if os.geteuid() == uid else "there is no /proc to check it with"
    try:
        fields = _status_fields(pid)
        uids = [int(x) for x in fields["Uid"]]
        others = [x for x in uids if x != uid]
        if others:
            return f"it runs as {user_name(others[0])}, not as {user_name(uid)}"
        directory = data_dir.stat()
        problem = _runs_postgres_in(pid, directory)
        if problem is not None:
            return problem
        parent = int(fields["PPid"][0])
        with contextlib.suppress(OSError):
            if parent > 1 and _runs_postgres_in(parent, directory) is None:
                return f"it is a child process of the server (pid {parent}), not its postmaster"
    except (OSError, KeyError, IndexError, ValueError) as exc:
        return f"it cannot be inspected ({getattr(exc, 'strerror', None) or exc})"
    return None


class Process:
    """A handle on one live process. On Linux it holds a pidfd: a signal sent through it
    reaches that process or none, never another that took its pid after it ended, and
    its end can be waited for without polling. Elsewhere it falls back to the pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._gone = False
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone = True
        except (AttributeError, OSError):  # no pidfd: an old kernel, macOS
            pass

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def alive(self) -> bool:
        if self._gone:
            return False
        if self._fd is None:
            return pid_alive(self.pid)
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return not poller.poll(0)  # readable once the process has ended

    def signal(self, signum: int) -> None:
        if self._gone:
            return
        with contextlib.suppress(ProcessLookupError):  # it has just ended
            if self._fd is None:
                os.kill(self.pid, signum)
            else:
                signal.pidfd_send_signal(self._fd, signum)

    def wait(self, timeout: float) -> bool:
        """Whether the process ended within ``timeout`` seconds."""
        if self._gone:
            return True
        if self._fd is not None:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            return bool(poller.poll(max(0, round(timeout * 1000))))
        deadline = time.monotonic() + timeout
        while pid_alive(self.pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


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
    def parse(cls, text: str | None) -> PidFile | None:
        """The pid file's fields, or None when ``text`` is not one. The pid must be a
        plain positive number that fits a pid_t: ``kill(0, ...)`` and ``kill(-1, ...)``
        signal whole groups."""
        lines = (text or "").splitlines()
        first = lines[0].strip() if lines else ""
        if not (first.isascii() and first.isdigit() and 1 <= int(first) < 2**31):
            return None
        port = int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None
        socket_dir = lines[4].strip() if len(lines) > 4 and lines[4].strip() else None
        status = lines[7].strip() if len(lines) > 7 else "starting"
        return cls(int(first), port, socket_dir, status)


def tail(text: str, lines: int = 3) -> str:
    """The last ``lines`` non-blank lines of a program's output or log, on one line, with
    control characters shown as ``?`` (the text is the server user's: no escape
    sequence of it reaches the terminal)."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    shown = " | ".join(kept[-lines:]) or "(no output)"
    return "".join(ch if ch.isprintable() else "?" for ch in shown.replace("\t", " "))
