"""Shared by the embedded-server tests: temporary homes, and acting as the server's user.

A home sits in a fresh directory under /tmp made 0755, so that ``nobody`` can reach it
when the suite runs as root (pytest's own tmp_path sits under a 0700 directory); every
server started in it is stopped when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from akadze import embedded
from akadze.cli import main

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(
    not ROOT, reason="needs root: only then does the server run as another user (nobody)"
)


def reachable_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def temporary_home(prefix: str = "akadze-emb-") -> Iterator[Path]:
    """``<fresh dir>/home``; its server is stopped and the directory removed at the end."""
    base = reachable_dir(prefix)
    try:
        yield base / "home"
    finally:
        embedded.EmbeddedServer(base / "home").stop()
        shutil.rmtree(base, ignore_errors=True)


def as_user(name: str, *args: str, input: str | None = None) -> str:
    """Run a program as the user ``name`` (a subprocess that sets its uid, gid and groups
    before exec, as root may) and return its output; fail the test when it fails."""
    entry = pwd.getpwnam(name)
    done = subprocess.run(
        list(args), input=input, text=True, capture_output=True, cwd="/",
        user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], check=False,
    )
    assert done.returncode == 0, f"{args} as {name}: {done.stderr}"
    return done.stdout


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``akadze *args`` in this process: (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err
