"""The embedded PostgreSQL launcher: init, reuse, stop, crash recovery, users, ports, locks.

Every test gets its own home directory (``embedded_support.temporary_home``) and stops
every server it started.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from embedded_support import as_root, as_user, reachable_dir, temporary_home

from akadze import embedded
from akadze.database import resolve_url
from akadze.errors import ConfigurationError, EmbeddedServerError


@pytest.fixture
def home() -> Iterator[Path]:
    with temporary_home() as path:
        yield path


def _wait_dead(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while embedded.pid_alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.01)


def _proc_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def test_fresh_init_listens_on_socket_and_loopback_only(home: Path) -> None:
    server = embedded.EmbeddedServer(home)
    assert not server.status().initialised
    status = server.start()
    assert status.running and status.initialised and status.port
    assert (status.data_dir / "PG_VERSION").read_text().strip() == "16"
    assert stat.S_IMODE(status.data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "password").stat().st_mode) == 0o600

    with psycopg.connect(server.url(), autocommit=True) as conn:  # socket, no password
        assert conn.execute("SELECT current_database(), current_user").fetchone() == (
            "akadze", "postgres")
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SHOW server_version_num").fetchone()[0].startswith("16")
        assert conn.execute("SHOW fsync").fetchone() == ("off",)
        assert conn.execute("SHOW max_connections").fetchone() == ("100",)
        rules = conn.execute(
            "SELECT type, address, auth_method FROM pg_hba_file_rules ORDER BY line_number"
        ).fetchall()
    assert rules == [("local", None, "trust"), ("host", "127.0.0.1", "scram-sha-256")]

    tcp = server.url(tcp=True)
    assert tcp.startswith(f"postgresql://postgres:{server.password()}@127.0.0.1:{status.port}/")
    with psycopg.connect(tcp) as conn:
        assert conn.execute("SELECT inet_server_addr()::text").fetchone() == ("127.0.0.1/32",)
    wrong = f"postgresql://postgres:wrong@127.0.0.1:{status.port}/akadze"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong)
    assert not (home / "data.init").exists()


def test_reuse_returns_the_running_server(home: Path) -> None:
    first = embedded.EmbeddedServer(home).start()
    again = embedded.EmbeddedServer(home)
    assert again.start().pid == first.pid
    assert again.url() == embedded.EmbeddedServer(home).url()


def test_default_url_uses_the_env_directory(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(embedded.ENV_DIR, str(home))
    url = resolve_url(None, env={})
    assert f"host={home}/data" in url
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("akadze",)
    assert f"host={home}/data" in embedded.admin_url()


def test_stop_and_start_keep_the_data(home: Path) -> None:
    server = embedded.EmbeddedServer(home)
    pid = server.start().pid
    assert pid is not None
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")
    url = server.url()
    assert server.stop() is True
    assert not embedded.pid_alive(pid)
    assert not server.status().running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)
    assert server.stop() is False
    server.start()
    with psycopg.connect(server.url()) as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (42,)


def test_crash_recovery_after_kill_9(home: Path) -> None:
    server = embedded.EmbeddedServer(home)
    status = server.start()
    assert status.pid is not None
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept AS SELECT 7 AS x")
    os.kill(status.pid, signal.SIGKILL)
    _wait_dead(status.pid)
    assert (status.data_dir / "postmaster.pid").exists()  # the stale pid file is left
    assert not server.status().running
    recovered = embedded.EmbeddedServer(home).start()
    assert recovered.running and recovered.pid != status.pid
    with psycopg.connect(server.url()) as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (7,)


def test_stale_pid_file_naming_a_live_other_process(home: Path) -> None:
    server = embedded.EmbeddedServer(home)
    data = server.start().data_dir
    server.stop()
    # A pid file left by a crash, whose pid now belongs to another program (this one).
    stale = f"{os.getpid()}\n{data}\n0\n5432\n\n\n\nready\n"
    as_user(server.user, "sh", "-c", 'cat > "$1"', "sh", str(data / "postmaster.pid"),
            input=stale)
    assert not server.status().running
    status = server.start()
    assert status.running and status.pid != os.getpid()


@as_root
def test_as_root_the_server_runs_as_nobody(home: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    server = embedded.EmbeddedServer(home)
    status = server.start()
    assert status.user == "nobody" and status.pid is not None
    assert _proc_uid(status.pid) == nobody.pw_uid
    assert status.data_dir.stat().st_uid == nobody.pw_uid
    assert (home / "password").stat().st_uid == 0  # the secret stays the caller's


def _in_child_as(uid: int, gid: int, env: dict[str, str], action: Callable[[], str]) -> str:
    """Run ``action`` in a forked child that has dropped to ``uid`` (the venv's python
    may sit under /root, where nobody cannot exec it); return what it returned."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.environ.pop(embedded.ENV_DIR, None)
            os.environ.update(env)
            out = action()
            code = 0
        except BaseException as exc:
            out = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_end, out.encode() if code == 0 or out else b"?")
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        output = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, output
    return output


@as_root
def test_as_a_normal_user() -> None:
    """A process that is not root runs the server as itself (here: nobody)."""
    nobody = pwd.getpwnam("nobody")
    base = reachable_dir("akadze-user-")
    os.chown(base, nobody.pw_uid, nobody.pw_gid)
    env = {"HOME": str(base), "XDG_DATA_HOME": str(base / "xdg")}

    def start() -> str:
        return f"{embedded.default_url()} {embedded.server().status().pid}"

    def stop() -> str:
        return str(embedded.server().stop())

    try:
        url, pid = _in_child_as(nobody.pw_uid, nobody.pw_gid, env, start).split()
        assert f"host={base}/xdg/akadze/pg16/data" in url
        assert _proc_uid(int(pid)) == nobody.pw_uid
        assert (base / "xdg" / "akadze" / "pg16" / "password").stat().st_uid == nobody.pw_uid
        with psycopg.connect(url) as conn:  # root may use the socket too
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert _in_child_as(nobody.pw_uid, nobody.pw_gid, env, stop) == "True"
        assert not embedded.pid_alive(int(pid))
    finally:
        with contextlib.suppress(AssertionError):
            _in_child_as(nobody.pw_uid, nobody.pw_gid, env, stop)
        shutil.rmtree(base, ignore_errors=True)


@as_root
def test_private_home_puts_the_data_where_the_server_user_can_reach(home: Path) -> None:
    private = Path(tempfile.mkdtemp(prefix="akadze-private-", dir="/tmp"))  # mode 0700
    data_base = home.parent / "var-lib"
    try:
        server = embedded.EmbeddedServer(private / "home", data_base=data_base)
        assert server.server_dir.parent == data_base
        server.start()
        with psycopg.connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert (private / "home" / "password").is_file()
        assert server.data_dir.is_relative_to(data_base)
        server.stop()
    finally:
        embedded.EmbeddedServer(private / "home", data_base=data_base).stop()
        shutil.rmtree(private, ignore_errors=True)


@as_root
def test_private_binaries_are_copied_for_the_server_user(home: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    install = embedded.find_binaries().parent
    private = Path(tempfile.mkdtemp(prefix="akadze-wheel-", dir="/tmp"))  # like /root
    try:
        for part in ("bin", "lib", "share"):  # the wheel's layout, in a private place
            shutil.copytree(install / part, private / "pkg" / "pginstall" / part, symlinks=True)
        for libs in install.parent.parent.glob("*.libs"):
            shutil.copytree(libs, private / libs.name, symlinks=True)
        cache = home.parent / "cache"
        bin_dir = private / "pkg" / "pginstall" / "bin"
        assert not embedded.can_reach(bin_dir / "postgres", nobody.pw_uid, {nobody.pw_gid}, 5)
        copy = embedded.binaries.server_binaries
        copied = copy(bin_dir, nobody.pw_uid, {nobody.pw_gid}, cache_base=cache)
        assert copied.is_relative_to(cache)
        assert copy(bin_dir, nobody.pw_uid, {nobody.pw_gid}, cache_base=cache) == copied
        server = embedded.EmbeddedServer(home, binaries=copied)
        server.start()
        with psycopg.connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_reachability_from_modes() -> None:
    def st(mode: int, uid: int = 0, gid: int = 0) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))

    assert embedded.binaries.mode_allows(st(0o755), 65534, {65534}, 0o5)
    assert not embedded.binaries.mode_allows(st(0o700), 65534, {65534}, 0o1)
    assert embedded.binaries.mode_allows(st(0o700, uid=65534), 65534, {65534}, 0o7)
    assert embedded.binaries.mode_allows(st(0o750, gid=65534), 65534, {65534}, 0o5)
    assert not embedded.binaries.mode_allows(st(0o750, gid=65534), 65534, {65534}, 0o2)
    assert embedded.binaries.mode_allows(st(0o000), 0, {0}, 0o7)


def test_a_taken_port_is_skipped(home: Path) -> None:
    server = embedded.EmbeddedServer(home)
    first = server.start().port
    assert first is not None
    server.stop()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        port = server.start().port
        assert port != first
        with psycopg.connect(server.url(tcp=True)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_port_taken_between_check_and_bind_is_retried(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        choices = iter([busy, embedded.free_port()])
        monkeypatch.setattr(embedded.EmbeddedServer, "_choose_port", lambda self: next(choices))
        status = embedded.EmbeddedServer(home).start()
    assert status.running and status.port != busy
    assert "could not bind" in status.log_file.read_text()


def test_a_data_directory_of_another_major_version_is_refused(home: Path) -> None:
    server = embedded.EmbeddedServer(home)
    server.data_dir.mkdir(parents=True)
    (server.data_dir / "PG_VERSION").write_text("15\n")
    with pytest.raises(EmbeddedServerError) as err:
        server.start()
    message = str(err.value)
    assert "created by PostgreSQL 15" in message and "PostgreSQL 16" in message
    assert str(server.data_dir) in message
    assert (server.data_dir / "PG_VERSION").read_text() == "15\n"  # untouched


def test_two_processes_starting_at_once(home: Path) -> None:
    go = home.parent / "go"
    script = (
        "import os, time; from akadze import embedded\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
        "print(embedded.default_url())\n"
    )
    env = {**os.environ, embedded.ENV_DIR: str(home)}
    children = [
        subprocess.Popen([sys.executable, "-c", script], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    go.touch()
    outputs = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0, 0, 0], outputs
    urls = {out.strip() for out, _ in outputs}
    assert len(urls) == 1
    status = embedded.EmbeddedServer(home).status()
    assert status.running
    log = status.log_file.read_text()
    assert log.count("database system is ready to accept connections") == 1


def test_without_the_extra_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.binaries, "WHEEL", "akadze_no_such_wheel")
    with pytest.raises(ConfigurationError) as err:
        embedded.default_url()
    assert "--database-url" in str(err.value) and "akadze[embedded]" in str(err.value)
    with pytest.raises(ConfigurationError, match=r"akadze\[embedded\]"):
        resolve_url(None, env={})


def test_a_socket_path_too_long_is_refused() -> None:
    with pytest.raises(EmbeddedServerError, match="too long"):
        embedded.EmbeddedServer(Path("/tmp") / ("x" * 120))
