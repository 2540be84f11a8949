"""Passwords never survive masking (issue 21, finding 8), in any form they take in text,
and the text around them is kept, separators included; the literal password of the
configured URL is masked wherever it shows up: a task's exception stored in
``jobs.errors``, the CLI's output, log lines, the dashboard."""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akadze import Akadze, get_job_sync
from akadze.cli import main
from akadze.dashboard import create_app
from akadze.database import MaskingFormatter, mask_password
from akadze.testing import drain

# Separators a password may be followed by in a message; each must be kept.
TAILS = ["", ": connection failed:", ", retrying", " (attempt 2)", "\nnext line"]

printable = st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"))
# Without whitespace, for the unquoted forms; not ending in the punctuation that an
# unquoted value gives back to the sentence (the ":" of "password=x: failed").
bare = st.text(printable.filter(lambda c: not c.isspace()), min_size=1, max_size=24).filter(
    lambda p: p[-1] not in ".,;:)]}>'\"" and p[0] not in "'\"")
# Anything on one line, spaces, "/" and "@" included (a URL's userinfo, quoted values).
spaced = st.text(printable, min_size=1, max_size=24).filter(lambda p: p.strip() == p)


def _libpq_quoted(password: str) -> str:
    return "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _forms(password: str) -> list[tuple[str, str]]:
    """(text with the password, the same text masked) for every form akadze masks."""
    py = repr(password)
    py_masked = f"{py[0]}***{py[0]}"
    forms = []
    # In a URL's userinfo the password ends at the first "@" followed by a host word:
    # an "@" that starts a word followed by a space in the password is that host.
    if not re.search(r"@[^\s@]+\s", password):
        forms += [
            (f"postgresql://app:{password}@db.example:5432/jobs",
             "postgresql://app:***@db.example:5432/jobs"),
            (f"cannot connect to postgresql+psycopg://app:{password}@10.0.0.1/jobs",
             "cannot connect to postgresql+psycopg://app:***@10.0.0.1/jobs"),
        ]
    forms += [
        (f"host=db password={_libpq_quoted(password)} dbname=jobs",
         "host=db password='***' dbname=jobs"),
        (f"postgresql://app@db/jobs?sslmode=require&password={quote(password, safe='')}&x=1",
         "postgresql://app@db/jobs?sslmode=require&password=***&x=1"),
        (f"{{'user': 'app', 'password': {py}}}", f"{{'user': 'app', 'password': {py_masked}}}"),
        (json.dumps({"user": "app", "db_password": password}),
         '{"user": "app", "db_password": "***"}'),
        (json.dumps(json.dumps({"password": password})), '"{\\"password\\": \\"***\\"}"'),
        (f"Settings(password={py}, port=5432)", f"Settings(password={py_masked}, port=5432)"),
    ]
    if not any(c.isspace() for c in password) and password[0] not in "'\"" \
            and password[-1] not in ".,;:)]}>'\"":
        forms += [
            (f"host=db password={password} dbname=jobs", "host=db password=*** dbname=jobs"),
            (f"PGPASSWORD={password} psql -h db", "PGPASSWORD=*** psql -h db"),
            (f"postgresql://app@db/jobs?password={password}", "postgresql://app@db/jobs?password=***")
            if not set("&#") & set(password) else ("", ""),
        ]
    return forms


@settings(max_examples=300)
@given(password=st.one_of(bare, spaced), tail=st.sampled_from(TAILS))
def test_no_drawn_password_survives_any_form(password: str, tail: str) -> None:
    for text, expected in _forms(password):
        masked = mask_password(f"error: {text}{tail}")
        assert masked == f"error: {expected}{tail}", (password, text)
        assert mask_password(masked) == masked  # masking twice changes nothing


@settings(max_examples=200)
@given(password=st.text(printable.filter(lambda c: not c.isspace()), min_size=8, max_size=30)
       .filter(lambda p: p != "***"), tail=st.sampled_from(TAILS))
def test_a_known_password_is_masked_as_a_word_anywhere(password: str, tail: str) -> None:
    text = f"task failed ({password}){tail}"
    assert mask_password(text, passwords=[password]) == f"task failed (***){tail}"
    # not inside a longer word of letters and digits, nor when it could be a word
    assert mask_password("postgresql://h/db", passwords=["postgres"]) == "postgresql://h/db"
    assert mask_password("went wrong on 5432", passwords=["wrong", "5432"]) == (
        "went wrong on 5432")
    assert mask_password("as s3 cret said", passwords=["s3 cret"]) == "as *** said"


def test_the_forms_of_the_issue() -> None:
    assert mask_password("{'password': 'hunter22'}") == "{'password': '***'}"
    assert mask_password('{"password": "hunter22"}') == '{"password": "***"}'
    assert mask_password("PGPASSWORD=hunter22 psql") == "PGPASSWORD=*** psql"
    assert mask_password("postgresql://u:s3 cret@h/db") == "postgresql://u:***@h/db"
    assert mask_password("postgresql://u:s3/cret@h/db") == "postgresql://u:***@h/db"
    # issue 20, item 7: the separator after a masked query password is kept
    assert mask_password("postgresql://u@h/db?password=s3cret: connection failed:") == (
        "postgresql://u@h/db?password=***: connection failed:")


def test_the_cli_never_prints_a_password_with_a_space(
        capsys: pytest.CaptureFixture[str]) -> None:
    # libpq refuses the raw space, quoting the password back in its error
    code = main(["jobs", "list", "--database-url", "postgresql://u:s3 cret@127.0.0.1:1/x"])
    err = capsys.readouterr().err
    assert code == 2 and "s3 cret" not in err and "cret" not in err
    assert err == ("akadze: cannot connect to postgresql://u:***@127.0.0.1:1/x: unexpected "
                   'spaces found in "***", use percent-encoded spaces (%20) instead\n')


@pytest.fixture
def secret_app(database_url: str) -> tuple[Akadze, str]:
    # The test server trusts local connections: the password is carried, never checked.
    secret = "pw-" + uuid.uuid4().hex
    return Akadze(database_url.replace("postgres@", f"postgres:{secret}@", 1)), secret


async def test_a_task_exception_is_stored_masked(secret_app: tuple[Akadze, str]) -> None:
    app, secret = secret_app
    messages = [
        f"login failed with {secret}",  # the configured URL's password, literally
        "config {'password': 'other-secret-1'}",
        'payload {"password": "other-secret-2"}',
        "env PGPASSWORD=other-secret-3 was set",
        "dsn postgresql://u:other secret/4@db/x",
    ]

    @app.task("leak", max_attempts=1)
    def leak(n: int) -> None:
        raise RuntimeError(messages[n])

    ids = [leak.using().enqueue_sync(n=n) for n in range(len(messages))]
    await drain(app)
    for job_id, message in zip(ids, messages, strict=True):
        [entry] = get_job_sync(app, job_id).errors
        stored = entry["message"] + entry["traceback"]
        for secret_part in (secret, "other-secret", "other secret"):
            assert secret_part not in stored, stored
        assert entry["message"].startswith(message.split(" ")[0])


def test_log_lines_are_masked_with_their_tracebacks(secret_app: tuple[Akadze, str]) -> None:
    _, secret = secret_app
    record = logging.LogRecord("akadze.worker", logging.ERROR, __file__, 1,
                               "hook failed: %s", (f"token {secret}",), None)
    try:
        raise ValueError(f"password={secret} rejected")
    except ValueError as exc:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    line = MaskingFormatter("%(levelname)s %(message)s").format(record)
    assert secret not in line and "ERROR hook failed: token ***" in line
    assert "ValueError: password=*** rejected" in line


async def test_the_dashboard_masks_and_escapes_stored_strings(
        secret_app: tuple[Akadze, str], conn: psycopg.Connection[Any]) -> None:
    app, secret = secret_app
    row = conn.execute(
        "INSERT INTO akadze.jobs (queue, task, args, state, errors) VALUES "
        "('<script>alert(1)</script>', 't', %s, 'failed', %s) RETURNING id",
        (json.dumps({"note": f"uses {secret}", "password": "in-args-99"}),
         json.dumps([{"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "error": "E",
                      "message": f"old row, stored unmasked: {secret}",
                      "traceback": "password=in-traceback-99"}]))).fetchone()
    assert row is not None
    asgi = create_app(app.database_url, app=app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                                 base_url="http://127.0.0.1") as client:
        bodies = [(await client.get(path)).text
                  for path in (f"/jobs/{row[0]}", f"/api/jobs/{row[0]}", "/jobs", "/api/jobs")]
    await asgi.state.dashboard.close()
    for body in bodies:
        assert secret not in body and "in-args-99" not in body and "in-traceback-99" not in body
    assert "old row, stored unmasked: ***" in bodies[0]
    # and stored markup stays text on the pages (Jinja2 autoescapes; finding 7)
    assert "<script>alert" not in bodies[0] + bodies[2]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in bodies[0]
