"""Bad input at the command line: exit 0/1/2, and a refusal is exactly one line on
stderr, never a traceback, never a password."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akadze.cli import main

SECRET = "s3cr3t-Pa55"
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

ids = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.sampled_from(["0", "-1", "1e3", "0x10", "", " ", "abc", "1.5", "\uff19", "1_000",
                     str(2**63), str(2**63 - 1), str(2**64), "9" * 400, "\x00", "--", "-"]),
    st.text(max_size=20),
)
urls = st.one_of(
    st.sampled_from([
        f"postgresql://u:{SECRET}@127.0.0.1:1/x", f"mysql://u:{SECRET}@127.0.0.1/x",
        f"postgres://u:{SECRET}@[::1:1/x", f"host=127.0.0.1 port=1 password={SECRET}",
        "nonsense", "", "bogus=1", f"password={SECRET} port=x", f"postgresql://u:{SECRET}@127.0.0.1:99999/x",
        f"postgresql+asyncpg://u:{SECRET}@127.0.0.1:1/x?sslmode=bogus",
    ]),
    st.text(max_size=30).map(lambda t: f"postgresql://u:{SECRET}@{t}/db"),
)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # pragma: no cover - main returns, it must not exit
        raise AssertionError(f"main({argv!r}) exited instead of returning: {exc}") from exc
    out, err = capsys.readouterr()
    return code, out, err


def _refusal_is_clean(code: int, out: str, err: str) -> None:
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in out + err
    assert SECRET not in out + err
    if code != 0:
        assert len(err.strip().splitlines()) == 1, err


@given(command=st.sampled_from(["show", "cancel", "requeue", "retry"]), job_id=ids)
@FUZZ
def test_job_ids_are_checked(capsys: pytest.CaptureFixture[str], database_url: str,
                             command: str, job_id: str) -> None:
    code, out, err = _run(capsys, ["jobs", command, "--database-url", database_url, "--",
                                   job_id])
    _refusal_is_clean(code, out, err)
    assert code != 0  # the database is empty: every id is unknown or malformed


@given(key=st.text(max_size=30), values=st.lists(
    st.sampled_from(["--max-running", "--max-starts", "--window"]).flatmap(
        lambda flag: st.tuples(st.just(flag), st.one_of(ids, st.sampled_from(
            ["none", "1s", "-1", "0", "nan", "inf", "1e999", "2147483648"])))),
    max_size=3))
@FUZZ
def test_limits_set_refuses_cleanly(capsys: pytest.CaptureFixture[str], database_url: str,
                                    conn: psycopg.Connection[Any], key: str,
                                    values: list[tuple[str, str]]) -> None:
    before = conn.execute("SELECT count(*) FROM akadze.limits").fetchone()
    argv = ["limits", "set", "--database-url", database_url, "--", key]
    argv[3:3] = [part for pair in values for part in pair]
    code, out, err = _run(capsys, argv)
    _refusal_is_clean(code, out, err)
    if code != 0:
        assert conn.execute("SELECT count(*) FROM akadze.limits").fetchone() == before


@given(url=urls, command=st.sampled_from([["jobs", "list"], ["limits", "list"],
                                          ["jobs", "show", "1"], ["migrate"]]))
@FUZZ
def test_bad_database_urls_never_leak_the_password(
    capsys: pytest.CaptureFixture[str], url: str, command: list[str]
) -> None:
    code, out, err = _run(capsys, [*command, "--database-url", url])
    _refusal_is_clean(code, out, err)
    assert code != 0


@given(argv=st.lists(st.one_of(st.text(max_size=12), st.sampled_from(
    ["jobs", "limits", "queues", "workers", "metrics", "schedules", "list", "show", "set",
     "--json", "--limit", "-n", "--state", "--queue", "--max-running", "--help", "-h"])),
    max_size=5))
@FUZZ
def test_arbitrary_arguments_never_trace_back(capsys: pytest.CaptureFixture[str],
                                               database_url: str, argv: list[str]) -> None:
    if argv and argv[0] in ("worker", "demo", "db", "bench", "migrate"):
        return  # long-running or server-starting commands are not fuzzed here
    if any(a in ("worker", "demo", "db", "bench") for a in argv[:1]):
        return
    os.environ["AKADZE_DATABASE_URL"] = database_url
    try:
        code, out, err = _run(capsys, argv)
    finally:
        del os.environ["AKADZE_DATABASE_URL"]
    if code == 2 and not err and "Usage:" in out:
        return  # a group without its command: click prints the help (exit 2)
    _refusal_is_clean(code, out, err)


@pytest.mark.parametrize("argv", [
    ["jobs", "show", "--database-url", f"postgresql://u:{SECRET}@127.0.0.1:1/x", "5"],
    ["jobs", "show", "--", "-5"],
    ["jobs", "cancel", str(2**70)],
    ["limits", "set", "k", "--max-running", "-3"],
])
def test_as_a_subprocess(argv: list[str], database_url: str) -> None:
    env = dict(os.environ, AKADZE_DATABASE_URL=database_url)
    done = subprocess.run([sys.executable, "-m", "akadze", *argv], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode in (1, 2), done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and SECRET not in done.stderr + done.stdout
