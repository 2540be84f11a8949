"""The pieces the embedded launcher defends itself with, without a server: files of the
server's directory touched by descriptor, root-only paths, pid files, process handles."""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from embedded_support import as_root, reachable_dir, temporary_home

from akadze import embedded
from akadze.embedded._trust import ServerDirectory, others_can_change
from akadze.embedded.processes import PidFile, Process, tail
from akadze.errors import EmbeddedServerError


@pytest.fixture
def base() -> Iterator[Path]:
    with temporary_home("akadze-trust-") as home:
        yield home.parent


def _mine(path: Path) -> ServerDirectory:
    return ServerDirectory(path, os.geteuid(), os.getegid())


def test_write_replaces_a_link_instead_of_following_it(base: Path) -> None:
    target = base / "target"
    target.write_text("kept\n")
    (base / "akadze.conf").symlink_to(target)
    _mine(base).write("akadze.conf", "port = 1\n")
    assert target.read_text() == "kept\n"
    written = (base / "akadze.conf").lstat()
    assert stat.S_ISREG(written.st_mode) and stat.S_IMODE(written.st_mode) == 0o600
    assert (base / "akadze.conf").read_text() == "port = 1\n"
    assert sorted(p.name for p in base.iterdir()) == ["akadze.conf", "target"]  # no leftovers


def test_write_over_a_directory_is_refused_cleanly(base: Path) -> None:
    (base / "pg_hba.conf").mkdir()
    with pytest.raises(EmbeddedServerError, match=r"cannot write .*pg_hba\.conf"):
        _mine(base).write("pg_hba.conf", "x")
    assert sorted(p.name for p in base.iterdir()) == ["pg_hba.conf"]


def test_read_refuses_links_and_fifos_without_blocking(base: Path) -> None:
    (base / "secret").write_text("s3cret\n")
    (base / "PG_VERSION").symlink_to(base / "secret")
    os.mkfifo(base / "postmaster.pid")
    directory = _mine(base)
    with pytest.raises(EmbeddedServerError, match="symbolic link") as err:
        directory.read("PG_VERSION")
    assert "s3cret" not in str(err.value)
    with pytest.raises(EmbeddedServerError, match="not a regular file"):
        directory.read("postmaster.pid")  # a FIFO: opening it would wait for a writer
    assert directory.read("missing") is None and directory.size("missing") == 0
    assert ServerDirectory(base / "none", os.geteuid(), os.getegid()).read("x") is None
    assert directory.read("secret", offset=2, limit=3) == "cre"


def test_remove_takes_the_name_not_what_it_names(base: Path) -> None:
    (base / "target").write_text("kept\n")
    (base / "postmaster.pid").symlink_to(base / "target")
    _mine(base).remove("postmaster.pid")
    _mine(base).remove("postmaster.pid")  # gone already: nothing to do
    assert (base / "target").read_text() == "kept\n"
    assert _mine(base).names() == ["target"]


@as_root
def test_a_hard_link_to_roots_file_is_not_read(base: Path) -> None:
    """Where the system lets the server's user hard-link a file it does not own (no
    fs.protected_hardlinks), the link still belongs to root: refused."""
    nobody = pwd.getpwnam("nobody")
    data = base / "data"
    ServerDirectory.create(data, nobody.pw_uid, nobody.pw_gid)
    (base / "secret").write_text("s3cret\n")
    os.link(base / "secret", data / "PG_VERSION")
    with pytest.raises(EmbeddedServerError, match=r"belongs to root \(uid 0\)") as err:
        ServerDirectory(data, nobody.pw_uid, nobody.pw_gid).read("PG_VERSION")
    assert "s3cret" not in str(err.value)


@as_root
def test_root_writes_only_into_the_server_users_own_directory(base: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    data = ServerDirectory.create(base / "data", nobody.pw_uid, nobody.pw_gid)
    assert (base / "data").stat().st_uid == nobody.pw_uid
    data.write("akadze.conf", "x\n")
    st = (base / "data" / "akadze.conf").stat()
    assert (st.st_uid, st.st_gid) == (nobody.pw_uid, nobody.pw_gid)
    roots = ServerDirectory(base, nobody.pw_uid, nobody.pw_gid)  # base belongs to root
    with pytest.raises(EmbeddedServerError, match="not to the server's user nobody"):
        roots.write("akadze.conf", "x\n")
    assert not (base / "akadze.conf").exists()


@as_root
def test_paths_other_users_can_change(base: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    assert others_can_change(base / "home" / "not" / "yet") is None  # /tmp is sticky
    assert others_can_change(Path("/tmp")) == "/tmp is writable by every user (mode 1777)"
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    assert others_can_change(theirs / "home") == f"{theirs} belongs to nobody (uid 65534)"
    group = base / "group"
    group.mkdir(mode=0o775)
    group.chmod(0o775)
    os.chown(group, 0, nobody.pw_gid)
    assert f"{group} is writable by the group" in (others_can_change(group / "x") or "")
    os.chown(group, 0, 0)
    assert others_can_change(group / "x") is None  # root's own group
    link = base / "link"
    link.symlink_to(theirs)
    assert others_can_change(link / "home") == f"{theirs} belongs to nobody (uid 65534)"


@as_root
def test_a_binaries_cache_others_can_write_is_refused(base: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    private = base / "private"  # a wheel the server's user cannot read, as under /root
    bin_dir = private / "pkg" / "pginstall" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "postgres").write_text("")
    private.chmod(0o700)
    cache = reachable_dir("akadze-cache-")
    try:
        cache.chmod(0o777)
        with pytest.raises(EmbeddedServerError, match="writable by every user"):
            embedded.binaries.server_binaries(
                bin_dir, nobody.pw_uid, {nobody.pw_gid}, cache_base=cache
            )
        assert list(cache.iterdir()) == []
    finally:
        cache.chmod(0o755)
        os.rmdir(cache)


@pytest.mark.parametrize(
    "first", ["0", "-1", "+5", "1_000", " ", "", "\u0663", "12abc", "99999999999999999999"]
)
def test_a_pid_file_without_a_plain_positive_pid_is_none(first: str) -> None:
    assert PidFile.parse(f"{first}\n/data\n0\n5432\n/data\n\n\nready\n") is None


def test_a_pid_file_parses() -> None:
    info = PidFile.parse("4242\n/data\n1700000000\n5433\n/data\n127.0.0.1\n 1 2\nready   \n")
    assert info == PidFile(4242, 5433, "/data", "ready")
    assert PidFile.parse("4242\n") == PidFile(4242, None, None, "starting")
    assert PidFile.parse(None) is None


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "pid"])
def test_a_process_handle_signals_and_waits(pidfd: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        with Process(child.pid) as process:
            assert process.alive()
            assert process.wait(0) is False
            process.signal(signal.SIGTERM)
            assert process.wait(30) is True
            assert not process.alive()
            process.signal(signal.SIGTERM)  # ended: nothing to signal, no error
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGTERM


def test_a_handle_on_an_ended_process_signals_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names no process now
    with Process(child.pid) as process:
        assert not process.alive() and process.wait(0)
        process.signal(signal.SIGTERM)


def test_a_log_tail_shows_no_control_characters() -> None:
    log = "LOG: ok\n\tFATAL: \x1b]0;PWNED\x07 bad\r\n\x1b[2Jlast\n"
    assert tail(log) == "LOG: ok | FATAL: ?]0;PWNED? bad | ?[2Jlast"
