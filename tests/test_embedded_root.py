"""The embedded server under root: what its user (``nobody``) plants in the data directory
it owns never makes root write, chown, read out or signal anything else.

Each attack is played by a helper subprocess running as the server's user, then the
operator's command runs as root (the test process). Without root the server runs as the
caller, so there is no other user to defend against: those tests are skipped.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from embedded_support import as_root, as_user, reachable_dir, run_cli, temporary_home

from akadze import embedded
from akadze.errors import EmbeddedServerError


@pytest.fixture
def home() -> Iterator[Path]:
    with temporary_home("akadze-root-") as path:
        yield path


def _root_secret(base: Path, text: str = "root's own file\n") -> Path:
    secret = base / "secret"
    secret.write_text(text)
    secret.chmod(0o600)
    return secret


@as_root
def test_symlinked_config_files_are_replaced_not_followed(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--dir", str(home)]
    secret = _root_secret(home.parent)
    assert run_cli(capsys, "db", "start", *d)[0] == 0
    data = embedded.EmbeddedServer(home).data_dir
    for name in ("akadze.conf", "pg_hba.conf"):
        as_user("nobody", "ln", "-sfn", str(secret), str(data / name))

    assert run_cli(capsys, "db", "stop", *d)[:2] == (0, "stopped\n")
    code, _, err = run_cli(capsys, "db", "start", *d)
    assert code == 0, err

    st = secret.stat()
    assert secret.read_text() == "root's own file\n"
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    nobody = pwd.getpwnam("nobody").pw_uid
    for name in ("akadze.conf", "pg_hba.conf"):
        own = (data / name).lstat()
        assert stat.S_ISREG(own.st_mode), f"{name} is still a link"
        assert (own.st_uid, stat.S_IMODE(own.st_mode)) == (nobody, 0o600)
    status = embedded.EmbeddedServer(home).status()
    with psycopg.connect(embedded.EmbeddedServer(home).url()) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SHOW port").fetchone() == (str(status.port),)
        rules = conn.execute(
            "SELECT type, address, auth_method FROM pg_hba_file_rules ORDER BY line_number"
        ).fetchall()
    assert rules == [("local", None, "trust"), ("host", "127.0.0.1", "scram-sha-256")]


# A root process with "postgres" in its argv0 that reports the first signal it gets.
# Every signal is blocked and taken with sigwaitinfo, which hands out the lowest pending
# number first: so after `db stop` the test sends SIGRTMAX (the highest), and the decoy
# reports SIGRTMAX only when nothing reached it before.
DECOY = """\
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
print("ready", flush=True)
print(signal.sigwaitinfo(signal.valid_signals()).si_signo, flush=True)
"""


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        ["postgres-decoy", "-c", DECOY], executable=sys.executable, text=True,
        stdout=subprocess.PIPE, start_new_session=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        yield process
    finally:
        process.kill()
        process.communicate()


def _signals_received(process: subprocess.Popen[str]) -> list[int]:
    """The signals ``process`` got before this call (it must still run): see DECOY."""
    assert process.poll() is None, "the decoy is gone: it got a signal"
    process.send_signal(signal.SIGRTMAX)
    out, _ = process.communicate(timeout=10)
    first = int(out.strip())
    return [] if first == signal.SIGRTMAX else [first]


def _plant_pid(data: Path, pid: int, real: str) -> None:
    """As the server's user: the real pid file with another pid on its first line."""
    lines = real.splitlines()
    forged = "\n".join([str(pid), *lines[1:]]) + "\n"
    user = embedded.EmbeddedServer(data.parent).user
    as_user(user, "sh", "-c", 'cat > "$1"', "sh", str(data / "postmaster.pid"), input=forged)


@as_root
def test_a_pid_file_naming_a_root_decoy_is_not_signalled(
    home: Path, capsys: pytest.CaptureFixture[str], decoy: subprocess.Popen[str]
) -> None:
    d = ["--dir", str(home)]
    assert run_cli(capsys, "db", "start", *d)[0] == 0
    server = embedded.EmbeddedServer(home)
    real = (server.data_dir / "postmaster.pid").read_text()
    _plant_pid(server.data_dir, decoy.pid, real)

    code, out, err = run_cli(capsys, "db", "stop", *d)
    assert code == 1 and out == ""
    assert f"pid {decoy.pid}" in err and "runs as root (uid 0)" in err
    assert "nothing was signalled" in err and len(err.splitlines()) == 1
    assert _signals_received(decoy) == []

    # The real server was left alone: with its own pid file back, it stops.
    assert (server.data_dir / "postmaster.pid").read_text() != real
    server_pid = int(real.split()[0])
    _plant_pid(server.data_dir, server_pid, real)
    assert run_cli(capsys, "db", "stop", *d)[:2] == (0, "stopped\n")
    assert not embedded.pid_alive(server_pid)


def test_a_pid_file_naming_a_backend_is_not_signalled(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process of the server's user in the data directory, but not its postmaster."""
    d = ["--dir", str(home)]
    assert run_cli(capsys, "db", "start", *d)[0] == 0
    server = embedded.EmbeddedServer(home)
    real = (server.data_dir / "postmaster.pid").read_text()
    with psycopg.connect(server.url(), autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert backend is not None
        _plant_pid(server.data_dir, backend[0], real)
        code, _, err = run_cli(capsys, "db", "stop", *d)
        assert code == 1 and f"pid {backend[0]}" in err and "child process" in err
        assert conn.execute("SELECT 1").fetchone() == (1,)  # neither cancelled nor gone
    _plant_pid(server.data_dir, int(real.split()[0]), real)
    assert run_cli(capsys, "db", "stop", *d)[:2] == (0, "stopped\n")


@as_root
def test_a_symlinked_version_file_is_refused_without_reading_its_target(home: Path) -> None:
    secret = _root_secret(home.parent, "TOPSECRET\n")
    server = embedded.EmbeddedServer(home)
    server.start()
    server.stop()
    as_user("nobody", "ln", "-sfn", str(secret), str(server.data_dir / "PG_VERSION"))
    with pytest.raises(EmbeddedServerError) as err:
        server.start()
    assert "TOPSECRET" not in str(err.value)
    assert "PG_VERSION" in str(err.value) and "symbolic link" in str(err.value)


@as_root
def test_a_home_another_user_can_change_is_refused() -> None:
    nobody = pwd.getpwnam("nobody")
    base = reachable_dir("akadze-theirs-")
    try:
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        with pytest.raises(EmbeddedServerError) as err:
            embedded.EmbeddedServer(base / "home").start()
        assert str(base) in str(err.value) and "nobody" in str(err.value)
        assert not (base / "home").exists()  # refused before anything was written
        os.chown(base, 0, 0)
        base.chmod(0o777)
        with pytest.raises(EmbeddedServerError, match="writable by every user"):
            embedded.EmbeddedServer(base / "home")
    finally:
        shutil.rmtree(base, ignore_errors=True)
